"""The logs this process's brains have read, kept between wakes so that a wake reads only what is new.

The log is append-only and each seq is written once, so a prefix read earlier stays true: the next brain
on the session takes the prefix with its fold and reads the events after it (with its lease). A brain
takes its session's entry out while it works, so two brains in one process never share one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from harness.fold import SessionState, fold
from sessions.models import Event


class Log(NamedTuple):
    """A session's events from seq 0, and their fold."""

    events: list[Event]
    state: SessionState


class KnownLogs:
    """Bounded by events in all: the least recently kept logs go first."""

    def __init__(self, max_events: int = 50_000):
        self.max_events = max_events
        self._logs: OrderedDict[str, Log] = OrderedDict()
        self._lock = threading.Lock()

    def pop(self, session_id: str) -> Log | None:
        """The session's known log, taken out (None if this process has not read it)."""
        with self._lock:
            return self._logs.pop(session_id, None)

    @staticmethod
    def extend(known: Log | None, new: list[Event]) -> Log:
        """A known log (or none) continued by the events that follow it."""
        if known is None:
            return Log(new, fold(new))
        known.events.extend(new)
        fold(new, known.state)
        return known

    def keep(self, session_id: str, log: Log) -> None:
        if len(log.events) > self.max_events:
            return
        with self._lock:
            self._logs[session_id] = log
            total = sum(len(kept.events) for kept in self._logs.values())
            while total > self.max_events:
                _, dropped = self._logs.popitem(last=False)
                total -= len(dropped.events)


known_logs = KnownLogs()
