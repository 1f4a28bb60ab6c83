"""The self-hosted work queue (reference §3.3, §5): poll, ack, heartbeat, stop, update, and lost workers.

A work item is a self-hosted environment's request for hands for one session. Its life:

    queued --poll (hand-out, with a sessions token)--> queued, polled --ack--> starting
    starting --first heartbeat (expected NO_HEARTBEAT: the claim)--> active --heartbeats--> active
    any live state --stop--> stopping (a worker holds it; it is told by its next heartbeat) or stopped

A hand-out not acked within the poll's `reclaim_older_than_ms` may be handed out again. A worker that is
lost puts its item back in the queue: acked and never heartbeated within WORK_START_TIMEOUT_SECONDS, or
active with its lease (ttl_seconds from the last heartbeat) run out; an item told to stop whose worker is
gone is stopped. Beat looks for those (`work_sweep`) and so does every poll, before it looks for work.

Rows and leases are PostgreSQL's (`FOR UPDATE SKIP LOCKED`: concurrent polls never hand out one item
twice; on SQLite, a compare-and-set update does it); Redis only wakes long polls (sandboxes/work_wake.py).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Min, Q
from django.utils import timezone

from kernel.api.validation import check_metadata, patch_metadata
from kernel.errors import Conflict, DomainError, Invalid, NotFound
from kernel.models import hash_key
from sandboxes.models import Sandbox, WorkItem, WorkPoller
from sandboxes.work_keys import new_sessions_token, self_hosted_environment
from sandboxes.work_wake import listening, wake_pollers
from sessions import events
from sessions.models import Session
from sessions.services import emit_event

logger = logging.getLogger(__name__)

NO_HEARTBEAT = "NO_HEARTBEAT"
RECLAIM_DEFAULT_MS = 5000
# The stats count the workers seen polling this recently.
POLLERS_WINDOW = timedelta(seconds=30)
# A worker's last poll is written at most this often (every poll of every worker would be a write).
_POLLER_RESOLUTION = timedelta(seconds=5)
SELF_HOSTED_PROVIDER = "self_hosted"

State = WorkItem.State
LostHook = Callable[[str, str], None]
_lost_hooks: list[LostHook] = []
_stopped_hooks: list[LostHook] = []


class LeaseNotHeld(DomainError):
    """A heartbeat whose `expected_last_heartbeat` is not the stored one: another worker may hold the lease
    (or nobody does). `details["current_state"]` is the lease as the server holds it; the edge answers 412."""

    def __init__(self, message: str, *, current_state: dict[str, Any]):
        super().__init__(
            message, code="heartbeat_precondition_failed", details={"current_state": current_state}
        )


def add_work_lost_hook(hook: LostHook) -> None:
    """Call `hook(session_id, work_id)` after an item of that session lost its worker and went back to the
    queue (after the commit)."""
    if hook not in _lost_hooks:
        _lost_hooks.append(hook)


def add_work_stopped_hook(hook: LostHook) -> None:
    """Call `hook(session_id, work_id)` after an item of that session stopped (after the commit)."""
    if hook not in _stopped_hooks:
        _stopped_hooks.append(hook)


def _run_hooks(hooks: list[LostHook], session_id: str, work_id: str) -> bool:
    """Each hook once; False if one failed (it is tried again by a later sweep)."""
    succeeded = True
    for hook in list(hooks):
        try:
            hook(session_id, work_id)
        except Exception:  # noqa: BLE001 - one layer's hook failing must not keep the others from running
            logger.exception("a work item hook failed for %s (%s)", work_id, session_id)
            succeeded = False
    return succeeded


# -- reads


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def work_json(item: WorkItem, *, secret: str | None = None) -> dict[str, Any]:
    """The work item as the SDK reads it (BetaSelfHostedWork); `secret` only on the poll's answer."""
    data_id = item.session_id if item.kind == WorkItem.Kind.SESSION else item.id
    return {
        "id": item.id,
        "type": "work",
        "environment_id": item.environment_id,
        "data": {"type": item.kind, "id": data_id},
        "state": str(item.state),
        "metadata": dict(item.metadata),
        "secret": secret,
        "created_at": item.created_at.isoformat(),
        "acknowledged_at": _iso(item.acknowledged_at),
        "started_at": _iso(item.started_at),
        "latest_heartbeat_at": _iso(item.latest_heartbeat_at),
        "stop_requested_at": _iso(item.stop_requested_at),
        "stopped_at": _iso(item.stopped_at),
    }


def lease_json(item: WorkItem, *, extended: bool) -> dict[str, Any]:
    """The lease as a heartbeat reports it (BetaSelfHostedWorkHeartbeatResponse)."""
    return {
        "type": "work_heartbeat",
        "last_heartbeat": item.latest_heartbeat,
        "lease_extended": extended,
        "state": str(item.state),
        "ttl_seconds": item.ttl_seconds or settings.WORK_LEASE_TTL_SECONDS,
    }


def _current_state(item: WorkItem) -> dict[str, Any]:
    """The lease in a 412's details (BetaWorkLeaseState): `last_heartbeat` null when there was none."""
    return {
        "last_heartbeat": item.latest_heartbeat or None,
        "lease_extended": False,
        "state": str(item.state),
        "ttl_seconds": item.ttl_seconds or settings.WORK_LEASE_TTL_SECONDS,
    }


def get_work(environment_id: str, work_id: str) -> WorkItem:
    item = WorkItem.objects.filter(id=work_id, environment_id=environment_id).first()
    if item is None:
        self_hosted_environment(environment_id)  # no such environment is what to say first
        raise NotFound("work item", work_id, f"Environment {environment_id} has no work item {work_id!r}.")
    return item


def work_live(session_id: str) -> WorkItem | None:
    """The session's work item that is not stopped, if any."""
    return WorkItem.objects.live().filter(session_id=session_id).first()


def work_stats(environment_id: str) -> dict[str, Any]:
    """The queue's numbers (BetaSelfHostedWorkQueueStats): waiting, handed out and not acked, the oldest
    waiting, and the workers (Anthropic-Worker-IDs) seen polling in the last 30 seconds."""
    self_hosted_environment(environment_id)
    now = timezone.now()
    waiting = WorkItem.objects.in_queue().filter(environment_id=environment_id)
    pending = waiting.filter(polled_at__isnull=False).count()
    oldest = waiting.aggregate(oldest=Min("queued_at"))["oldest"]
    polling = WorkPoller.objects.filter(
        environment_id=environment_id, last_polled_at__gte=now - POLLERS_WINDOW
    ).count()
    return {
        "type": "work_queue_stats",
        "depth": waiting.filter(polled_at__isnull=True).count(),
        "pending": pending,
        "oldest_queued_at": _iso(oldest),
        "workers_polling": polling,
    }


# -- the harness's side


def work_ensure(session_id: str) -> str:
    """The id of the session's live work item, queued now if it has none. One live item per session (a
    partial unique constraint decides between concurrent callers); a new one wakes the environment's polls."""
    live = work_live(session_id)
    if live is not None:
        return live.id
    session = Session.objects.live().filter(id=session_id).select_related("environment").first()
    if session is None:
        raise NotFound("session", session_id)
    if session.environment.config.get("type") != "self_hosted":
        raise Invalid(
            f"Session {session_id} runs in environment {session.environment_id}, which is not self-hosted: "
            "its tools run on the platform's sandboxes, not a worker's."
        )
    try:
        with transaction.atomic():
            item = WorkItem.objects.create(environment_id=session.environment_id, session_id=session_id)
            wake_pollers(session.environment_id)
    except IntegrityError:
        live = work_live(session_id)
        if live is None:
            raise
        return live.id
    logger.info("work item %s queued for session %s", item.id, session_id)
    return item.id


def work_enqueue_healthcheck(environment_id: str) -> str:
    """A healthcheck item: the SDK's worker takes it and force-stops it without running anything."""
    environment = self_hosted_environment(environment_id)
    with transaction.atomic():
        item = WorkItem.objects.create(environment=environment, kind=WorkItem.Kind.HEALTHCHECK)
        wake_pollers(environment_id)
    return item.id


def work_stop_for_session(session_id: str) -> None:
    """Ask the session's live item to stop (the session ended, was archived or deleted): its worker is told
    by its next heartbeat; an item no worker holds stops at once. The session's worker hand is released now:
    an ended session holds no hands (and beat's reaper must not meet one it has no provider for)."""
    live = work_live(session_id)
    if live is None:
        return
    with suppress(Conflict), transaction.atomic():  # Conflict: it stopped meanwhile
        item = work_stop(live.environment_id, live.id, force=False)
        _hands_released(
            item, status=Sandbox.Status.TERMINATED, reason="the session ended; its worker is told to stop"
        )


# -- the worker's side


def _record_poller(environment_id: str, worker_id: str, now: datetime) -> None:
    updated = WorkPoller.objects.filter(
        environment_id=environment_id, worker_id=worker_id, last_polled_at__lt=now - _POLLER_RESOLUTION
    ).update(last_polled_at=now)
    if updated or WorkPoller.objects.filter(environment_id=environment_id, worker_id=worker_id).exists():
        return
    try:
        with transaction.atomic():
            WorkPoller.objects.create(environment_id=environment_id, worker_id=worker_id, last_polled_at=now)
    except IntegrityError:
        pass  # the same worker's other poll wrote it


def _secret(token: str) -> str:
    """What the SDK's worker reads the sessions token from: URL-safe base64 of a JSON object."""
    return base64.urlsafe_b64encode(json.dumps({"sessions_token": token}).encode()).decode()


@dataclass(frozen=True)
class HandOut:
    item: WorkItem
    secret: str


def _hand_out(environment_id: str, worker_id: str, reclaim_older_than_ms: int) -> HandOut | None:
    """The oldest item in the environment's queue not handed out in the last `reclaim_older_than_ms`, handed
    out now with a new sessions token; None if there is none."""
    for _ in range(5):  # only SQLite's compare-and-set can lose a race, and then tries the next item
        now = timezone.now()
        reclaim_before = now - timedelta(milliseconds=reclaim_older_than_ms)
        with transaction.atomic():
            candidates = (
                WorkItem.objects.in_queue()
                .filter(environment_id=environment_id)
                .filter(Q(polled_at__isnull=True) | Q(polled_at__lt=reclaim_before))
                .filter(hooks_due_at__isnull=True)
                .order_by("queued_at", "id")
            )
            if connection.vendor == "postgresql":
                candidates = candidates.select_for_update(skip_locked=True)
            item = candidates.first()
            if item is None:
                return None
            token = new_sessions_token(item.id)
            offered = [*item.offered_token_hashes, *([item.token_hash] if item.token_hash else [])]
            changed = WorkItem.objects.filter(
                id=item.id, state=State.QUEUED, polled_at=item.polled_at
            ).update(
                polled_at=now, polled_by=worker_id, token_hash=hash_key(token), offered_token_hashes=offered
            )
            if changed:
                item.refresh_from_db()
                return HandOut(item, _secret(token))
    return None


def work_poll(
    environment_id: str,
    *,
    worker_id: str = "",
    block_ms: int | None = None,
    reclaim_older_than_ms: int = RECLAIM_DEFAULT_MS,
) -> HandOut | None:
    """A work item for the worker, with its secret; None if none arrives within `block_ms` (no wait without
    it). Items of lost workers go back to the queue first."""
    self_hosted_environment(environment_id)
    if worker_id:
        _record_poller(environment_id, worker_id, timezone.now())
    work_sweep(environment_id=environment_id)
    handed = _hand_out(environment_id, worker_id, reclaim_older_than_ms)
    if handed is not None or not block_ms:
        return handed
    deadline = time.monotonic() + block_ms / 1000
    with listening(environment_id) as wait:
        while (handed := _hand_out(environment_id, worker_id, reclaim_older_than_ms)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            _release_connection()
            wait(left)
    return handed


def _release_connection() -> None:
    """A waiting poll holds no database connection: back to the pool (or closed) until its next look, so a
    hundred idle workers' polls do not take a hundred of them."""
    if not connection.in_atomic_block:
        connection.close()


def _locked(environment_id: str, work_id: str) -> WorkItem:
    """The item, locked until the caller's transaction ends (SQLite locks the database on the first write)."""
    item = WorkItem.objects.select_for_update().filter(id=work_id, environment_id=environment_id).first()
    if item is None:
        self_hosted_environment(environment_id)  # no such environment is what to say first
        raise NotFound("work item", work_id, f"Environment {environment_id} has no work item {work_id!r}.")
    return item


def work_ack(environment_id: str, work_id: str) -> WorkItem:
    """The worker has the item a poll handed it: queued -> starting, out of the queue. Only once."""
    with transaction.atomic():
        item = _locked(environment_id, work_id)
        if item.state != State.QUEUED:
            when = f" at {item.acknowledged_at.isoformat()}" if item.acknowledged_at else ""
            raise Conflict(
                f"Work item {work_id} is {item.state}, not queued: it was already acknowledged{when} or stopped; "
                "poll for another.",
                code="work_not_queued",
            )
        if item.polled_at is None:
            raise Conflict(
                f"Work item {work_id} has not been handed out by a poll; poll for work, then ack what it returns.",
                code="work_not_polled",
            )
        item.state = State.STARTING
        item.acknowledged_at = timezone.now()
        item.worker_id = item.polled_by
        item.save(update_fields=["state", "acknowledged_at", "worker_id"])
    return item


def _next_heartbeat(item: WorkItem, now: datetime) -> str:
    """The string the next heartbeat must echo: the time, made unique if two beats share a microsecond."""
    beat = now.isoformat()
    if beat == item.latest_heartbeat:
        beat = (now + timedelta(microseconds=1)).isoformat()
    return beat


def work_heartbeat(
    environment_id: str,
    work_id: str,
    *,
    expected_last_heartbeat: str | None = None,
    desired_ttl_seconds: int | None = None,
    token_hash: str | None = None,
) -> dict[str, Any]:
    """Extend the item's lease. The first heartbeat (`expected_last_heartbeat` = NO_HEARTBEAT) claims it;
    each later one must echo the last `last_heartbeat` exactly, else LeaseNotHeld (another worker may hold
    it). A stopping or stopped item is not compared and not extended: `lease_extended` false tells the worker
    to finish. `token_hash`: the sessions token the beat came with (None with the environment key)."""
    with transaction.atomic():
        item = _locked(environment_id, work_id)
        if item.state in (State.STOPPING, State.STOPPED):
            return lease_json(item, extended=False)
        retired = token_hash is not None and token_hash in item.retired_token_hashes
        claimed = bool(item.latest_heartbeat)
        stranger = token_hash is not None and claimed and token_hash != item.token_hash
        stored = item.latest_heartbeat or NO_HEARTBEAT
        if (
            item.state == State.QUEUED
            or retired
            or stranger
            or (expected_last_heartbeat is not None and expected_last_heartbeat != stored)
        ):
            raise LeaseNotHeld(
                f"Work item {work_id}'s lease is not held by this heartbeat: it is {item.state}, its last "
                f"heartbeat is {item.latest_heartbeat or 'none'}"
                + (", and this token's claim has ended" if retired or stranger else "")
                + "; another worker may hold it.",
                current_state=_current_state(item),
            )
        now = timezone.now()
        first = not claimed
        item.ttl_seconds = desired_ttl_seconds or settings.WORK_LEASE_TTL_SECONDS
        item.latest_heartbeat = _next_heartbeat(item, now)
        item.latest_heartbeat_at = now
        item.lease_expires_at = now + timedelta(seconds=item.ttl_seconds)
        fields = ["ttl_seconds", "latest_heartbeat", "latest_heartbeat_at", "lease_expires_at"]
        if first:
            item.state = State.ACTIVE
            item.started_at = now
            claiming = token_hash if token_hash is not None else item.token_hash
            others = {*item.offered_token_hashes, item.token_hash} - {claiming, ""}
            item.token_hash = claiming
            item.offered_token_hashes = []
            item.retired_token_hashes = [*item.retired_token_hashes, *sorted(others)]
            fields += ["state", "started_at", "token_hash", "offered_token_hashes", "retired_token_hashes"]
        item.save(update_fields=fields)
        if first:
            _hands_attached(item, now)
        else:
            Sandbox.objects.filter(
                provider=SELF_HOSTED_PROVIDER, handle=item.id, status=Sandbox.Status.READY
            ).update(last_used_at=now)
    return lease_json(item, extended=True)


def work_stop(environment_id: str, work_id: str, *, force: bool = False) -> WorkItem:
    """Stop the item: at once with `force`, or when no worker holds it; else `stopping`, which its worker
    learns from its next heartbeat (and then stops it itself). A stopped item is a Conflict (409)."""
    with transaction.atomic():
        item = _locked(environment_id, work_id)
        if item.state == State.STOPPED:
            raise Conflict(
                f"Work item {work_id} is already stopped (at {_iso(item.stopped_at)}).",
                code="work_already_stopped",
            )
        now = timezone.now()
        item.stop_requested_at = item.stop_requested_at or now
        if force or item.state == State.QUEUED:
            _stopped(
                item,
                now,
                reason="stopped" if item.state != State.QUEUED else "stopped before a worker took it",
            )
        else:
            item.state = State.STOPPING
            item.save(update_fields=["state", "stop_requested_at"])
    return item


def work_update(environment_id: str, work_id: str, *, metadata: dict[str, Any]) -> WorkItem:
    """Merge `metadata` into the item's (a null value removes the key)."""
    with transaction.atomic():
        item = _locked(environment_id, work_id)
        item.metadata = patch_metadata(item.metadata, check_metadata(metadata, patch=True))
        item.save(update_fields=["metadata"])
    return item


# -- ends: stopped, or lost


def _stopped(item: WorkItem, now: datetime, *, reason: str) -> None:
    item.state = State.STOPPED
    item.stopped_at = now
    item.hooks_due_at = now if item.session_id else None
    item.save(update_fields=["state", "stopped_at", "stop_requested_at", "hooks_due_at"])
    _hands_released(item, status=Sandbox.Status.TERMINATED, reason=reason)
    if item.session_id:
        transaction.on_commit(partial(_settle, item.id, now))


def _lost_condition(now: datetime) -> Q:
    started_before = now - timedelta(seconds=settings.WORK_START_TIMEOUT_SECONDS)
    never_beat = Q(latest_heartbeat="", acknowledged_at__lt=started_before)
    expired = Q(lease_expires_at__lt=now)
    return (
        Q(state=State.STARTING, acknowledged_at__lt=started_before)
        | Q(state=State.ACTIVE, lease_expires_at__lt=now)
        | (Q(state=State.STOPPING) & (never_beat | expired))
    )


def work_sweep(*, environment_id: str | None = None) -> list[str]:
    """Items whose worker is gone: back to the queue (a stopping one is stopped). The work-lost hooks run
    after each commit; the hooks of earlier ends left unrun are run too. Returns the ids of both."""
    found = WorkItem.objects.filter(_lost_condition(timezone.now()))
    if environment_id is not None:
        found = found.filter(environment_id=environment_id)
    swept = []
    for work_id in found.values_list("id", flat=True)[:500]:
        with transaction.atomic():
            now = timezone.now()
            candidates = WorkItem.objects.filter(_lost_condition(now), id=work_id)
            if connection.vendor == "postgresql":
                candidates = candidates.select_for_update(skip_locked=True)
            item = candidates.first()
            if item is None:
                continue  # it beat, stopped, or another sweep has it
            if item.state == State.STOPPING:
                _stopped(
                    item, now, reason=f"its worker {item.worker_id or '(unnamed)'} was lost while stopping"
                )
            else:
                _requeue(item, now)
                transaction.on_commit(partial(_settle, item.id, now))
        swept.append(work_id)
    return [*swept, *_settle_overdue(environment_id)]


def _requeue(item: WorkItem, now: datetime) -> None:
    """Back in the queue after its worker was lost; the tokens of its hand-outs and claim stop working."""
    if item.state == State.STARTING:
        reason = (
            f"worker {item.worker_id or '(unnamed)'} acknowledged it and sent no heartbeat within "
            f"{settings.WORK_START_TIMEOUT_SECONDS:g}s"
        )
    else:
        reason = (
            f"worker {item.worker_id or '(unnamed)'} sent no heartbeat within its {item.ttl_seconds}s lease"
        )
    logger.info("work item %s back in the queue: %s", item.id, reason)
    _hands_released(item, status=Sandbox.Status.DEAD, reason=reason)
    retired = [
        *item.retired_token_hashes,
        *item.offered_token_hashes,
        *([item.token_hash] if item.token_hash else []),
    ]
    WorkItem.objects.filter(id=item.id).update(
        state=State.QUEUED,
        queued_at=now,
        # Held back from polls until the work-lost hooks have settled the calls the lost worker left
        # (`_settle`), so no worker reads them first and runs one that is to be closed as unverified.
        hooks_due_at=now,
        polled_at=None,
        polled_by="",
        acknowledged_at=None,
        started_at=None,
        latest_heartbeat="",
        latest_heartbeat_at=None,
        ttl_seconds=0,
        lease_expires_at=None,
        worker_id="",
        token_hash="",
        offered_token_hashes=[],
        retired_token_hashes=retired,
        lost_count=item.lost_count + 1,
    )


def _settle(work_id: str, due_at: datetime) -> bool:
    """After the commit that stopped `work_id` or put it back in the queue: its hooks (work-lost or
    work-stopped), then the mark cleared, which releases a queued item to polls. False if the mark was not
    `due_at` any more (another process settles it) or a hook failed (the mark stays, for `_settle_overdue`).
    The hooks may run twice for one end, should a process die between them and the clearing; they are
    idempotent."""
    item = WorkItem.objects.filter(id=work_id, hooks_due_at=due_at).first()
    if item is None:
        return False
    hooks = _stopped_hooks if item.state == State.STOPPED else _lost_hooks
    if item.session_id and not _run_hooks(hooks, item.session_id, item.id):
        return False
    if not WorkItem.objects.filter(id=work_id, hooks_due_at=due_at).update(hooks_due_at=None):
        return False
    if item.state == State.QUEUED:
        wake_pollers(item.environment_id)
    return True


def _settle_overdue(environment_id: str | None) -> list[str]:
    """Ends whose hooks have not run WORK_SETTLE_GRACE_SECONDS after their commit (the process that was to run
    them died, or a hook failed): run them here. Each is claimed by moving its mark, so one process runs it."""
    now = timezone.now()
    overdue = now - timedelta(seconds=settings.WORK_SETTLE_GRACE_SECONDS)
    settled = []
    found = WorkItem.objects.filter(hooks_due_at__lt=overdue)
    if environment_id is not None:
        found = found.filter(environment_id=environment_id)
    for work_id in found.values_list("id", flat=True)[:500]:
        claimed = timezone.now()
        if not WorkItem.objects.filter(id=work_id, hooks_due_at__lt=overdue).update(hooks_due_at=claimed):
            continue  # another sweep claimed it, or it was settled meanwhile
        logger.info("work item %s: running the hooks its end left unrun", work_id)
        if _settle(work_id, claimed):
            settled.append(work_id)
    return settled


# -- the session's hands panel: which worker holds its hands, since when


def _hands_attached(item: WorkItem, now: datetime) -> None:
    if item.session_id is None:
        return
    sandbox = Sandbox.objects.create(
        environment_id=item.environment_id,
        session_id=item.session_id,
        name="worker",
        provider=SELF_HOSTED_PROVIDER,
        handle=item.id,
        status=Sandbox.Status.READY,
        labels={"worker_id": item.worker_id, "work_id": item.id},
    )
    emit_event(
        item.session_id,
        events.sandbox_attached(
            sandbox.id, sandbox.name, provider=SELF_HOSTED_PROVIDER, work_id=item.id, worker_id=item.worker_id
        ),
    )


def _hands_released(item: WorkItem, *, status: str, reason: str) -> None:
    sandbox = Sandbox.objects.filter(
        provider=SELF_HOSTED_PROVIDER, handle=item.id, status=Sandbox.Status.READY
    ).first()
    if sandbox is None or item.session_id is None:
        return
    Sandbox.objects.filter(id=sandbox.id).update(status=status)
    worker = {"work_id": item.id, "worker_id": item.worker_id}
    if status == Sandbox.Status.DEAD:
        event = events.sandbox_failed(
            sandbox.name, f"the worker was lost: {reason}", sandbox_id=sandbox.id, **worker
        )
    else:
        event = events.sandbox_terminated(sandbox.id, sandbox.name, reason=reason, **worker)
    emit_event(item.session_id, event)
