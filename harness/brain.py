"""A brain: the harness working one session while it holds the lease.

`run_brain(session_id)` takes the lease, folds the log, and asks the session's harness for steps until
it has none, then releases the lease at idle. Everything it knows comes from the log; everything it does
is written back with its epoch, so a crash at any point leaves a log the next brain can continue.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from harness.fold import SessionState, fold
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

    def take(self, session_id: str) -> tuple[list[Event], SessionState]:
        with self._lock:
            known = self._logs.pop(session_id, None)
        if known is None:
            events = get_events(session_id)
            return events, fold(events)
        events, state = known
        new = events_after(session_id, state.last_seq, limit=None)
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
    def __init__(self, lease: Lease):
        self.lease = lease
        self.session_id = lease.session_id
        self.events, self.state = known_logs.take(self.session_id)
        self.provisioning: str | None = None  # the environment's lazy/eager mode, set by harness_for
        self.interrupted = threading.Event()
        self.lost = threading.Event()
        self._cancel_hook: Callable[[], None] | None = None
        self._cancel_floor = self.state.last_seq
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"brain-{self.session_id}", daemon=True)
        self._watcher.start()

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

    # -- interrupts and the lease, watched from a thread

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

    def _watch(self) -> None:
        renew_every = settings.LEASE_SECONDS / 3
        since_renew = 0.0
        poll = settings.INTERRUPT_POLL_SECONDS
        try:
            while not self._stop.wait(poll):
                since_renew += poll
                if since_renew >= renew_every:
                    since_renew = 0.0
                    if not lease_renew(self.lease, seconds=settings.LEASE_SECONDS):
                        self.lost.set()
                        self._fire()
                        return
                if not self.interrupted.is_set() and Event.objects.filter(
                        session_id=self.session_id, seq__gt=self._cancel_floor, type="user.interrupt").exists():
                    self.interrupted.set()
                    self._fire()
        except Exception:  # noqa: BLE001 - a watcher failure must not kill the brain; the lease then lapses
            logger.exception("brain watcher for %s failed", self.session_id)
        finally:
            close_old_connections()

    def _fire(self) -> None:
        hook = self._cancel_hook
        if hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - closing an aborted stream may raise; the call sees Cancelled
                logger.debug("cancel hook raised", exc_info=True)

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(2)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_brain(session_id: str, *, by: str = "event") -> str:
    """Work the session until it has nothing to do. Returns what happened, for logs and tests."""
    from harness.harnesses import harness_for, pending

    for _ in range(5):
        lease = lease_acquire(session_id, owner=worker_name(), seconds=settings.LEASE_SECONDS)
        if lease is None:
            return "busy"  # another brain holds it; it re-checks for work after it releases
        brain = Brain(lease)
        clean = False
        try:
            if lease.attempts > settings.WAKE_CRASH_LIMIT:
                park(brain)
            else:
                if lease.attempts > 1:
                    brain.emit({"type": "brain.recovered", "woken_by": by, "epoch": lease.epoch,
                                "unfinished_wakes": lease.attempts - 1})
                harness = harness_for(brain)
                while True:
                    brain.refresh()
                    step = harness.next_step(brain.state, brain)
                    if step is None:
                        break
                    try:
                        step.run(brain)
                    except Cancelled:
                        continue  # the fold now shows the interrupt; the harness handles it next
            clean = True
        except LeaseLost:
            return "lease lost"
        finally:
            brain.close()
            lease_release(lease, clean=clean)
        # Work that arrived while the lease was held found it busy: look once more now that it is free.
        brain.refresh()
        known_logs.keep(session_id, brain.events, brain.state)
        if not pending(brain.state):
            return "idle"
    return "idle"


def has_pending_work(session_id: str) -> bool:
    from harness.harnesses import pending

    return pending(fold(get_events(session_id)))


def park(brain: Brain) -> None:
    """Too many wakes in a row died: stop looping and tell the user, leaving the session idle."""
    limit = settings.WAKE_CRASH_LIMIT
    if brain.state.open_request is not None:
        start = brain.state.open_request
        brain.emit({"type": "span.model_request_end", "model_request_start_id": start.uid, "is_error": True,
                    "model_usage": {}, "error": "the worker stopped during this request"}, key=f"{start.uid}:end")
    for call in brain.state.unanswered:
        if not call.custom:
            brain.emit({"type": "agent.tool_result", "tool_use_id": call.id, "is_error": True, "content": [{
                "type": "text", "text": "The session was parked after repeated worker crashes; this call's effect "
                                        "is unverified."}]}, key=f"{call.id}:result")
    brain.emit({"type": "session.error", "error": {
        "type": "unknown_error", "retry_status": {"type": "terminal"},
        "message": f"The brain working this session stopped unexpectedly {limit} times in a row; the session is "
                   "parked. Send a new message to try again."}})
    brain.emit({"type": "brain.parked", "attempts": brain.lease.attempts - 1})
    brain.emit({"type": "session.status_idle", "stop_reason": {"type": "retries_exhausted"},
                "through_seq": brain.state.last_seq})
