"""/v1 routes for agents and sessions."""
