"""A session's hands: sandboxes it holds by name, provisioned on the first call that needs one.

`execute(name, input)` runs a toolset tool in one of them. A dead sandbox is a tool error, never a lost
session: the call that finds it dead says so, and the next call provisions a fresh one and says that too.
Hands can be attached, detached and passed to another session; every change is an event in the log of
each session it touches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from sandboxes.models import Environment, Sandbox
from sandboxes.providers import (
    Provider,
    Resources,
    SandboxError,
    SandboxGone,
    ToolFailed,
    ToolInputError,
    get_provider,
)
from sessions.models import Session
from sessions.services import emit_event
from workbench.api.errors import InvalidRequest, NotFound

logger = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], Any]
DEFAULT_HAND = "main"


def _log(session_id: str) -> Emit:
    return lambda event: emit_event(session_id, event)


def provisioning_mode(config: dict[str, Any]) -> str:
    """"lazy" (the first tool call provisions) or "eager" (the turn provisions before its first model call),
    from an environment's config."""
    return (config.get("sandbox") or {}).get("provisioning") or settings.SANDBOX_PROVISIONING


def provider_name(environment: Environment) -> str:
    return (environment.config.get("sandbox") or {}).get("provider") or settings.SANDBOX_PROVIDER


def resources_for(environment: Environment, sandbox: Sandbox) -> Resources:
    limits = environment.config.get("sandbox") or {}
    labels = {"workbench.sandbox": sandbox.id, "workbench.environment": environment.id,
              "workbench.deployment": settings.WORKBENCH_DEPLOYMENT}
    # No network until egress goes through the credential-adding proxy (the vault's issue).
    return Resources(image=limits.get("image") or settings.SANDBOX_IMAGE, cpus=float(limits.get("cpus", 1.0)),
                     memory_mb=int(limits.get("memory_mb", 512)), pids=int(limits.get("pids", 256)),
                     network=False, labels=labels)


def provider_of(sandbox: Sandbox) -> Provider:
    return get_provider(sandbox.provider)


def held(session_id: str) -> list[Sandbox]:
    """The live hands a session holds, the default one first."""
    return list(Sandbox.objects.filter(session_id=session_id, status=Sandbox.Status.READY).order_by("created_at"))


def _new_sandbox(environment: Environment, *, session: Session | None, name: str) -> Sandbox:
    """Provision a fresh sandbox (or take one from the environment's warm pool)."""
    from sandboxes.pool import pool_take

    if session is not None:
        pooled = pool_take(environment, session=session, name=name)
        if pooled is not None:
            return pooled
    sandbox = Sandbox.objects.create(environment=environment, session=session, name=name,
                                     provider=provider_name(environment))
    try:
        sandbox.handle = provider_of(sandbox).provision(resources_for(environment, sandbox))
    except SandboxError:
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
        raise
    sandbox.status = Sandbox.Status.READY
    sandbox.save(update_fields=["handle", "status"])
    return sandbox


def sandbox_provision(session_id: str, *, name: str = DEFAULT_HAND, emit: Emit | None = None) -> Sandbox:
    """A new hand for the session under `name` (which must be free)."""
    emit = emit or _log(session_id)
    session = Session.objects.select_related("environment").get(id=session_id)
    if any(hand.name == name for hand in held(session_id)):
        raise InvalidRequest(f"Session {session_id} already holds a sandbox named {name!r}.")
    try:
        sandbox = _new_sandbox(session.environment, session=session, name=name)
    except SandboxError as error:
        emit({"type": "sandbox.failed", "name": name, "reason": str(error)})
        raise
    emit({"type": "sandbox.provisioned", "sandbox_id": sandbox.id, "name": name, "provider": sandbox.provider,
          "pooled": bool(sandbox.labels.get("pooled"))})
    if session.resources:
        from sandboxes.repositories import checkout_repositories

        checkout_repositories(provider_of(sandbox), sandbox.handle, session.resources, emit)
    return sandbox


def _hand(session_id: str, name: str | None) -> Sandbox | None:
    hands = held(session_id)
    if name is None:
        return hands[0] if hands else None
    return next((hand for hand in hands if hand.name == name), None)


def execute(
    session_id: str, name: str, input: dict[str, Any], *, emit: Emit, cancelled: Callable[[], bool]
) -> tuple[str, bool]:
    """Run toolset tool `name` in one of the session's hands (`input["sandbox"]`, else the default).

    Returns (text, is_error). The first call provisions the default hand.
    """
    wanted = input.pop("sandbox", None)
    sandbox = _hand(session_id, wanted)
    note = ""
    try:
        if sandbox is None:
            if wanted is not None and held(session_id):
                names = ", ".join(hand.name for hand in held(session_id))
                return f"This session holds no sandbox named {wanted!r}; it holds: {names}.", True
            hand_name = wanted or DEFAULT_HAND
            replaced = Sandbox.objects.filter(session_id=session_id, name=hand_name,
                                              status=Sandbox.Status.DEAD).exists()
            sandbox = sandbox_provision(session_id, name=hand_name, emit=emit)
            if replaced:
                note = f"[a new sandbox {sandbox.id} was provisioned: the previous one had died]\n"
        text = provider_of(sandbox).execute(sandbox.handle, name, input, timeout_s=settings.TOOL_TIMEOUT_SECONDS,
                                            cancelled=cancelled)
        Sandbox.objects.filter(id=sandbox.id).update(last_used_at=timezone.now())
        return note + text, False
    except SandboxGone as gone:
        assert sandbox is not None
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
        emit({"type": "sandbox.failed", "sandbox_id": sandbox.id, "name": sandbox.name, "reason": str(gone)})
        return (f"The sandbox {sandbox.name!r} died during this call: {gone}. Its effect is unknown; the next "
                "call will provision a new sandbox."), True
    except (ToolFailed, ToolInputError) as failure:
        return note + str(failure), True
    except SandboxError as error:
        return f"The sandbox provider could not run this call: {error}", True


def _free_name(session_id: str, wanted: str) -> str:
    taken = {hand.name for hand in held(session_id)}
    name, n = wanted, 2
    while name in taken:
        name, n = f"{wanted}-{n}", n + 1
    return name


def _live(sandbox_id: str) -> Sandbox:
    sandbox = Sandbox.objects.select_for_update().filter(id=sandbox_id).first()
    if sandbox is None:
        raise NotFound(f"No sandbox with id {sandbox_id!r}.")
    if sandbox.status != Sandbox.Status.READY:
        raise InvalidRequest(f"Sandbox {sandbox_id} is {sandbox.status}; only a ready sandbox can change hands.")
    return sandbox


def _session(session_id: str) -> Session:
    session = Session.objects.filter(id=session_id, deleted_at__isnull=True).first()
    if session is None:
        raise NotFound(f"No session with id {session_id!r}.")
    if session.status == Session.Status.TERMINATED:
        raise InvalidRequest(f"Session {session_id} is terminated; it cannot take a sandbox.")
    return session


def sandbox_attach(sandbox_id: str, session_id: str, *, name: str | None = None) -> Sandbox:
    """Give a free sandbox to a session."""
    with transaction.atomic():
        sandbox = _live(sandbox_id)
        if sandbox.session_id is not None:
            raise InvalidRequest(f"Sandbox {sandbox_id} is held by session {sandbox.session_id}; detach it or "
                                 "transfer it from there.")
        _session(session_id)
        sandbox.session_id, sandbox.name = session_id, _free_name(session_id, name or sandbox.name)
        sandbox.save(update_fields=["session", "name"])
        emit_event(session_id, {"type": "sandbox.attached", "sandbox_id": sandbox.id, "name": sandbox.name})
    return sandbox


def sandbox_detach(sandbox_id: str, *, emit: Emit | None = None) -> Sandbox:
    """Take a sandbox from its session; it stays alive, free for another."""
    with transaction.atomic():
        sandbox = _live(sandbox_id)
        if sandbox.session_id is None:
            raise InvalidRequest(f"Sandbox {sandbox_id} is not attached to any session.")
        (emit or _log(sandbox.session_id))({"type": "sandbox.detached", "sandbox_id": sandbox.id,
                                            "name": sandbox.name})
        sandbox.session_id = None
        sandbox.save(update_fields=["session"])
    return sandbox


def sandbox_transfer(sandbox_id: str, to_session_id: str, *, emit: Emit | None = None) -> Sandbox:
    """Pass a live sandbox, with its files and processes, from its session to another; both logs say so."""
    with transaction.atomic():
        sandbox = _live(sandbox_id)
        source = sandbox.session_id
        if source is None:
            raise InvalidRequest(f"Sandbox {sandbox_id} is not attached; attach it instead of transferring it.")
        if source == to_session_id:
            raise InvalidRequest(f"Sandbox {sandbox_id} is already held by session {to_session_id}.")
        _session(to_session_id)
        (emit or _log(source))({"type": "sandbox.detached", "sandbox_id": sandbox.id, "name": sandbox.name,
                                "to_session": to_session_id})
        sandbox.session_id, sandbox.name = to_session_id, _free_name(to_session_id, sandbox.name)
        sandbox.save(update_fields=["session", "name"])
        emit_event(to_session_id, {"type": "sandbox.attached", "sandbox_id": sandbox.id, "name": sandbox.name,
                                   "from_session": source})
    return sandbox


def sandbox_terminate(sandbox_id: str, *, emit: Emit | None = None) -> Sandbox:
    sandbox = Sandbox.objects.filter(id=sandbox_id).first()
    if sandbox is None:
        raise NotFound(f"No sandbox with id {sandbox_id!r}.")
    if sandbox.status in (Sandbox.Status.READY, Sandbox.Status.PROVISIONING, Sandbox.Status.DEAD):
        try:
            if sandbox.handle:
                provider_of(sandbox).terminate(sandbox.handle)
        except SandboxError as error:
            logger.warning("terminating %s: %s (the reaper will retry)", sandbox.id, error)
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.TERMINATED)
        if sandbox.session_id:
            (emit or _log(sandbox.session_id))({"type": "sandbox.terminated", "sandbox_id": sandbox.id,
                                                "name": sandbox.name})
    sandbox.refresh_from_db()
    return sandbox


def sandbox_json(sandbox: Sandbox) -> dict[str, Any]:
    return {"id": sandbox.id, "type": "sandbox", "name": sandbox.name, "status": sandbox.status,
            "provider": sandbox.provider, "environment_id": sandbox.environment_id, "session_id": sandbox.session_id,
            "created_at": sandbox.created_at.isoformat(), "last_used_at": sandbox.last_used_at.isoformat()}
