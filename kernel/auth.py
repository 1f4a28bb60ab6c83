"""Who is calling: an API key (HTTP and WebSocket headers), a logged-in operator (cookie), or a narrower
bearer credential another layer issues (a self-hosted environment's key, a work item's sessions token).

A narrower credential is a `Principal`: the layer that issues it registers a resolver
(`add_bearer_resolver`) that maps a raw bearer token to one, and the principal itself says which requests
it may make (`allows`); the /v1 edge refuses everything else with a 403 that says what the credential is
for. Routes need not know: a principal reaches only the paths it allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Protocol

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.utils import timezone

from kernel.models import ApiKey, hash_key

_LAST_USED_RESOLUTION = timedelta(minutes=1)
_KEY_BY_HASH = f"SELECT * FROM {ApiKey._meta.db_table} WHERE key_hash = %s AND revoked_at IS NULL LIMIT 1"


class Principal(Protocol):
    """A bearer credential narrower than an API key."""

    @property
    def actor(self) -> str:
        """Who it is, in the words an audit row or an event's actor uses."""

    @property
    def workspace_id(self) -> str:
        """The workspace whose objects it reaches."""

    def allows(self, method: str, path: str) -> str | None:
        """None if it may make this request; else why not (it is a 403's message)."""


BearerResolver = Callable[[str], Principal | None]
_resolvers: list[BearerResolver] = []


def add_bearer_resolver(resolve: BearerResolver) -> None:
    """Let `resolve` turn raw bearer tokens into principals (it answers None for a token not its own)."""
    if resolve not in _resolvers:
        _resolvers.append(resolve)


def raw_bearer(headers: Mapping[str, str]) -> str:
    raw = headers.get("x-api-key") or ""
    authorization = headers.get("authorization") or ""
    if not raw and authorization[:7].lower() == "bearer ":
        raw = authorization[7:].strip()
    return raw


def principal_from_token(raw: str) -> Principal | None:
    for resolve in _resolvers:
        principal = resolve(raw)
        if principal is not None:
            return principal
    return None


def api_key_from_headers(headers: Mapping[str, str]) -> ApiKey | None:
    raw = raw_bearer(headers)
    if not raw:
        return None
    # Written out, as every API request asks it: building the queryset cost more than the lookup.
    key = next(iter(ApiKey.objects.raw(_KEY_BY_HASH, [hash_key(raw)])), None)
    if key is not None:
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > _LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


class _ApiKeyMiddleware:
    """Puts `scope["api_key"]` on WebSocket scopes that carry a valid key header."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = {
            name.decode("latin1").lower(): value.decode("latin1") for name, value in scope.get("headers", [])
        }
        scope = dict(scope, api_key=await database_sync_to_async(api_key_from_headers)(headers))
        return await self.inner(scope, receive, send)


def ApiKeyOrSessionAuthMiddleware(inner: Any) -> Any:  # noqa: N802 - named like Channels' own stacks
    return AuthMiddlewareStack(_ApiKeyMiddleware(inner))


def scope_is_authenticated(scope: Mapping[str, Any]) -> bool:
    user = scope.get("user")
    return scope.get("api_key") is not None or bool(
        user is not None and user.is_authenticated and user.is_staff
    )
