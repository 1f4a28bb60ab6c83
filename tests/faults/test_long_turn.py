"""A turn longer than any task time limit a deployment sets: the brain's lease is its heartbeat, not a clock.

Before, the wake task took hard and soft limits from CELERY_TASK_TIME_LIMIT / CELERY_TASK_SOFT_TIME_LIMIT, and
Celery sends a task's limits with its message: in a deployment whose processes all had them set, a model call
that outlived them was cut off (the soft limit raised in the stream, the hard one killed the pool process),
counted as a crash, and, every retry making the same call, the session was parked after WAKE_CRASH_LIMIT. Here
the message is sent, and the turn run, by processes started with such settings (2 s hard, 1 s soft), and a
5 s model answer goes through in one wake.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.faults.conftest import Cluster, check_log, describe, log_of, new_session, settled, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

MODEL_SECONDS = 5.0
OLD_LIMITS = {"CELERY_TASK_TIME_LIMIT": "2", "CELERY_TASK_SOFT_TIME_LIMIT": "1"}

SEND = """
import sys, django
django.setup()
from harness.services.lifecycle import session_send_events
session_send_events(sys.argv[1], events=[{"type": "user.message", "content": [{"type": "text", "text": sys.argv[2]}]}])
"""


def test_a_turn_longer_than_the_old_task_limits_finishes_in_one_wake(cluster: Cluster) -> None:
    (worker,) = cluster.start_workers(1, **OLD_LIMITS)
    session_id = new_session()
    pool_pids = worker.pool_pids()
    # As the web process of such a deployment would: append the message and queue its wake, with its settings.
    subprocess.run(
        [sys.executable, "-c", SEND, session_id, f"/sleep {MODEL_SECONDS:g}"],
        cwd=ROOT,
        env={**cluster.env, **OLD_LIMITS},
        check=True,
        timeout=60,
    )
    cluster.start_beat()

    wait_for(
        lambda: settled(session_id),
        timeout=MODEL_SECONDS + 30,
        what=f"session {session_id} to finish its {MODEL_SECONDS:g} s turn",
        on_timeout=lambda: describe(log_of(session_id)) + "\n" + cluster.diagnostics(),
    )
    events = check_log(session_id)
    shown = describe(events)
    kinds = [e.type for e in events]
    assert "session.status_terminated" not in kinds and "retries_exhausted" not in shown, shown
    assert kinds.count("span.model_request_start") == 1, f"the model call was made more than once:\n{shown}"
    assert "brain.recovered" not in kinds, f"the turn was cut off and resumed:\n{shown}"
    assert kinds.count("agent.message") == 1, shown
    assert len({e.lease_epoch for e in events if e.lease_epoch is not None}) == 1, (
        f"more than one wake wrote the turn:\n{shown}"
    )
    assert worker.pool_pids() == pool_pids, "the pool process running the turn was killed and replaced"
    log = worker.log()
    assert "TimeLimitExceeded" not in log and "Hard time limit" not in log, log[-3000:]
