"""A brain whose death its worker knows resumes at once, not after its lease (here 60 s) lapses.

Two ways a worker knows: its main process sees the pool process running a wake die (WakeRequest frees that
process's leases before Celery requeues the wake), and a worker starting on this host finds leases held by
processes that are gone (a supervisor restarting a worker killed whole). No beat runs here, and the lease
outlives the test's timeouts: only those paths can bring the session back in time. A worker whose death
nobody sees (a vanished machine) is the lease's and the sweeper's: tests/faults/test_kill.py.
"""

from __future__ import annotations

import os
import signal

import pytest

from sessions.models import Event, Session
from tests.faults.conftest import (
    Cluster,
    check_log,
    describe,
    log_of,
    new_session,
    settled,
    wait_for,
)

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LONG_LEASE = {"LEASE_SECONDS": "60"}
ONE_MACHINE = {"LEASE_HOST": "machine-a"}  # workers that see one another's processes
RESUME_TIMEOUT = 30.0  # well inside the 60 s lease: a resume in time was not the lease lapsing


def held_while_waiting_on_the_model(cluster: Cluster, session_id: str) -> Session:
    def waiting() -> Session | None:
        events = log_of(session_id)
        session = Session.objects.get(id=session_id)
        if events and events[-1].type == "span.model_request_start" and session.lease_owner:
            return session
        return None

    session = wait_for(
        waiting,
        timeout=RESUME_TIMEOUT,
        what="a brain waiting on the model",
        on_timeout=lambda: describe(log_of(session_id)) + "\n" + cluster.diagnostics(),
    )
    assert isinstance(session, Session)
    return session


def resumed(cluster: Cluster, session_id: str, killed: Session) -> Event:
    """The resumed turn's first event, which must come before the dead brain's lease would have lapsed."""
    wait_for(
        lambda: settled(session_id),
        timeout=RESUME_TIMEOUT,
        what=f"session {session_id} to resume and finish",
        on_timeout=lambda: describe(log_of(session_id)) + "\n" + cluster.diagnostics(),
    )
    events = check_log(session_id)
    first = next(e for e in events if e.lease_epoch is not None and e.lease_epoch > killed.lease_epoch)
    assert first.type == "brain.recovered", describe(events)
    assert first.processed_at < killed.lease_expires_at, (
        f"resumed at {first.processed_at}, after the lease lapsed at {killed.lease_expires_at}"
    )
    return first


def test_a_killed_pool_process_has_its_leases_freed_and_its_wake_requeued_at_once(cluster: Cluster) -> None:
    """Twice in the same worker: the second time its main process uses the database again after forking the
    pool process that replaced the first, which inherited (and, starting, closed) the main process's pool of
    connections until harness.tasks closed it after each use."""
    (worker,) = cluster.start_workers(1, **LONG_LEASE)
    for _ in range(2):
        cluster.model.set_latency(ttft_ms=60_000)
        session_id = new_session("hello")
        killed = held_while_waiting_on_the_model(cluster, session_id)
        (pool_pid,) = worker.pool_pids()
        assert killed.lease_owner.endswith(f":{pool_pid}")
        cluster.model.set_latency(ttft_ms=0)
        os.kill(pool_pid, signal.SIGKILL)  # the pool process alone: the main process sees it die

        recovered = resumed(cluster, session_id, killed)
        assert recovered.payload["woken_by"] == "event", "the requeued wake, not a second one"
        freed = f"freed the leases of pool process {pool_pid}: {session_id}"
        assert freed in worker.log(), worker.log()[-3000:]
        assert worker.alive
        wait_for(
            lambda: len(worker.pool_pids()) == 1, timeout=RESUME_TIMEOUT, what="the pool process's successor"
        )


def test_a_worker_starting_frees_the_leases_of_a_worker_killed_whole_and_wakes_their_sessions(
    cluster: Cluster,
) -> None:
    (victim,) = cluster.start_workers(1, **LONG_LEASE, **ONE_MACHINE)
    cluster.model.set_latency(ttft_ms=60_000)
    session_id = new_session("hello")
    killed = held_while_waiting_on_the_model(cluster, session_id)
    # Two leases the starting worker must leave alone: a live process of this host's, another host's.
    live, elsewhere = new_session(), new_session()
    Session.objects.filter(id=live).update(
        lease_owner=f"{ONE_MACHINE['LEASE_HOST']}:{os.getpid()}", lease_expires_at=killed.lease_expires_at
    )
    Session.objects.filter(id=elsewhere).update(
        lease_owner="another-host:1", lease_expires_at=killed.lease_expires_at
    )
    cluster.model.set_latency(ttft_ms=0)
    victim.kill()  # main process and pool together: nothing requeues the wake

    (replacement,) = cluster.start_workers(1, **LONG_LEASE, **ONE_MACHINE)
    recovered = resumed(cluster, session_id, killed)
    assert recovered.payload["woken_by"] == "worker_lost", describe(log_of(session_id))
    assert f"freed the leases of processes of this host that are gone: {session_id}" in replacement.log()
    leases = dict(Session.objects.filter(id__in=[live, elsewhere]).values_list("id", "lease_owner"))
    assert leases == {live: f"{ONE_MACHINE['LEASE_HOST']}:{os.getpid()}", elsewhere: "another-host:1"}


def test_the_sweeper_frees_the_leases_of_a_worker_killed_whole_when_no_replacement_starts(
    cluster: Cluster,
) -> None:
    """Another worker of this host sees, at its next sweep, that the lease's process is gone: the session
    resumes in about SWEEP_SECONDS, not after the lease (a replacement worker may take seconds, or never come)."""
    cluster.start_workers(2, **LONG_LEASE, **ONE_MACHINE)
    cluster.start_beat()
    cluster.model.set_latency(ttft_ms=60_000)
    session_id = new_session("hello")
    killed = held_while_waiting_on_the_model(cluster, session_id)
    victim = cluster.holder(session_id)
    assert victim is not None
    (survivor,) = [worker for worker in cluster.workers if worker is not victim]
    cluster.model.set_latency(ttft_ms=0)
    victim.kill()

    recovered = resumed(cluster, session_id, killed)
    assert recovered.payload["woken_by"] == "worker_lost", describe(log_of(session_id))
    assert f"freed the leases of processes of this host that are gone: {session_id}" in survivor.log()
