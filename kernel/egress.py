"""How the platform's own processes speak through the egress proxy for a session (the harness's MCP calls,
the worker's clone of a session's repositories): the identity every layer above uses, in one place.

The proxy has two doors. Sandboxes use the one on their own network, as `sbx_…` identities with a token of
their own. The workers use the other (EGRESS_HARNESS_URL, on loopback or the workers' network, never the
sandboxes'), as the session they work for:

    Proxy-Authorization: Basic base64("session:" + session_id + ":" + EGRESS_HARNESS_TOKEN)

that is, the user-id `session` and the password `<session_id>:<token>` (session ids hold no colon). The
proxy checks the token, loads the session's vaults and repositories, and adds to each request the one
credential its URL is for; the worker never holds it. The token speaks for every session, which is why the
proxy takes `session:` identities only at that door.
"""

from __future__ import annotations

import base64
from urllib.parse import quote, urlsplit, urlunsplit

from django.conf import settings

USER = "session"


def harness_proxied() -> bool:
    return bool(settings.EGRESS_HARNESS_URL)


def harness_authorization(session_id: str) -> str:
    """The Proxy-Authorization header value that speaks for `session_id`."""
    raw = f"{USER}:{session_id}:{settings.EGRESS_HARNESS_TOKEN}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


def harness_proxy_url(session_id: str) -> str:
    """EGRESS_HARNESS_URL with the session's identity in it, for clients that take a proxy URL (git, curl):
    meant for their environment (readable only by the worker's uid and root), never a command line."""
    parts = urlsplit(settings.EGRESS_HARNESS_URL)
    password = quote(f"{session_id}:{settings.EGRESS_HARNESS_TOKEN}", safe="")
    netloc = f"{USER}:{password}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme or "http", netloc, parts.path, "", ""))
