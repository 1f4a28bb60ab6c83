"""The worker's main process keeps an eye on its pool processes, so a dead brain is noticed at once.

Celery's prefork pool learns that a pool process died from the process's sentinel pipe, then reaps it and fails
its task (`WakeRequest.on_failure` frees the dead brain's leases, and the wake is requeued). The pipe can reach
its end before the kernel has made the process reapable: the pool then finds nothing exited, stops watching that
pipe, and notices the death only at its next periodic look, up to 5 s later (seen in bench/harness: SIGKILL to
the pool noticing it, 0.02 s to 4.2 s). A thread here looks at the pool's processes every POOL_WATCH_SECONDS
and, when one is gone, asks the worker's event loop to look at the pool now (`hub.call_soon` is thread-safe and
wakes the loop); everything else stays in the loop's own thread, as Celery does it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings

from harness.lease import process_gone

logger = logging.getLogger(__name__)


def watch_pool(consumer: Any) -> threading.Thread | None:
    """Start the watcher for a prefork worker's pool (`consumer` as `worker_ready` sends it); None for pools
    with no processes of their own to die (solo, threads) or no event loop to hand the look to."""
    pool, hub = getattr(consumer, "pool", None), getattr(consumer, "hub", None)
    maintain = getattr(pool, "maintain_pool", None)
    if hub is None or maintain is None or getattr(getattr(pool, "_pool", None), "_pool", None) is None:
        return None
    every = settings.POOL_WATCH_SECONDS
    watcher = threading.Thread(
        target=_watch, args=(pool, hub, maintain, every), name="pool-watch", daemon=True
    )
    watcher.start()
    logger.info("watching the pool's processes every %g s (%s now)", every, len(_pids(pool)))
    return watcher


def _watch(pool: Any, hub: Any, maintain: Any, every: float) -> None:
    reported: set[int] = set()
    while True:
        time.sleep(every)
        try:
            gone = {pid for pid in _pids(pool) if process_gone(pid)}
        except Exception:  # noqa: BLE001 - the pool's own periodic look stays the way back
            logger.exception("cannot look at the pool's processes; a dead one is noticed later")
            continue
        if gone - reported:
            hub.call_soon(maintain)
        reported = gone


def _pids(pool: Any) -> list[int]:
    """The pool's processes, read as `celery inspect stats` reads them, without the rest of its report."""
    processes = getattr(getattr(pool, "_pool", None), "_pool", None)
    return [process.pid for process in list(processes or []) if process.pid]
