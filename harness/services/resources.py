"""A session's resources (reference §3.6): what a session is created with, and the routes that list, read,
add, delete them and rotate a repository's token.

A resource lives in `Session.resources` as the API shows it; a github_repository's `authorization_token`
never does: it is sealed into the vault (vault/repositories.py) at the door, and only the egress proxy opens
it. A memory_store resource has no `id` of its own in the API's shape, so the routes find it by its
`memory_store_id`. Changes take the session row's lock, so two of them never lose one another's write.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from kernel.api.pagination import decode_cursor, encode_cursor
from kernel.api.validation import expect, no_unknown_fields, text
from kernel.errors import Invalid, NotFound
from kernel.ids import new_id
from sandboxes.repositories import checked_repository, checked_token
from sessions.models import Session
from sessions.services.log import SessionNotFound
from vault.repositories import repository_token_rotate, repository_token_set, repository_tokens_delete

MAX_PAGE = 1000
REPOSITORY_FIELDS = ("type", "url", "authorization_token", "checkout", "mount_path")
# (resource id, repository URL, token): what is sealed once the session's row exists.
Token = tuple[str, str, str]


def _file(file_id: str, mount_path: str | None, now: str) -> dict[str, Any]:
    return {
        "type": "file",
        "id": new_id("sres"),
        "file_id": file_id,
        "mount_path": mount_path or f"/mnt/session/uploads/{file_id}",
        "created_at": now,
        "updated_at": now,
    }


def new_resources(value: Any) -> tuple[list[dict[str, Any]], list[Token]]:
    """A create body's `resources`, each checked by its documented shape (reference §6.1), as they are
    stored; and the repositories' tokens, apart, for `seal_tokens`."""
    resources, tokens = [], []
    now = timezone.now().isoformat()
    for i, resource in enumerate(expect(value, list, "'resources'")):
        where = f"resources[{i}]"
        kind = expect(resource, dict, f"'{where}'").get("type")
        if kind == "github_repository":
            no_unknown_fields(resource, REPOSITORY_FIELDS, where)
            item = {
                "type": kind,
                "id": new_id("sres"),
                **checked_repository(resource, where),
                "created_at": now,
                "updated_at": now,
            }
            # Absent, null or empty: a public repository.
            if resource.get("authorization_token") not in (None, ""):
                token = checked_token(resource["authorization_token"], f"{where}.authorization_token")
                tokens.append((item["id"], item["url"], token))
        elif kind == "file":
            no_unknown_fields(resource, ("type", "file_id", "mount_path"), where)
            file_id = text(resource, "file_id", where, required=True, min_length=1)
            item = _file(file_id, text(resource, "mount_path", where, default=None), now)
        elif kind == "memory_store":
            no_unknown_fields(resource, ("type", "memory_store_id", "access", "instructions"), where)
            item = {
                "type": kind,
                "memory_store_id": text(resource, "memory_store_id", where, required=True),
                "access": resource.get("access", "read_write"),
                "instructions": text(resource, "instructions", where, max_length=4096, default=None),
            }
        else:
            raise Invalid(f"'{where}.type' must be github_repository, file or memory_store, not {kind!r}.")
        resources.append(item)
    return resources, tokens


def seal_tokens(session_id: str, tokens: list[Token], *, actor: str) -> None:
    """Seal a new session's repository tokens (in its creating transaction: a failure stores nothing)."""
    for resource_id, url, token in tokens:
        repository_token_set(session_id, resource_id=resource_id, url=url, token=token, actor=actor)


def shown(resource: dict[str, Any]) -> dict[str, Any]:
    """A resource as the API shows it: never a token (a row from before they moved to the vault included)."""
    return {key: value for key, value in resource.items() if key != "authorization_token"}


def _ident(resource: Any) -> Any:
    if not isinstance(resource, dict):
        return None
    return resource.get("memory_store_id") if resource.get("type") == "memory_store" else resource.get("id")


def _index(session: Session, resource_id: str) -> int:
    for i, resource in enumerate(session.resources):
        if _ident(resource) == resource_id:
            return i
    raise NotFound(
        "session resource", resource_id, f"Session {session.id} has no resource with id {resource_id!r}."
    )


def _session(session_id: str, *, lock: bool = False) -> Session:
    sessions = Session.objects.live()
    session = (sessions.select_for_update() if lock else sessions).filter(id=session_id).first()
    if session is None:
        raise SessionNotFound(session_id)
    return session


def session_resources_list(
    session_id: str, *, limit: int | None = None, page: str | None = None
) -> dict[str, Any]:
    """The session's resources in the order they were given, `limit` at a time (all without one)."""
    session = _session(session_id)
    start = 0
    if page:
        position = decode_cursor(page, expect_keys=("n", "sid"))
        if position["sid"] != session_id or not isinstance(position["n"], int):
            raise Invalid("The 'page' cursor belongs to another session's resources; start again without it.")
        start = position["n"]
    stop = len(session.resources) if limit is None else start + limit
    data = [shown(resource) for resource in session.resources[start:stop]]
    more = stop < len(session.resources)
    return {"data": data, "next_page": encode_cursor({"n": stop, "sid": session_id}) if more else None}


def session_resource_get(session_id: str, resource_id: str) -> dict[str, Any]:
    session = _session(session_id)
    return shown(session.resources[_index(session, resource_id)])


@transaction.atomic
def session_resource_update(
    session_id: str, resource_id: str, *, authorization_token: str, actor: str
) -> dict[str, Any]:
    """Rotate a github_repository's token: resealed in the vault, with its secret_version bumped, so the
    egress proxy adds the new one from this commit on (told by the database; on SQLite within
    EGRESS_CACHE_SECONDS): to the next clone, push or pull."""
    session = _session(session_id, lock=True)
    i = _index(session, resource_id)
    resource = session.resources[i]
    if resource.get("type") != "github_repository":
        raise Invalid(
            f"Only github_repository resources take an 'authorization_token' (a token rotation); "
            f"{resource_id} is a {resource.get('type')} resource."
        )
    token = checked_token(authorization_token, "authorization_token")
    # A row an older API stored may lack a URL: its token then matches no request at the proxy.
    url = resource.get("url") if isinstance(resource.get("url"), str) else ""
    repository_token_rotate(session.id, resource_id=resource_id, url=url, token=token, actor=actor)
    resource = {**resource, "updated_at": timezone.now().isoformat()}
    session.resources = [*session.resources[:i], resource, *session.resources[i + 1 :]]
    session.save(update_fields=["resources", "updated_at"])
    return shown(resource)


@transaction.atomic
def session_resource_delete(session_id: str, resource_id: str, *, actor: str) -> dict[str, str]:
    """Take the resource off the session, and destroy its token. A sandbox that has the repository already
    keeps its files; the proxy no longer adds a token to its pushes and pulls."""
    session = _session(session_id, lock=True)
    i = _index(session, resource_id)
    repository_tokens_delete(session.id, resource_id=resource_id, actor=actor)
    session.resources = [*session.resources[:i], *session.resources[i + 1 :]]
    session.save(update_fields=["resources", "updated_at"])
    return {"id": resource_id, "type": "session_resource_deleted"}


def check_for_environment(resources: list[dict[str, Any]], environment_config: dict[str, Any]) -> None:
    """A self-hosted environment's sessions take no resource its worker cannot have: the platform clones no
    repository and copies no file onto a machine it does not run (as the hosted service refuses both), and
    this installation has no memory stores, whose download the SDK's worker would fail on."""
    if environment_config.get("type") != "self_hosted":
        return
    for i, resource in enumerate(resources):
        kind = resource.get("type")
        if kind in ("github_repository", "file"):
            raise Invalid(
                f"'resources[{i}]': a session in a self-hosted environment takes no {kind} resources: its "
                "hands are a worker's machine, which the platform does not provision. Put the "
                f"{'repository' if kind == 'github_repository' else 'file'} on the worker's machine instead.",
                code="resource_not_supported",
            )
        if kind == "memory_store":
            raise Invalid(
                f"'resources[{i}]': no memory store {resource.get('memory_store_id')!r}: this installation has "
                "no memory stores yet, and a self-hosted worker would fail downloading it.",
                code="resource_not_supported",
            )


@transaction.atomic
def session_resource_add(
    session_id: str, *, type: str, file_id: str, mount_path: str | None = None
) -> dict[str, Any]:
    """Add a file resource: the only kind the reference adds to a session once it exists."""
    if type != "file":
        raise Invalid(f"'type' must be 'file': only file resources are added to a session, not {type!r}.")
    if not file_id:
        raise Invalid("'file_id' must not be empty.")
    session = _session(session_id, lock=True)
    item = _file(file_id, mount_path, timezone.now().isoformat())
    check_for_environment([item], session.environment.config or {})
    session.resources = [*session.resources, item]
    session.save(update_fields=["resources", "updated_at"])
    return item


__all__ = [
    "check_for_environment",
    "new_resources",
    "seal_tokens",
    "session_resource_add",
    "session_resource_delete",
    "session_resource_get",
    "session_resource_update",
    "session_resources_list",
    "shown",
]
