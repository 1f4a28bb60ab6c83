"""Sandboxes provisioned ahead that no call used, returned to their environment for the next session.

Provisioning ahead (harness/speculation.py) starts a sandbox for a session that may never call a tool, and
starting and removing one costs the machine about a core-second. So when such a session ends (the reaper's
`sandbox_release`), its sandbox is not removed if nothing but the platform ever put anything in it: it goes
back to its environment, free, and the next session of that environment that would start a sandbox takes it
instead (`sandboxes.hands._new_sandbox`, before the warm pool).

The rule: a sandbox goes back only if (1) no call ever began in it (`speculative` is still set: `execute`
clears it before the call runs), (2) the session it was provisioned for holds it still, (3) all it was
prepared with is what any session of the environment may get: its image and toolbox, and no resource or one
repository checked out from the workers' mirror (whose state, and so the clone's name, is known), no file,
and (4) its environment's config has not changed since it started. Its session's variables, if it was
given any, are cleared by a toolbox reset on the way back. A session takes one only if its own resources are
the same: none, or one repository with the same URL, folder and checkout; and it keeps that checkout only
once it proved its own access (the fetch every clone makes) and the mirror still gives what was checked out,
the warm pool's rule for a prepared checkout (sandboxes/pool.py); otherwise the checkout is removed before
anything runs in the sandbox and the repository cloned as usual. Nothing else can have one: attaching a
returned sandbox is refused. A returned sandbox no session takes is removed once idle past SPECULATIVE_IDLE_SECONDS (or its
environment's idle_ttl_seconds, if shorter); at most SPECULATIVE_RETURNED_MAX wait per environment, and a
sandbox whose session ended while as many wait is removed as before.

A session that stays open keeps its unused sandbox until the idle timeout, which removes it: only a session's
end returns one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from kernel.errors import Invalid
from sandboxes.models import Environment, Sandbox
from sandboxes.providers import SandboxError, ToolFailed
from sandboxes.provisioning import idle_seconds, provider_name, provider_of
from sandboxes.repositories import checked_repository, prepared_named, prepared_resources, stands_for
from sessions import events
from sessions.services import SessionNotFound

logger = logging.getLogger(__name__)

RETURNED_NAME = "returned"  # a returned sandbox's name while no session holds it


def _one_repository(resources: list[Any]) -> int | None | bool:
    """What a sandbox prepared with `resources` holds that a returned one may stand for: None (nothing), the
    index of its one repository, or False (files, or more than one repository: never returned or taken)."""
    prepared = prepared_resources(resources)
    if not prepared:
        return None
    if len(prepared) != 1 or prepared[0]["type"] != "github_repository":
        return False
    return next(i for i, r in enumerate(resources) if r is prepared[0])


def returnable_mark(
    session_id: str, resources: list[Any], placed: Mapping[int, str], *, variables: bool
) -> dict[str, Any] | None:
    """The label (`returnable`) of a sandbox just provisioned ahead for session `session_id` with
    `resources`, of which the ones in `placed` (index -> the clone's name) came from the repository cache,
    its shell given session `variables` or not; None if it may never go back (the module's rule)."""
    index = _one_repository(resources)
    if index is None:
        return {"session": session_id, "prepared": None, "variables": variables}
    if index is False or index not in placed:
        return None
    return {"session": session_id, "prepared": prepared_named(placed[index]), "variables": variables}


def _waiting(environment: Environment):  # type: ignore[no-untyped-def]
    """The environment's returned sandboxes, on their way back or waiting for a session."""
    return Sandbox.objects.filter(
        environment=environment,
        session__isnull=True,
        labels__returned=True,
        status__in=(Sandbox.Status.READY, Sandbox.Status.PROVISIONING),
    )


def give_back(sandbox: Sandbox, emit: Callable[[dict[str, Any]], Any]) -> bool:
    """Return `sandbox`, whose session ended, to its environment if the module's rule allows; whether it went
    (a sandbox whose toolbox then fails its reset is removed, and the session's log says so: that is gone
    too). `emit` writes to the ended session's log."""
    mark = sandbox.labels.get("returnable")
    environment = sandbox.environment
    if (
        settings.SPECULATIVE_RETURNED_MAX <= 0
        or not sandbox.labels.get("speculative")
        or not mark
        or mark.get("session") != sandbox.session_id
        or sandbox.status != Sandbox.Status.READY
        or not sandbox.handle
        or sandbox.provider != provider_name(environment)
        or sandbox.created_at < environment.updated_at
    ):
        return False
    session_id, name = sandbox.session_id, sandbox.name
    labels = {"returned": True, "speculative": True, "returnable": mark}
    with transaction.atomic():
        # The environment row's lock keeps two returns from passing the cap together.
        Environment.objects.select_for_update().filter(id=environment.id).first()
        if _waiting(environment).count() >= settings.SPECULATIVE_RETURNED_MAX:
            return False
        # Only while its session holds it and no call began in it; provisioning (to no one) until its reset.
        if not Sandbox.objects.filter(
            id=sandbox.id, session_id=session_id, status=Sandbox.Status.READY, labels__speculative=True
        ).update(
            session=None,
            name=RETURNED_NAME,
            status=Sandbox.Status.PROVISIONING,
            labels=labels,
            last_used_at=timezone.now(),
        ):
            return False
    provider = provider_of(sandbox)
    try:
        if mark.get("variables", True):
            # The session's variables go (no call ran: the toolbox is as it started, and none is told of
            # the new shell). A shell that was given none has nothing to lose, and keeps its state.
            provider.reset(sandbox.handle, env={}, unused=True)
        ready = Sandbox.objects.filter(id=sandbox.id, status=Sandbox.Status.PROVISIONING).update(
            status=Sandbox.Status.READY
        )
        reason = None if ready else "it was given up while it was being returned"
    except (SandboxError, ToolFailed) as error:
        reason = f"its toolbox failed the reset on its way back to the environment: {error}"
    if reason is not None:  # as a discarded new hand: dead, its container removed (or the reaper's orphan)
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
        with suppress(SandboxError):
            provider.terminate(sandbox.handle)
    event = (
        events.sandbox_detached(sandbox.id, name, returned=True)
        if reason is None
        else events.sandbox_terminated(sandbox.id, name, reason=reason)
    )
    with suppress(SessionNotFound):  # a deleted session's log takes no more events
        emit(event)
    return True


def _wanted(resources: list[Any]) -> dict[str, Any] | None | bool:
    """What a returned sandbox must have been prepared with for a session with `resources` to take it: None
    (nothing), one repository (its URL, folder and checkout as the resource names them), or False: none
    may be taken."""
    index = _one_repository(resources)
    if index is None or index is False:
        return index
    try:  # as the clone names it (its URL's spelling, the default folder)
        return checked_repository(resources[index], "resources")
    except Invalid:
        return False


def _fits(prepared: dict[str, Any] | None, wanted: dict[str, Any] | None) -> bool:
    if prepared is None or wanted is None:
        return prepared is None and wanted is None
    return stands_for(wanted, prepared)


def take_returned(environment: Environment, *, session: Any, name: str) -> Sandbox | None:
    """Hand `session` (its row locked by the caller, in a transaction) one of the environment's returned
    sandboxes that fits its resources, the most recently returned first (the older ones then expire); None
    if there is none. It carries `prepared` when it holds a checkout, for the caller to have proved."""
    wanted = _wanted(session.resources)
    if wanted is False:
        return None
    candidates = (
        _waiting(environment)
        .filter(
            status=Sandbox.Status.READY,
            provider=provider_name(environment),
            created_at__gte=environment.updated_at,
        )
        .order_by("-last_used_at")
        .values_list("id", "labels")
    )
    for sandbox_id, labels in candidates:
        prepared = (labels.get("returnable") or {}).get("prepared")
        if not _fits(prepared, wanted):  # type: ignore[arg-type]
            continue
        sandbox = (
            _waiting(environment)
            .filter(id=sandbox_id, status=Sandbox.Status.READY)
            .select_for_update(skip_locked=True)
            .first()
        )
        if sandbox is None:  # taken or expired meanwhile
            continue
        sandbox.session, sandbox.name = session, name
        sandbox.labels = {"from_returns": True, **({"prepared": prepared} if prepared else {})}
        sandbox.save(update_fields=["session", "name", "labels"])
        return sandbox
    return None


def expire_returned() -> list[str]:
    """Remove the returned sandboxes no session took within SPECULATIVE_IDLE_SECONDS of their return (or
    their environment's idle_ttl_seconds, if shorter); their ids."""
    now = timezone.now()
    expired = []
    waiting = Sandbox.objects.filter(session__isnull=True, labels__returned=True, status=Sandbox.Status.READY)
    for sandbox in waiting.select_related("environment"):  # each `speculative`, so idle_seconds says which
        cutoff = now - timedelta(seconds=idle_seconds(sandbox))
        # Only while no session has taken it: a take holds the row's lock, and leaves it held.
        if not waiting.filter(id=sandbox.id, last_used_at__lt=cutoff).update(status=Sandbox.Status.DEAD):
            continue
        try:
            provider_of(sandbox).terminate(sandbox.handle)
        except SandboxError as error:
            logger.warning("removing returned sandbox %s: %s (the reaper will retry)", sandbox.id, error)
        else:
            Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.TERMINATED)
        expired.append(sandbox.id)
    return expired
