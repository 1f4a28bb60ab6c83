"""The workbench Celery app as the fault tests run it: unchanged, plus two test-only hooks in each pool process.

    celery -A tests.faults.workerapp worker …

- ``WORKBENCH_FAULT_PAUSE=after:<event type>`` (or ``before:<event type>``): the pool process stops itself
  with SIGSTOP right after its brain commits an event of that type (or right before it writes one), the
  first time only. The process is frozen between two instructions of the brain, so the test can SIGKILL
  the whole worker, or resume it, at exactly that point of the turn rather than at one a timer picked.
- Every write refused to a brain is logged with its cause (``fault-hook: write refused …``), so a test
  can tell a write the database refused (StaleEpoch) from a brain whose watcher saw the lease go first.

Nothing else changes: the tasks, settings and the brain are the product's own.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from celery.signals import worker_process_init

from workbench.celery import app

logger = logging.getLogger("tests.faults.workerapp")

__all__ = ["app"]


@worker_process_init.connect
def _install_hooks(**_: Any) -> None:
    from harness.brain import Brain, LeaseLost
    from sessions.models import Event

    when, _, kind = os.environ.get("WORKBENCH_FAULT_PAUSE", "").partition(":")
    original = Brain.emit_many
    paused = False

    def pause(brain: Brain, where: str) -> None:
        nonlocal paused
        paused = True
        logger.warning(
            "fault-hook: pausing pid %s %s %s in %s at epoch %s",
            os.getpid(),
            where,
            kind,
            brain.session_id,
            brain.epoch,
        )
        os.kill(os.getpid(), signal.SIGSTOP)

    def emit_many(self: Brain, items: list[tuple[dict[str, Any], str | None]]) -> list[Event]:
        if when == "before" and not paused and any(event["type"] == kind for event, _ in items):
            pause(self, "before")
        try:
            written = original(self, items)
        except LeaseLost as lost:
            cause = type(lost.__cause__).__name__ if lost.__cause__ is not None else "lease watcher"
            logger.warning(
                "fault-hook: write refused at epoch %s of %s (%s): %s",
                self.epoch,
                self.session_id,
                cause,
                [event["type"] for event, _ in items],
            )
            raise
        if when == "after" and not paused and any(event.type == kind for event in written):
            pause(self, "after")
        return written

    Brain.emit_many = emit_many  # type: ignore[method-assign]
