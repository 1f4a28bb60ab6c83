"""A brain: the harness working one session while it holds the lease.

`run_brain(session_id)` takes the lease, folds the log, and asks the session's harness for steps until
it has none, then releases the lease at idle. Everything it knows comes from the log; everything it does
is written back with its epoch, so a crash at any point leaves a log the next brain can continue.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

from harness.fold import SessionState, fold
from harness.harnesses import harness_for, pending
from harness.lease import Lease, lease_acquire, lease_release, lease_renew
from harness.model import Cancelled
from sessions.models import Event
from sessions.selectors import events_after, get_events
from sessions.services import StaleEpoch, emit_events

logger = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another brain holds the session now: stop at once and never retry the write."""


class _KnownLogs:
    """The logs this process's brains have read, kept between wakes so a wake reads only what is new.

    The log is append-only and each seq is written once, so a prefix read earlier stays true: the next
    brain on the session takes the prefix with its fold and reads the events after it. A brain takes its
    session's entry out while it works, so two brains in one process never share one. Bounded by events.
    """

    def __init__(self, max_events: int = 50_000):
        self.max_events = max_events
        self._logs: OrderedDict[str, tuple[list[Event], SessionState]] = OrderedDict()
        self._lock = threading.Lock()

    def pop(self, session_id: str) -> tuple[list[Event], SessionState] | None:
        """The session's known log and its fold, taken out (None if this process has not read it)."""
        with self._lock:
            return self._logs.pop(session_id, None)

    @staticmethod
    def extend(
        known: tuple[list[Event], SessionState] | None, new: list[Event]
    ) -> tuple[list[Event], SessionState]:
        """A known log (or none) continued by the events that follow it."""
        if known is None:
            return new, fold(new)
        events, state = known
        events.extend(new)
        fold(new, state)
        return events, state

    def keep(self, session_id: str, events: list[Event], state: SessionState) -> None:
        if len(events) > self.max_events:
            return
        with self._lock:
            self._logs[session_id] = (events, state)
            total = sum(len(e) for e, _ in self._logs.values())
            while total > self.max_events:
                _, (dropped, _) = self._logs.popitem(last=False)
                total -= len(dropped)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._logs.pop(session_id, None)


known_logs = _KnownLogs()


class Brain:
    def __init__(self, lease: Lease, log: tuple[list[Event], SessionState]):
        """`log`: the session's events and their fold (the known prefix and what came with the lease)."""
        self.lease = lease
        self.session_id = lease.session_id
        self.events, self.state = log
        self.provisioning: str | None = None  # the environment's lazy/eager mode, set by harness_for
        self.interrupted = threading.Event()
        self.lost = threading.Event()
        self._cancel_hook: Callable[[], None] | None = None
        self._cancel_floor = self.state.last_seq
        self._renew_at = time.monotonic() + settings.LEASE_SECONDS / 3
        _watcher().add(self)

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    # -- writing

    def emit(self, event: dict[str, Any], *, key: str | None = None) -> Event:
        return self.emit_many([(event, key)])[0]

    def emit_many(self, items: list[tuple[dict[str, Any], str | None]]) -> list[Event]:
        """Append events in one transaction: all of them or none."""
        if self.lost.is_set():
            raise LeaseLost()
        try:
            written = emit_events(self.session_id, items, epoch=self.epoch)
        except StaleEpoch as stale:
            self.lost.set()
            raise LeaseLost() from stale
        new = [event for event in written if event.seq > self.state.last_seq]
        if new and new[0].seq == self.state.last_seq + 1:
            self.events.extend(new)
            fold(new, self.state)
        else:
            self.refresh()  # someone else appended in between: read it all in order
        return written

    def refresh(self) -> None:
        """Fold in whatever was appended since (by users, or by services on the brain's behalf)."""
        new = events_after(self.session_id, self.state.last_seq, limit=None)
        self.events.extend(new)
        fold(new, self.state)

    # -- interrupts and the lease, watched by the process's watcher thread

    def begin_cancellable(self, hook: Callable[[], None] | None = None) -> None:
        self.interrupted.clear()
        self._cancel_floor = self.state.last_seq
        self._cancel_hook = hook

    def set_cancel_hook(self, hook: Callable[[], None] | None) -> None:
        self._cancel_hook = hook
        if hook is not None and self.interrupted.is_set():
            hook()

    def cancelled(self) -> bool:
        return self.interrupted.is_set() or self.lost.is_set()

    def _fire(self) -> None:
        hook = self._cancel_hook
        if hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - closing an aborted stream may raise; the call sees Cancelled
                logger.debug("cancel hook raised", exc_info=True)

    def close(self) -> None:
        _watcher().remove(self)


class _Watcher:
    """One thread per process watches every brain it runs: it renews their leases and looks for interrupts.

    Each tick asks the database once for all of them (which sessions got a user.interrupt after the seq
    their brain's current call began at), so a worker running many sessions polls at one rate, not one per
    brain, and a wake starts no thread and opens no connection of its own.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._brains: set[Brain] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="brain-watcher", daemon=True)
        self._thread.start()

    def add(self, brain: Brain) -> None:
        with self._lock:
            self._brains.add(brain)

    def remove(self, brain: Brain) -> None:
        with self._lock:
            self._brains.discard(brain)

    def alive(self) -> bool:
        return self.pid == os.getpid() and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            time.sleep(settings.INTERRUPT_POLL_SECONDS)
            with self._lock:
                brains = list(self._brains)
            if not brains:
                close_old_connections()
                continue
            try:
                self._tick(brains)
            except Exception:  # noqa: BLE001 - one bad tick must not stop the watching; leases lapse if it lasts
                logger.exception("the brain watcher's tick failed")
                close_old_connections()

    def _tick(self, brains: list[Brain]) -> None:
        now = time.monotonic()
        for brain in brains:
            if now >= brain._renew_at and not brain.lost.is_set():
                brain._renew_at = now + settings.LEASE_SECONDS / 3
                if not lease_renew(brain.lease, seconds=settings.LEASE_SECONDS):
                    brain.lost.set()
                    brain._fire()
        asking = [brain for brain in brains if not brain.interrupted.is_set() and not brain.lost.is_set()]
        if not asking:
            return
        for session_id in _interrupted(asking):
            for brain in asking:
                if brain.session_id == session_id:
                    brain.interrupted.set()
                    brain._fire()


def _interrupted(brains: list[Brain]) -> set[str]:
    """The sessions among these brains' that got a user.interrupt after their current call began."""
    floors = ", ".join(["(CAST(%s AS TEXT), CAST(%s AS BIGINT))"] * len(brains))
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH floors(session_id, seq) AS (VALUES {floors}) "
            f"SELECT DISTINCT e.session_id FROM {Event._meta.db_table} e JOIN floors f "
            "ON e.session_id = f.session_id AND e.seq > f.seq WHERE e.type = 'user.interrupt'",
            [value for brain in brains for value in (brain.session_id, brain._cancel_floor)],
        )
        return {row[0] for row in cursor.fetchall()}


_watcher_lock = threading.Lock()
_watcher_instance: _Watcher | None = None


def _watcher() -> _Watcher:
    global _watcher_instance
    if _watcher_instance is None or not _watcher_instance.alive():
        with _watcher_lock:
            if _watcher_instance is None or not _watcher_instance.alive():
                _watcher_instance = _Watcher()
    return _watcher_instance


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_brain(session_id: str, *, by: str = "event") -> str:
    """Work the session until it has nothing to do. Returns what happened, for logs and tests."""
    for _ in range(5):
        # The lease brings what the log holds beyond the prefix this process knows (one round trip).
        known = known_logs.pop(session_id)
        lease = lease_acquire(
            session_id,
            owner=worker_name(),
            seconds=settings.LEASE_SECONDS,
            read_after=-1 if known is None else known[1].last_seq,
        )
        if lease is None:
            if known is not None:
                known_logs.keep(session_id, *known)
            return "busy"  # another brain holds it; it re-checks for work after it releases
        brain: Brain | None = None
        clean = False
        try:
            if lease.attempts > settings.WAKE_CRASH_LIMIT:
                brain = park(lease, known)
            else:
                # Folding the log is part of the wake: a log that cannot be folded is a crash like any other.
                brain = Brain(lease, known_logs.extend(known, lease.events))
                if lease.attempts > 1:
                    brain.emit(
                        {
                            "type": "brain.recovered",
                            "woken_by": by,
                            "epoch": lease.epoch,
                            "unfinished_wakes": lease.attempts - 1,
                        }
                    )
                harness = harness_for(brain)
                while (step := harness.next_step(brain.state, brain)) is not None:
                    # A Cancelled step leaves the interrupt in the log; the harness handles it next.
                    with contextlib.suppress(Cancelled):
                        step.run(brain)
                    brain.refresh()  # what users (or services on the brain's behalf) appended meanwhile
            clean = True
        except LeaseLost:
            return "lease lost"
        finally:
            if brain is not None:
                brain.close()
            lease_release(lease, clean=clean)
        if brain is None:
            return "parked"  # with a log no brain can fold: there is nothing to go on with
        # Work that arrived while the lease was held found it busy: look once more now that it is free.
        brain.refresh()
        known_logs.keep(session_id, brain.events, brain.state)
        if not pending(brain.state):
            return "idle"
    return "idle"


def has_pending_work(session_id: str) -> bool:
    """Whether the log shows work (the sweeper asks). A log that cannot be folded counts as work: the wake
    it brings fails, and the crash limit then parks the session rather than leaving it running."""
    events = get_events(session_id)
    try:
        return pending(fold(events))
    except Exception:  # noqa: BLE001 - whatever the fold trips on, it is the brain's to count
        logger.exception("the log of session %s cannot be folded", session_id)
        return True


def park(lease: Lease, known: tuple[list[Event], SessionState] | None) -> Brain | None:
    """Too many wakes in a row died: stop looping and tell the user, leaving the session idle.

    What kills the wakes may be in the log itself: a log that cannot be folded is parked as it stands, without
    closing the request or calls it may hold open, and there is then no brain to go on with (None).
    """
    limit = settings.WAKE_CRASH_LIMIT
    error = {
        "type": "session.error",
        "error": {
            "type": "unknown_error",
            "retry_status": {"type": "terminal"},
            "message": f"The brain working this session stopped unexpectedly {limit} times in a row; the session is "
            "parked. Send a new message to try again.",
        },
    }
    parked = {"type": "brain.parked", "attempts": lease.attempts - 1}
    idle = {"type": "session.status_idle", "stop_reason": {"type": "retries_exhausted"}}
    try:
        brain = Brain(lease, known_logs.extend(known, lease.events))
    except Exception:  # noqa: BLE001 - the fold's failure is what parking is for
        logger.exception(
            "the log of session %s cannot be folded; it is parked as it stands", lease.session_id
        )
        try:
            emit_events(lease.session_id, [(error, None), (parked, None), (idle, None)], epoch=lease.epoch)
        except StaleEpoch as stale:
            raise LeaseLost() from stale
        return None
    if brain.state.open_request is not None:
        start = brain.state.open_request
        brain.emit(
            {
                "type": "span.model_request_end",
                "model_request_start_id": start.uid,
                "is_error": True,
                "model_usage": {},
                "error": "the worker stopped during this request",
            },
            key=f"{start.uid}:end",
        )
    for call in brain.state.unanswered:
        if not call.custom:
            brain.emit(
                {
                    "type": "agent.tool_result",
                    "tool_use_id": call.id,
                    "is_error": True,
                    "content": [
                        {
                            "type": "text",
                            "text": "The session was parked after repeated worker crashes; this call's effect "
                            "is unverified.",
                        }
                    ],
                },
                key=f"{call.id}:result",
            )
    brain.emit(error)
    brain.emit(parked)
    brain.emit({**idle, "through_seq": brain.state.last_seq})
    return brain
