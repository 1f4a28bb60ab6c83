"""A brain: the harness working one session while it holds the lease.

`run_brain(session_id)` takes the lease, folds the log, and asks the session's harness for steps until
it has none, then releases the lease at idle. Everything it knows comes from the log; everything it does
is written back with its epoch, so a crash at any point leaves a log the next brain can continue.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from enum import StrEnum
from functools import cached_property
from types import TracebackType
from typing import Any, Self

from django.conf import settings

from harness.cache import Log, known_logs
from harness.fold import fold
from harness.harnesses import harness_for, pending
from harness.harnesses.steps import AwaitAction, CloseCall, RecordRecovery, Recover, parked_notice
from harness.lease import Lease, lease_acquire, lease_held, owner_name
from harness.model import Cancelled
from harness.speculation import Ahead, speculating
from harness.tools import runs_on_worker
from harness.watcher import watcher
from sandboxes.provisioning import provisioning_mode, speculation_policy
from sessions import events
from sessions.models import Event
from sessions.selectors import events_after, get_events
from sessions.services import StaleEpoch, emit_events

logger = logging.getLogger(__name__)

AHEAD_WATCH_SECONDS = 0.05  # how often a brain waiting for its provisioning ahead reads the log for new work


class Outcome(StrEnum):
    """How a wake ended, as logs and Celery results read it."""

    IDLE = "idle"  # the log shows nothing left to do (a parked session included)
    BUSY = "busy"  # another brain holds the lease; it looks for work again once it releases
    LEASE_LOST = "lease lost"  # another brain took the lease over: this one stopped writing at once
    PARKED = "parked"  # a log no brain can fold, parked as it stands: there is nothing to go on with
    GONE = "gone"  # the session is deleted, archived or terminated (the wake task tells it from busy)


class LeaseLost(Exception):
    """Another brain holds the session now: stop at once and never retry the write."""


def run_brain(
    session_id: str, *, by: str = "event", rounds: int = 5, only: tuple[type, ...] | None = None
) -> Outcome:
    """Work the session until it has nothing to do. Returns what happened, for logs and tests.

    Parking and recovery are steps the harness chooses (`harness_for`, `ToolUseHarness.next_step`). Work that
    arrived while the lease was held found it busy; once it is free the log is read again, and if it shows
    work the lease is taken again, `rounds` times in all at most; while a provisioning ahead still runs, the
    brain keeps the lease and takes new work at once (`Brain.work_while_hands_start`). With `only`, the steps
    of those types alone are taken: the first of another type ends the run, and the lease is released for a
    brain worker."""
    taken = _take_lease(session_id)
    if taken is None:
        return Outcome.BUSY
    lease, known = taken
    try:
        with lease_held(lease):  # released at the end; a crash (an exception) counts toward parking
            log = _fold_or_park(lease, known)
            if log is None:
                return Outcome.PARKED
            with Brain(lease, log, woken_by=by) as brain:  # the process's watcher renews its lease meanwhile
                harness = harness_for(brain)
                while (step := harness.next_step(brain.state, brain)) is not None or (
                    only is None and brain.work_while_hands_start()
                ):
                    if step is None:
                        continue  # work came while the provisioning ahead ran: the harness reads it
                    if only is not None and not isinstance(step, only):
                        break
                    # A Cancelled step leaves the interrupt in the log; the harness handles it next.
                    with contextlib.suppress(Cancelled):
                        step.run(brain)
                    brain.refresh()  # what users (or services on the brain's behalf) appended meanwhile
    except LeaseLost:
        return Outcome.LEASE_LOST
    brain.refresh()
    known_logs.keep(session_id, brain.log)
    if only is None and pending(brain.state) and rounds > 1:
        return run_brain(session_id, by=by, rounds=rounds - 1)
    return Outcome.IDLE


# The steps that only write to the log: no model call, no tool run, no sandbox.
WRITING_STEPS = (RecordRecovery, Recover, CloseCall, AwaitAction)


def settle(session_id: str, *, by: str) -> Outcome:
    """Take the session's next steps now, in this process, while they only write to the log (`WRITING_STEPS`).

    For a self-hosted worker that left (lost, or its item stopped): the calls it may have half-run are closed
    as unverified, and the others listed for the next worker, before that worker reads the log, so it does
    not run them again. A step that needs a brain worker (a model call) is left to one: wake it after."""
    return run_brain(session_id, by=by, only=WRITING_STEPS)


class Brain:
    """A harness working one session under its lease: what steps read (the log and its fold) and write through
    (`emit`, with the epoch), and how their calls are cancelled. The process's watcher watches it while the
    `with` block lasts."""

    def __init__(self, lease: Lease, log: Log, *, woken_by: str = "event"):
        """`log`: the session's events and their fold (the known prefix and what came with the lease)."""
        self.lease = lease
        self.session_id = lease.session_id
        self.woken_by = woken_by
        self.events, self.state = log
        self.interrupted = threading.Event()
        self.lost = threading.Event()
        self._cancel_hook: Callable[[], None] | None = None
        self._cancel_floor = self.state.last_seq
        self._ahead: Ahead | None = None

    def __enter__(self) -> Self:
        watcher().add(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self.wait_for_hands()  # under the lease, which the watcher renews meanwhile
        finally:
            watcher().remove(self)

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def log(self) -> Log:
        return Log(self.events, self.state)

    @cached_property
    def self_hosted(self) -> bool:
        """The environment's self-hosted worker runs the toolset's calls, on its machine: the platform
        provisions no sandbox for the session, and waits for the worker's results."""
        return runs_on_worker(self.lease.environment)

    @cached_property
    def provisioning(self) -> str:
        """The environment's lazy or eager ("coupled") provisioning of the session's first sandbox."""
        return provisioning_mode(self.lease.environment)

    # -- the hands

    def provision_ahead(self, *, toolset: bool) -> None:
        """Start the session's sandbox while the model thinks, once a wake, if the turn will likely need it
        (harness/speculation.py)."""
        policy = speculation_policy(self.lease.environment)
        if (
            self._ahead is None
            and not self.self_hosted
            and speculating(policy, toolset=toolset, lazy=self.provisioning == "lazy")
        ):
            self._ahead = Ahead(self.session_id, epoch=self.epoch, always=policy == "always")

    def model_answered(self) -> None:
        """The model answered the turn's request: a provisioning ahead waiting for that begins."""
        if self._ahead is not None:
            self._ahead.answered()

    def wait_for_hands(self) -> None:
        """Before a sandbox is used, provisioned or released: the provisioning ahead, if any, has ended."""
        if self._ahead is not None:
            self._ahead.wait()

    def work_while_hands_start(self) -> bool:
        """Once the harness has nothing to do: wait for the provisioning ahead, if any is still running, while
        reading the log for new work (a user's next message); True as soon as some came, so the brain takes it
        with the provisioning still going beside it; False once the provisioning ended (or the lease is lost)
        with none."""
        ahead = self._ahead
        while ahead is not None and ahead.running() and not self.lost.is_set():
            ahead.wait(timeout=AHEAD_WATCH_SECONDS)
            self.refresh()
            if pending(self.state):
                return True
        return False

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

    # -- the current call's cancelling, by a user.interrupt or the lease's loss

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

    # -- what the process's watcher (harness.watcher) asks and tells

    def holds_lease(self) -> bool:
        return not self.lost.is_set()

    def interrupt_floor(self) -> int | None:
        """The seq after which a user.interrupt stops the current call; None once it is stopped."""
        return None if self.cancelled() else self._cancel_floor

    def interrupt(self) -> None:
        self.interrupted.set()
        self._fire()

    def lose_lease(self) -> None:
        self.lost.set()
        self._fire()

    def _fire(self) -> None:
        hook = self._cancel_hook
        if hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - closing an aborted stream may raise; the call sees Cancelled
                logger.debug("cancel hook raised", exc_info=True)


def _take_lease(session_id: str) -> tuple[Lease, Log | None] | None:
    """The lease and the log this process knows, with the lease bringing the rest (one round trip)."""
    known = known_logs.pop(session_id)
    lease = lease_acquire(
        session_id,
        owner=owner_name(),
        seconds=settings.LEASE_SECONDS,
        read_after=-1 if known is None else known.state.last_seq,
    )
    if lease is None:
        if known is not None:
            known_logs.keep(session_id, known)
        return None
    return lease, known


def _fold_or_park(lease: Lease, known: Log | None) -> Log | None:
    """The log folded, the known prefix continued by what came with the lease. A log the fold trips on is a
    crash like any other until the crash limit; then it is parked as it stands, without closing the request or
    calls it may hold open, and there is no brain to go on with (None)."""
    try:
        return known_logs.extend(known, lease.events)
    except Exception:
        if lease.step_attempts <= settings.WAKE_CRASH_LIMIT:
            raise
        logger.exception(
            "the log of session %s cannot be folded; it is parked as it stands", lease.session_id
        )
    notice = [*parked_notice(unfinished_wakes=lease.attempts - 1), events.status_idle("retries_exhausted")]
    try:
        emit_events(lease.session_id, [(event, None) for event in notice], epoch=lease.epoch)
    except StaleEpoch as stale:
        raise LeaseLost() from stale
    return None


def has_pending_work(session_id: str) -> bool:
    """Whether the log shows work (the sweeper asks). A log that cannot be folded counts as work: the wake
    it brings fails, and the crash limit then parks the session rather than leaving it running."""
    log = get_events(session_id)
    try:
        return pending(fold(log))
    except Exception:  # noqa: BLE001 - whatever the fold trips on, it is the brain's to count
        logger.exception("the log of session %s cannot be folded", session_id)
        return True
