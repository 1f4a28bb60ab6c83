"""A session's hands: `execute(name, input)` on the session's sandbox, provisioned on the first call.

A dead sandbox is a tool error, never a lost session: the call that finds it dead says so, and the next
call provisions a fresh one and says that too. Sandbox life events go into the session's log through the
`emit` the brain passes (so they carry its lease epoch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.utils import timezone

from sandboxes.models import Sandbox
from sandboxes.providers import Resources, SandboxError, SandboxGone, ToolFailed, ToolInputError, get_provider
from sessions.models import Session

logger = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], Any]


def _resources(session: Session, sandbox: Sandbox) -> Resources:
    # No network until egress goes through the credential-adding proxy (the vault's issue).
    return Resources(image=settings.SANDBOX_IMAGE, network=False,
                     labels={"workbench.sandbox": sandbox.id, "workbench.session": session.id})


def _provision(session: Session, name: str, emit: Emit) -> Sandbox:
    sandbox = Sandbox.objects.create(environment=session.environment, session=session, name=name,
                                     provider=settings.SANDBOX_PROVIDER)
    try:
        sandbox.handle = get_provider(sandbox.provider).provision(_resources(session, sandbox))
    except SandboxError as error:
        sandbox.status = Sandbox.Status.DEAD
        sandbox.save(update_fields=["status"])
        emit({"type": "sandbox.failed", "sandbox_id": sandbox.id, "name": name, "reason": str(error)})
        raise
    sandbox.status = Sandbox.Status.READY
    sandbox.save(update_fields=["handle", "status"])
    emit({"type": "sandbox.provisioned", "sandbox_id": sandbox.id, "name": name, "provider": sandbox.provider})
    return sandbox


def execute(
    session_id: str, name: str, input: dict[str, Any], *, emit: Emit, cancelled: Callable[[], bool]
) -> tuple[str, bool]:
    """Run toolset tool `name` in the session's sandbox; returns (text, is_error)."""
    session = Session.objects.select_related("environment").get(id=session_id)
    hand = input.pop("sandbox", None) or "main"
    sandbox = Sandbox.objects.filter(session=session, name=hand, status=Sandbox.Status.READY).first()
    note = ""
    try:
        if sandbox is None:
            replaced = Sandbox.objects.filter(session=session, name=hand, status=Sandbox.Status.DEAD).exists()
            sandbox = _provision(session, hand, emit)
            if replaced:
                note = f"[a new sandbox {sandbox.id} was provisioned: the previous one had died]\n"
        provider = get_provider(sandbox.provider)
        text = provider.execute(sandbox.handle, name, input, timeout_s=settings.TOOL_TIMEOUT_SECONDS,
                                cancelled=cancelled)
        Sandbox.objects.filter(id=sandbox.id).update(last_used_at=timezone.now())
        return note + text, False
    except SandboxGone as gone:
        assert sandbox is not None
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
        emit({"type": "sandbox.failed", "sandbox_id": sandbox.id, "name": hand, "reason": str(gone)})
        return (f"The sandbox died during this call: {gone}. Its effect is unknown; the next call will "
                "provision a new sandbox."), True
    except (ToolFailed, ToolInputError) as failure:
        return note + str(failure), True
    except SandboxError as error:
        return f"The sandbox provider could not run this call: {error}", True
