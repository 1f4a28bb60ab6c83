"""The operators' browser UI: server-rendered pages and the fragments live updates swap in."""
