"""One thread per process watches every brain it runs: it renews their leases and looks for interrupts.

Each tick asks the database once for all of them (which sessions got a user.interrupt after the seq their
brain's current call began at), so a worker running many sessions polls at one rate, not one per brain,
and a wake starts no thread and opens no connection of its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Protocol

from django.conf import settings
from django.db import close_old_connections

from harness.lease import Lease, lease_renew
from sessions.selectors import interrupted_sessions

logger = logging.getLogger(__name__)


class Watched(Protocol):
    """What the watcher needs of a brain (`harness.brain.Brain`)."""

    lease: Lease

    def holds_lease(self) -> bool: ...

    def interrupt_floor(self) -> int | None:
        """The seq after which a user.interrupt stops the current call; None once nothing is to be stopped."""
        ...

    def interrupt(self) -> None: ...

    def lose_lease(self) -> None: ...


class Watcher:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self._renew_at: dict[Watched, float] = {}  # each brain's next renewal
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="brain-watcher", daemon=True)
        self._thread.start()

    def add(self, brain: Watched) -> None:
        with self._lock:
            self._renew_at[brain] = time.monotonic() + settings.LEASE_SECONDS / 3

    def remove(self, brain: Watched) -> None:
        with self._lock:
            self._renew_at.pop(brain, None)

    def alive(self) -> bool:
        return self.pid == os.getpid() and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            time.sleep(settings.INTERRUPT_POLL_SECONDS)
            now = time.monotonic()
            with self._lock:
                brains = list(self._renew_at)
                due = [brain for brain, at in self._renew_at.items() if now >= at]
                for brain in due:
                    self._renew_at[brain] = now + settings.LEASE_SECONDS / 3
            if not brains:
                close_old_connections()
                continue
            try:
                self._tick(brains, due)
            except Exception:  # noqa: BLE001 - one bad tick must not stop the watching; leases lapse if it lasts
                logger.exception("the brain watcher's tick failed")
                close_old_connections()

    def _tick(self, brains: list[Watched], due: list[Watched]) -> None:
        for brain in due:
            if brain.holds_lease() and not lease_renew(brain.lease, seconds=settings.LEASE_SECONDS):
                brain.lose_lease()
        floors = {brain: floor for brain in brains if (floor := brain.interrupt_floor()) is not None}
        if not floors:
            return
        interrupted = interrupted_sessions(
            [(brain.lease.session_id, floor) for brain, floor in floors.items()]
        )
        for brain in floors:
            if brain.lease.session_id in interrupted:
                brain.interrupt()


_lock = threading.Lock()
_instance: Watcher | None = None


def watcher() -> Watcher:
    """The process's watcher, started anew in a forked child (a thread does not survive the fork)."""
    global _instance
    if _instance is None or not _instance.alive():
        with _lock:
            if _instance is None or not _instance.alive():
                _instance = Watcher()
    return _instance
