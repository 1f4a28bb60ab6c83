"""Which pages may open a WebSocket: the server's own, and those CSRF_TRUSTED_ORIGINS lists.

A browser sends its session cookie with a WebSocket handshake from any page, and always says which page it
is (`Origin`); so an Origin must be this server's own scheme://host:port (the Host header's, `ws` read as
`http` and `wss` as `https`, the host one ALLOWED_HOSTS admits), or one the operator trusts for forms
already (CSRF_TRUSTED_ORIGINS, `*.` subdomain patterns included), as Django's CSRF check has it for pages.
A handshake without an Origin is no browser's: an API client, let through to authenticate with its key.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

CLOSE_FORBIDDEN = 4403
_HTTP_SCHEME = {"ws": "http", "wss": "https"}
_DEFAULT_PORT = {"http": 80, "https": 443}


def _origin(scheme: str, host: str, port: int | None) -> tuple[str, str, int | None]:
    return scheme, host.lower().rstrip("."), port if port is not None else _DEFAULT_PORT.get(scheme)


def _parse(url: str) -> tuple[str, str, int | None] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORT or not parts.hostname or parts.path not in ("", "/"):
        return None
    return _origin(parts.scheme, parts.hostname, port)


def own_origin(scope: dict[str, Any], headers: dict[bytes, bytes]) -> tuple[str, str, int | None] | None:
    """This socket's server as the page that opened it would name it, if its Host is one ALLOWED_HOSTS has."""
    host = headers.get(b"host", b"").decode("latin1")
    domain, _ = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # as Django's own host check has it
    if not domain or not validate_host(domain, allowed):
        return None
    return _parse(f"{_HTTP_SCHEME.get(scope.get('scheme', 'ws'), 'http')}://{host}")


def trusted(origin: tuple[str, str, int | None]) -> bool:
    """Listed in CSRF_TRUSTED_ORIGINS, exactly or by a `scheme://*.domain[:port]` pattern."""
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        pattern = _parse(entry)
        if pattern is None or pattern[::2] != origin[::2]:
            continue
        if pattern[1].startswith("*.") and is_same_domain(origin[1], pattern[1][1:]):
            return True
        if pattern[1] == origin[1]:
            return True
    return False


def refusal(scope: dict[str, Any]) -> str | None:
    """Why this handshake's Origin may not open the socket; None if it may (or sent none)."""
    headers = dict(scope.get("headers", []))
    raw = headers.get(b"origin")
    if raw is None:
        return None
    text = raw.decode("latin1")
    origin = _parse(text)
    if origin is not None and (origin == own_origin(scope, headers) or trusted(origin)):
        return None
    host = headers.get(b"host", b"").decode("latin1") or "(none)"
    return (
        f"This socket was opened from {text!r}, which is neither this server ({host}, as the Host header "
        "names it, if ALLOWED_HOSTS has it) nor listed in CSRF_TRUSTED_ORIGINS. Open the page from this "
        "server, or add its origin (scheme://host:port) to CSRF_TRUSTED_ORIGINS."
    )


class OriginRefused(AsyncJsonWebsocketConsumer):
    """Accepts only to say why it closes, as the session socket's other refusals do."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    async def connect(self) -> None:
        await self.accept()
        await self.send_json({"type": "error", "message": self.message})
        await self.close(code=CLOSE_FORBIDDEN)


class SameOriginOrTrusted:
    """ASGI middleware for WebSockets: refuses a handshake whose Origin is not the server's own or trusted."""

    def __init__(self, application: Any):
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        why = refusal(scope)
        if why is None:
            return await self.application(scope, receive, send)
        return await OriginRefused.as_asgi(message=why)(scope, receive, send)
