"""The small framework under every /v1 endpoint: errors, authentication, body parsing, paging."""
