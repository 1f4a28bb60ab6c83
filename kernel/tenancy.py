"""Workspaces: whose objects a caller sees, and what it may do to them.

Every request has a `Caller`: the workspace it acts in, who it is (the actor recorded with what it does), and
whether it may write. Objects a path names are checked at the edge before any handler runs: each app
registers, for the path parameter that names its objects (`session_id`, `agent_id`, ...), how to find an
object's workspace and the error its own lookup raises for a missing one (`add_owner`), so another
workspace's object answers exactly as a missing one does (404), and ids do not leak. A parameter that names a
child (`work_id` under `environment_id`) is checked by its parent's rule and by the service, which looks the
child up under the parent. Lists and creates take the caller's workspace explicitly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection

from kernel.errors import Invalid, NotFound
from kernel.models import DEFAULT_WORKSPACE_ID, AuditEntry, Membership, Workspace


@dataclass(frozen=True)
class Caller:
    """Who is asking: in which workspace, as whom, and whether it may change anything."""

    workspace_id: str
    actor: str
    read_only: bool = False


SYSTEM = Caller(workspace_id=DEFAULT_WORKSPACE_ID, actor="system")


@dataclass(frozen=True)
class Owner:
    workspace_of: Callable[[str], str | None]  # None: no such object
    missing: Callable[[str], NotFound]  # what the object's own lookup raises when there is none


_SLUG = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_owners: dict[str, Owner] = {}
# Parameters that name an object inside another one the same path names: the parent's rule covers them.
CHILD_PARAMS = {
    "work_id": "environment_id",
    "key_id": "environment_id",
    "credential_id": "vault_id",
    "resource_id": "session_id",
    "sandbox_id": "session_id",  # a session's hands: the service finds them among the session's own
}


def add_owner(
    param: str, *, workspace_of: Callable[[str], str | None], missing: Callable[[str], NotFound]
) -> None:
    """Let the edge check the objects a path names by `param` belong to the caller's workspace."""
    _owners[param] = Owner(workspace_of, missing)


def owner(param: str) -> Owner | None:
    """The rule for a path parameter, if an app registered one."""
    return _owners.get(param)


def workspace_lookup(model: Any) -> Callable[[str], str | None]:
    """An owner's `workspace_of` for a model with a `workspace` field: None when no row has the id.

    Written out, as every request that names an object asks it before its view runs: the queryset's
    `values_list(...).first()` cost 0.47 ms of CPU a call, this 0.08."""
    meta = model._meta
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {quote(meta.get_field('workspace').column)} FROM {quote(meta.db_table)} "
        f"WHERE {quote(meta.pk.column)} = %s"
    )

    def workspace_of(object_id: str) -> str | None:
        with connection.cursor() as cursor:
            cursor.execute(sql, [object_id])
            row = cursor.fetchone()
        return None if row is None else str(row[0])

    return workspace_of


def unruled(params: Iterable[str]) -> list[str]:
    """The path parameters no rule covers (a route that names them would reach every workspace's objects)."""
    return [p for p in params if p not in _owners and CHILD_PARAMS.get(p) not in _owners]


def check_path(caller: Caller, params: Mapping[str, Any]) -> None:
    """Raise the not-found error of the first object the path names that is missing or in another workspace,
    before the body is read: both answer alike whatever else the request holds."""
    for name, value in params.items():
        owner = _owners.get(name)
        if owner is None or not isinstance(value, str):
            continue
        if owner.workspace_of(value) != caller.workspace_id:
            raise owner.missing(value)


def check_same(caller_workspace: str, workspace: str, missing: NotFound) -> None:
    """For an object a body names (an agent, an environment, a vault, a session to pass hands to)."""
    if workspace != caller_workspace:
        raise missing


ROLE_RANK = {Membership.Role.VIEWER: 0, Membership.Role.OPERATOR: 1, Membership.Role.ADMIN: 2}


def role_of(user: Any, workspace_id: str) -> str | None:
    """A person's role in a workspace: a superuser is an admin of every one; an active staff user their
    membership's role; anyone else none (the workspace's objects answer as missing ones)."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return None
    if user.is_superuser:
        return Membership.Role.ADMIN
    role: str | None = (
        Membership.objects.filter(user=user, workspace_id=workspace_id).values_list("role", flat=True).first()
    )
    return role


def may(role: str | None, needed: str) -> bool:
    """Whether `role` is at least `needed` (viewer < operator < admin)."""
    return role is not None and ROLE_RANK[Membership.Role(role)] >= ROLE_RANK[Membership.Role(needed)]


def workspace_by_slug(slug: str, *, create: bool = False) -> Workspace:
    """The workspace with this slug; with `create`, made when missing (a slug: letters, digits, - and _)."""
    found = Workspace.objects.filter(slug=slug).first()
    if found is not None:
        return found
    if not create:
        raise NotFound("workspace", slug, f"There is no workspace {slug!r}.")
    if not _SLUG.fullmatch(slug):
        raise Invalid(
            f"A workspace slug is 1 to 64 lowercase letters, digits, '-' or '_', starting with a letter or "
            f"digit; not {slug!r}."
        )
    return Workspace.objects.create(slug=slug, name=slug)


def audit(workspace_id: str, actor: str, action: str, target: str = "", **detail: Any) -> None:
    """Record an admin action (the audit log is append-only; the admin shows it read-only)."""
    AuditEntry.objects.create(
        workspace_id=workspace_id, actor=actor, action=action, target=target, detail=detail
    )
