"""Environment keys and work items' sessions tokens: what a self-hosted worker authenticates with.

An environment key (`wbek_…`) polls and serves one self-hosted environment's queue. A sessions token
(`wbst_<work id>.<secret>`, in a work item's `secret`) reaches that item's session and the item itself,
for as long as its claim of the item lasts. Both are bearer credentials narrower than an API key:
`resolve_bearer` (registered in SandboxesConfig.ready) turns them into principals (kernel.auth.Principal)
that say which requests they may make. Only sha256 hashes are stored; a key is shown once.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from kernel.api.errors import AuthenticationFailed
from kernel.errors import Invalid, NotFound
from kernel.models import hash_key
from kernel.tenancy import audit
from sandboxes.environments import EnvironmentNotFound
from sandboxes.models import Environment, EnvironmentKey, WorkItem

ENVIRONMENT_KEY_PREFIX = "wbek_"
SESSIONS_TOKEN_PREFIX = "wbst_"
_LAST_USED_RESOLUTION = timedelta(minutes=1)

_WORK_PATH = re.compile(r"^/v1/environments/(?P<environment>[^/]+)/work(?:/(?P<rest>.*))?$")
_SESSION_PATH = re.compile(r"^/v1/sessions/(?P<session>[^/]+)(?P<rest>/.*)?$")
# What an environment key does on its environment's queue: (method, the path after `/work`).
_QUEUE_ROUTES = re.compile(r"^(GET (poll|stats|)|POST [^/]+/(ack|heartbeat|stop))$")


# -- environment keys


def self_hosted_environment(environment_id: str) -> Environment:
    """The live self-hosted environment (a 404 for none, a 400 for a cloud one): what has a queue and keys."""
    environment = Environment.objects.live().filter(id=environment_id).first()
    if environment is None:
        raise EnvironmentNotFound(environment_id)
    if environment.config.get("type") != "self_hosted":
        raise Invalid(
            f"Environment {environment_id} is not self-hosted (its config type is "
            f"{environment.config.get('type')!r}): only a self_hosted environment has a work queue and keys.",
            code="environment_not_self_hosted",
        )
    return environment


def environment_key_create(
    environment_id: str, *, name: str = "", actor: str = "system"
) -> tuple[EnvironmentKey, str]:
    """A new key for the self-hosted environment, and the key itself: it is not stored, so show it now."""
    environment = self_hosted_environment(environment_id)
    if environment.archived_at is not None:
        raise Invalid(
            f"Environment {environment_id} is archived; it takes no new keys.", code="environment_archived"
        )
    raw = ENVIRONMENT_KEY_PREFIX + secrets.token_urlsafe(32)
    key = EnvironmentKey.objects.create(
        environment=environment, name=name, prefix=raw[:12], key_hash=hash_key(raw)
    )
    audit(environment.workspace_id, actor, "environment_key.created", key.id, environment=environment.id)
    return key, raw


def environment_key_revoke(environment_id: str, key_id: str, *, actor: str = "system") -> EnvironmentKey:
    """Revoke the key (at once: its next request is refused). Revoking it again changes nothing."""
    key = (
        EnvironmentKey.objects.select_related("environment")
        .filter(id=key_id, environment_id=environment_id)
        .first()
    )
    if key is None:
        self_hosted_environment(environment_id)  # no such environment is what to say first
        raise NotFound("environment key", key_id, f"Environment {environment_id} has no key {key_id!r}.")
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        audit(
            key.environment.workspace_id, actor, "environment_key.revoked", key.id, environment=environment_id
        )
    return key


def environment_keys(environment_id: str) -> list[EnvironmentKey]:
    self_hosted_environment(environment_id)
    return list(EnvironmentKey.objects.filter(environment_id=environment_id).order_by("created_at", "id"))


def environment_key_json(key: EnvironmentKey, *, raw: str | None = None) -> dict[str, Any]:
    """The key as the API shows it: the key itself (`key`) only in the answer that created it."""
    shown: dict[str, Any] = {
        "id": key.id,
        "type": "environment_key",
        "environment_id": key.environment_id,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at.isoformat(),
        "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }
    if raw is not None:
        shown["key"] = raw
    return shown


# -- sessions tokens


def new_sessions_token(work_id: str) -> str:
    """A fresh token for one hand-out of the work item. It names the item, so a refusal can say why."""
    return f"{SESSIONS_TOKEN_PREFIX}{work_id}.{secrets.token_urlsafe(32)}"


def _work_id_of(raw: str) -> str | None:
    work_id, dot, secret = raw.removeprefix(SESSIONS_TOKEN_PREFIX).partition(".")
    return work_id if dot and secret and work_id.startswith("work_") else None


# -- principals


@dataclass(frozen=True)
class EnvironmentKeyPrincipal:
    """An environment key: its own environment's queue (poll, ack, heartbeat, stop, list, stats), no more."""

    key_id: str
    environment_id: str
    workspace_id: str
    name: str

    @property
    def actor(self) -> str:
        return f"environment key {self.name or self.key_id} of {self.environment_id}"

    def allows(self, method: str, path: str) -> str | None:
        work = _WORK_PATH.match(path)
        if work is None:
            if _SESSION_PATH.match(path):
                return (
                    "An environment key does not reach session endpoints; use the sessions token that the work "
                    "item's `secret` carries (the poll response's), which reaches that item's session only."
                )
            return (
                f"An environment key only polls and serves its environment's work queue "
                f"(/v1/environments/{self.environment_id}/work/...); use an API key for {method} {path}."
            )
        if work["environment"] != self.environment_id:
            return (
                f"This environment key belongs to environment {self.environment_id}, not "
                f"{work['environment']}; use that environment's own key."
            )
        if _QUEUE_ROUTES.match(f"{method} {work['rest'] or ''}") is None:
            return (
                "An environment key polls, acks, heartbeats, stops, lists and counts its environment's work "
                f"items; {method} {path} (retrieving or updating a work item) needs an API key."
            )
        return None


@dataclass(frozen=True)
class SessionsTokenPrincipal:
    """A work item's sessions token: its session's reads, events and stream, and the item's ack, heartbeat
    and stop. `retired` when its claim of the item ended (the worker was lost and the item went back to the
    queue, or another hand-out claimed it): then only a heartbeat, which answers 412 with the current state."""

    work_id: str
    environment_id: str
    workspace_id: str
    session_id: str | None
    token_hash: str
    state: str
    retired: bool

    @property
    def actor(self) -> str:
        return f"sessions token of work item {self.work_id}"

    def allows(self, method: str, path: str) -> str | None:
        work = _WORK_PATH.match(path)
        own_item = (
            work is not None
            and work["environment"] == self.environment_id
            and (work["rest"] or "").partition("/")[0] == self.work_id
        )
        action = (work["rest"] or "").partition("/")[2] if work is not None else ""
        if own_item and method == "POST" and action == "heartbeat":
            return None  # a stopped or retired claim learns so from the heartbeat itself
        if self.retired:
            return (
                f"This sessions token's claim of work item {self.work_id} has ended: the item went back to "
                "the queue (its worker was lost) or another worker claimed it; that worker holds its session now."
            )
        if own_item and method == "POST" and action == "stop":
            return None  # a stopped item answers 409, which the SDK's worker expects
        if self.state == WorkItem.State.STOPPED:
            return f"Work item {self.work_id} is stopped; its sessions token no longer reaches its session or the item."
        if own_item and method == "POST" and action == "ack":
            return None
        session = _SESSION_PATH.match(path)
        if session is not None and session["session"] == self.session_id:
            rest = session["rest"] or ""
            if (method == "GET" and rest in ("", "/events", "/events/stream")) or (
                method == "POST" and rest == "/events"
            ):
                return None
        return (
            f"A sessions token reaches only session {self.session_id} (its retrieve, events and stream) and "
            f"work item {self.work_id}'s ack, heartbeat and stop; not {method} {path}."
        )


def resolve_bearer(raw: str) -> EnvironmentKeyPrincipal | SessionsTokenPrincipal | None:
    """The principal of an environment key or sessions token; None for any other token. A token of ours that
    no longer works is a 401 that says why."""
    if raw.startswith(ENVIRONMENT_KEY_PREFIX):
        return _environment_key(raw)
    if raw.startswith(SESSIONS_TOKEN_PREFIX):
        return _sessions_token(raw)
    return None


def _environment_key(raw: str) -> EnvironmentKeyPrincipal:
    key = EnvironmentKey.objects.select_related("environment").filter(key_hash=hash_key(raw)).first()
    if key is None:
        raise AuthenticationFailed(
            "This environment key is not known (mistyped, or from another installation). Create one with "
            "`manage.py environment_key create ENV_ID` or POST /v1/environments/{id}/keys."
        )
    if key.revoked_at is not None:
        raise AuthenticationFailed(
            f"This environment key ({key.prefix}…, {key.id}) was revoked at {key.revoked_at.isoformat()}; "
            "create a new one."
        )
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > _LAST_USED_RESOLUTION:
        EnvironmentKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return EnvironmentKeyPrincipal(
        key_id=key.id,
        environment_id=key.environment_id,
        workspace_id=key.environment.workspace_id,
        name=key.name,
    )


def _sessions_token(raw: str) -> SessionsTokenPrincipal:
    work_id = _work_id_of(raw)
    item = WorkItem.objects.select_related("environment").filter(id=work_id).first() if work_id else None
    hashed = hash_key(raw)
    if item is None or not (
        hashed == item.token_hash
        or hashed in item.offered_token_hashes
        or hashed in item.retired_token_hashes
    ):
        raise AuthenticationFailed(
            "This sessions token is not known: use the one in the `secret` of the poll response that handed "
            "out its work item."
        )
    claimed = bool(item.latest_heartbeat)
    retired = hashed in item.retired_token_hashes or (hashed in item.offered_token_hashes and claimed)
    return SessionsTokenPrincipal(
        work_id=item.id,
        environment_id=item.environment_id,
        workspace_id=item.environment.workspace_id,
        session_id=item.session_id,
        token_hash=hashed,
        state=item.state,
        retired=retired,
    )
