"""The bottom layer: ids, domain errors, API keys and their auth, and the `/v1` edge's plumbing.

It imports no other package of the project; every package may import it.
"""
