"""The session services that join an agent, an environment and a wake: create, send, update, fork, archive."""
