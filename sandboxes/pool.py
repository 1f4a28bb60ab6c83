"""Warm pools: an environment may keep N sandboxes provisioned and idle, handed out on provisioning.

The pool's rule: a pooled sandbox is one no session has ever held. `labels["pooled"]` marks a pool member
until a session takes it; the take (and any later detach) clears it for good and sets `from_pool`, so a
sandbox that comes back free after a session used it is an ordinary free sandbox (attachable by id, reaped
when idle), never handed out again as a fresh one.

An environment that names a `pool_repository` gets its pooled sandboxes with that repository checked out
from the workers' mirror (`sandboxes.repositories.prepare_checkout`), once a session has fetched it; a
session keeps that checkout only after proving its own access, and the refill never asks the remote. A pool
member whose checkout the mirror has moved past since it was prepared (a session's fetch brought a new tip),
or that came with none while the mirror had none to give, would only have its checkout removed and the
repository cloned again by the session that takes it: pool maintenance (`pool_renew`, on beat) replaces it.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from datetime import UTC, datetime

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from sandboxes.models import Environment, Sandbox
from sandboxes.providers import SandboxError
from sandboxes.provisioning import provider_name, provider_of, resources_for
from sandboxes.repositories import mirror_state, prepare_checkout, prepared_as

logger = logging.getLogger(__name__)

REFILL_TASK = "sandboxes.refill_pool"


def pool_size(environment: Environment) -> int:
    """The environment's pool, at most SANDBOX_MAX_WARM_POOL (which may have been lowered since it was set)."""
    return min(
        int((environment.config.get("sandbox") or {}).get("warm_pool", 0)), settings.SANDBOX_MAX_WARM_POOL
    )


def _pooled(environment: Environment):  # type: ignore[no-untyped-def]
    """The environment's pool sandboxes: no session holds them, and none ever has."""
    return Sandbox.objects.filter(environment=environment, session__isnull=True, labels__pooled=True)


def leave_pool(sandbox: Sandbox) -> None:
    """Mark `sandbox` as held once (in memory; the caller saves `labels`): it is never a pool member again."""
    if sandbox.labels.get("pooled"):
        sandbox.labels = {**sandbox.labels, "pooled": False, "from_pool": True}


def _free(environment: Environment):  # type: ignore[no-untyped-def]
    return _pooled(environment).filter(status=Sandbox.Status.READY)


def pool_take(environment: Environment, *, session, name: str) -> Sandbox | None:  # type: ignore[no-untyped-def]
    """Hand one pooled sandbox to `session`, and refill the pool in the background."""
    if pool_size(environment) == 0:
        return None
    with transaction.atomic():
        sandbox = _free(environment).select_for_update(skip_locked=True).order_by("created_at").first()
        if sandbox is not None:
            leave_pool(sandbox)
            sandbox.session, sandbox.name = session, name
            sandbox.save(update_fields=["session", "name", "labels"])
    transaction.on_commit(lambda: queue_refill(environment.id))
    return sandbox


def pool_renew(environment: Environment) -> list[str]:
    """Remove the environment's free pool members that hold no checkout of its `pool_repository` (as it is
    configured now) while the workers' mirror can give one, or one the mirror has moved past since they were
    made (so a worker whose mirror is behind theirs leaves them alone); the refill that follows prepares
    their replacements from the mirror as it is. Asks no remote. Returns the ids removed."""
    repository = (environment.config.get("sandbox") or {}).get("pool_repository")
    mirror = mirror_state(repository) if repository else None
    if repository is None or mirror is None:
        return []
    state, fetched = mirror
    fetched_at = datetime.fromtimestamp(fetched, UTC)
    removed = []
    for sandbox in _free(environment):
        prepared = sandbox.labels.get("prepared")
        if (
            prepared
            and prepared_as(repository, prepared)
            and (prepared.get("state") == state or sandbox.created_at >= fetched_at)
        ):
            continue
        # Only while no session has taken it: a take holds the row's lock, and leaves it no longer free.
        if _free(environment).filter(id=sandbox.id).update(status=Sandbox.Status.DEAD):
            with suppress(SandboxError):
                provider_of(sandbox).terminate(sandbox.handle)
            removed.append(sandbox.id)
    if removed:
        logger.info(
            "warm pool of %s: %d members renewed for %s", environment.id, len(removed), repository["url"]
        )
    return removed


def queue_refill(environment_id: str) -> None:
    """Queue the pool's refill by the task's name: the task (`sandboxes.tasks`) calls back into this module."""
    current_app.send_task(REFILL_TASK, (environment_id,))


def pool_refill(environment_id: str) -> int:
    """Provision until the environment's pool holds its size; returns how many were added.

    The rows are committed (provisioning) before their containers start, so that the reaper, in another
    process, sees each container claimed: started inside this transaction, a container had no row the
    reaper could see, and it was removed as an orphan while the refill went on to mark it ready.
    """
    with transaction.atomic():
        # The environment row's lock keeps two refills from overfilling the same pool: each counts the
        # sandboxes the other is still starting.
        environment = Environment.objects.select_for_update().usable().filter(id=environment_id).first()
        if environment is None:
            return 0
        coming = (
            _pooled(environment)
            .filter(status__in=(Sandbox.Status.READY, Sandbox.Status.PROVISIONING))
            .count()
        )
        rows = [
            Sandbox.objects.create(
                environment=environment,
                name="pooled",
                labels={"pooled": True},
                provider=provider_name(environment),
            )
            for _ in range(max(pool_size(environment) - coming, 0))
        ]
    repository = (environment.config.get("sandbox") or {}).get("pool_repository")
    added = 0
    for i, sandbox in enumerate(rows):
        provider = provider_of(sandbox)
        # Its grace with the reaper runs from now, not from when the rows were made.
        Sandbox.objects.filter(id=sandbox.id).update(last_used_at=timezone.now())
        try:
            sandbox.handle = provider.provision(resources_for(environment, sandbox))
            prepared = prepare_checkout(provider, sandbox.handle, repository) if repository else None
        except SandboxError as error:
            logger.warning("warm pool of %s: provisioning failed: %s", environment_id, error)
            if sandbox.handle:  # started, but part of a checkout may be in it: no session gets it
                with suppress(SandboxError):
                    provider.terminate(sandbox.handle)
            Sandbox.objects.filter(id__in=[row.id for row in rows[i:]]).update(status=Sandbox.Status.DEAD)
            break
        labels = {**sandbox.labels, "prepared": prepared} if prepared else sandbox.labels
        # Only if the reaper did not give the row up meanwhile.
        if not Sandbox.objects.filter(id=sandbox.id, status=Sandbox.Status.PROVISIONING).update(
            handle=sandbox.handle, status=Sandbox.Status.READY, labels=labels
        ):
            with suppress(SandboxError):
                provider.terminate(sandbox.handle)
            continue
        added += 1
    return added
