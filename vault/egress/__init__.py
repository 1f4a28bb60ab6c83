"""The egress proxy: the only process that opens the vault, and sandboxes' only way out.

`python -m vault.egress` runs it (from its own virtualenv, .venv-egress: scripts/egress-venv.sh) on
mitmproxy's addon API: `addon.py` applies `policy.py`'s rules to each request with what `state.py` read
from the database; `resolver.py` pins the addresses it checked; `control.py` is its loopback endpoint.
`placeholders.py` is the part the web server and workers load: the placeholders a sandbox's shell holds.
Nothing in this package's __init__ imports mitmproxy, so the app's processes can import the package.
"""
