"""The reaper: terminates sandboxes idle past their TTL and removes containers no live row accounts for."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from sandboxes.hands import sandbox_release, sandbox_terminate
from sandboxes.models import Sandbox
from sandboxes.providers import PROVIDERS, SandboxError, held_by
from sandboxes.provisioning import idle_seconds
from sandboxes.returns import expire_returned

logger = logging.getLogger(__name__)


# A row still provisioning this long after it was last touched (made, or taken from the warm pool with a
# checkout to prove) belongs to a worker that died while provisioning.
PROVISIONING_GRACE = timedelta(minutes=2)


def reap_idle() -> list[str]:
    """Terminate sandboxes idle past their environment's TTL (one provisioned ahead and never used: past
    SPECULATIVE_IDLE_SECONDS, if shorter), and release those of sessions that have ended (an unused one
    provisioned ahead may go back to its environment: sandboxes/returns.py, which also removes the returned
    ones no session took in time)."""
    now = timezone.now()
    reaped = expire_returned()
    # `labels__contains`, not a key lookup: NOT (labels -> 'pooled' = true) is NULL for a sandbox without the
    # key, and would leave every free (detached) sandbox out of this round.
    ready = (
        Sandbox.objects.filter(status=Sandbox.Status.READY)
        .exclude(session__isnull=True, labels__contains={"pooled": True})
        .exclude(session__isnull=True, labels__contains={"returned": True})
    )
    for sandbox in ready.select_related("environment", "session"):
        cutoff = now - timedelta(seconds=idle_seconds(sandbox))
        session = sandbox.session
        ended = session is not None and (session.status == "terminated" or session.deleted_at is not None)
        if ended:
            if sandbox_release(sandbox.id).status != Sandbox.Status.READY:  # returned ones stay ready
                reaped.append(sandbox.id)
        elif sandbox.last_used_at < cutoff and _claim_idle(sandbox, cutoff):
            sandbox_terminate(sandbox.id)
            reaped.append(sandbox.id)
    return reaped


def _claim_idle(sandbox: Sandbox, cutoff: datetime) -> bool:
    """Mark an idle sandbox dead for its end, in one conditional update: only if it is still ready, with the
    holder (or none) this round read, and untouched since the cutoff. An attach, transfer, detach or call
    between the round's read and now moved one of those, and wins: the sandbox is not ended under it."""
    return bool(
        Sandbox.objects.filter(
            id=sandbox.id,
            status=Sandbox.Status.READY,
            session_id=sandbox.session_id,
            last_used_at__lt=cutoff,
        ).update(status=Sandbox.Status.DEAD)
    )


def reap_orphans(providers: tuple[str, ...] = PROVIDERS) -> list[str]:
    """Remove sandboxes the provider still runs but no provisioning or ready row claims (a killed worker's).

    Only this deployment's: an engine may be shared with other deployments and their sandboxes.
    """
    Sandbox.objects.filter(
        status=Sandbox.Status.PROVISIONING, last_used_at__lt=timezone.now() - PROVISIONING_GRACE
    ).update(status=Sandbox.Status.DEAD)
    live = set(
        Sandbox.objects.filter(
            Q(status=Sandbox.Status.READY) | Q(status=Sandbox.Status.PROVISIONING)
        ).values_list("id", flat=True)
    )
    removed = []
    for provider, handles in held_by(settings.WORKBENCH_DEPLOYMENT, providers):
        for handle, labels in handles.items():
            if labels.get("workbench.sandbox") not in live:
                try:
                    provider.terminate(handle)
                    removed.append(handle)
                except SandboxError as error:
                    logger.warning("reaper: could not remove %s: %s", handle, error)
    Sandbox.objects.filter(status=Sandbox.Status.DEAD).update(status=Sandbox.Status.TERMINATED)
    return removed


def reap_leftovers() -> tuple[int, int]:
    """What an earlier run of this deployment left, reaped as beat's reaper would: orphans, sandboxes idle past
    their TTL and those of ended sessions go; those a live session holds stay. (found, reaped)."""

    def handles() -> set[tuple[str, str]]:
        return {(p.name, handle) for p, held in held_by(settings.WORKBENCH_DEPLOYMENT) for handle in held}

    before = handles()
    reap_idle()
    reap_orphans()
    return len(before), len(before - handles())
