"""A wake's named outcomes, its recovery and parking steps, and the process's watcher."""

from __future__ import annotations

import threading
import time

import pytest
from django.test import override_settings

from harness.brain import Outcome, run_brain
from harness.harnesses.steps import Park, RecordRecovery
from harness.lease import Lease, lease_acquire, lease_release
from harness.watcher import watcher
from sessions import events
from sessions.models import Session
from sessions.selectors import get_events
from sessions.services import emit_event
from tests.conftest import make_session

pytestmark = pytest.mark.django_db(transaction=True)


def message(session_id: str, text: str) -> None:
    emit_event(session_id, {"type": "user.message", "content": events.text_content(text)})


def crash(session_id: str) -> Lease:
    """A wake that took the lease and died holding it: the lease lapses at once, its counter stays."""
    lease = lease_acquire(session_id, owner="dead", seconds=0.001)
    assert lease is not None
    time.sleep(0.01)
    return lease


def test_the_outcomes_read_as_the_strings_logs_and_tests_compare():
    assert [str(outcome) for outcome in Outcome] == ["idle", "busy", "lease lost", "parked", "gone"]
    assert Outcome.LEASE_LOST == "lease lost" and f"{Outcome.BUSY}" == "busy"


def test_a_wake_after_one_that_died_first_records_its_recovery(model_url):
    session_id = make_session()
    message(session_id, "hello")
    crash(session_id)
    outcome = run_brain(session_id, by="sweeper")
    assert outcome is Outcome.IDLE
    log = get_events(session_id)
    [recovered] = [e for e in log if e.type == "brain.recovered"]
    assert recovered.payload == {"woken_by": "sweeper", "epoch": 2, "unfinished_wakes": 1}
    assert recovered.lease_epoch == 2 and recovered.seq == 1  # before anything else the brain wrote
    assert log[-1].type == "session.status_idle" and Session.objects.get(id=session_id).wake_attempts == 0


def test_past_the_crash_limit_the_wake_parks_closing_the_open_request_and_calls(model_url):
    session_id = make_session()
    message(session_id, "hello")
    dead = crash(session_id)
    start = emit_event(session_id, events.model_request_start(through_seq=0), epoch=dead.epoch)
    with override_settings(WAKE_CRASH_LIMIT=1):
        crash(session_id)
        assert run_brain(session_id) is Outcome.IDLE
    log = get_events(session_id)
    end, error, parked, idle = log[-4:]
    assert end.type == "span.model_request_end" and end.payload["model_request_start_id"] == start.uid
    assert end.payload["is_error"] and end.payload["error"] == "the worker stopped during this request"
    assert error.payload["error"]["retry_status"] == {"type": "terminal"}
    assert parked.payload == {"attempts": 2}
    assert idle.payload == {"stop_reason": {"type": "retries_exhausted"}, "through_seq": parked.seq}
    assert not [e for e in log if e.type == "agent.message"]  # the parked wake called no model
    session = Session.objects.get(id=session_id)
    assert session.status == "idle" and session.wake_attempts == 0


def test_the_parking_harness_takes_one_step_and_the_tool_use_harness_recovers_first(model_url):
    from harness.brain import Brain
    from harness.cache import known_logs
    from harness.harnesses import harness_for

    session_id = make_session()
    message(session_id, "hello")
    crash(session_id)
    lease = lease_acquire(session_id, owner="me", seconds=60, read_after=-1)
    assert lease is not None and lease.attempts == 2
    brain = Brain(lease, known_logs.extend(None, lease.events))
    assert isinstance(harness_for(brain).next_step(brain.state, brain), RecordRecovery)
    with override_settings(WAKE_CRASH_LIMIT=1):
        parking = harness_for(brain)
        assert isinstance(parking.next_step(brain.state, brain), Park)
        Park().run(brain)
        assert parking.next_step(brain.state, brain) is None
    lease_release(lease)


class FakeBrain:
    """What the watcher sees of a brain, recording what it was told."""

    def __init__(self, lease: Lease, floor: int):
        self.lease, self.floor = lease, floor
        self.told: list[str] = []
        self.done = threading.Event()

    def holds_lease(self) -> bool:
        return "lose_lease" not in self.told

    def interrupt_floor(self) -> int | None:
        return None if self.told else self.floor

    def interrupt(self) -> None:
        self.told.append("interrupt")
        self.done.set()

    def lose_lease(self) -> None:
        self.told.append("lose_lease")
        self.done.set()


def test_the_watcher_tells_a_brain_of_an_interrupt_after_its_floor_and_of_a_lost_lease():
    session_id = make_session()
    message(session_id, "hello")
    lease = lease_acquire(session_id, owner="me", seconds=60)
    assert lease is not None
    brain = FakeBrain(lease, floor=0)
    watcher().add(brain)
    try:
        assert not brain.done.wait(0.6)  # an interrupt only counts after the floor
        emit_event(session_id, {"type": "user.interrupt"})
        assert brain.done.wait(5) and brain.told == ["interrupt"]
    finally:
        watcher().remove(brain)
    lease_release(lease)
    with override_settings(LEASE_SECONDS=0.3):
        taken = lease_acquire(session_id, owner="other", seconds=60)
        assert taken is not None
        stale = FakeBrain(lease, floor=10**6)  # the first epoch, which no longer holds the session
        watcher().add(stale)
        try:
            assert stale.done.wait(5) and stale.told == ["lose_lease"]
        finally:
            watcher().remove(stale)


def test_crashes_with_progress_between_them_are_bad_luck_and_only_the_same_step_counts():
    session_id = make_session()
    message(session_id, "hello")
    for _ in range(4):  # each wake got somewhere (the model answered) before it died
        dead = crash(session_id)
        emit_event(
            session_id, {"type": "agent.message", "content": events.text_content("part")}, epoch=dead.epoch
        )
    lease = lease_acquire(session_id, owner="me", seconds=60)
    assert lease is not None and (lease.attempts, lease.step_attempts) == (5, 1)
    lease_release(lease)

    other = make_session()
    message(other, "hello")
    for _ in range(3):  # each died on the same step: what it wrote only began that step again
        dead = crash(other)
        emit_event(other, events.model_request_start(through_seq=0), epoch=dead.epoch)
    lease = lease_acquire(other, owner="me", seconds=60)
    assert lease is not None and (lease.attempts, lease.step_attempts) == (4, 4)
    lease_release(lease)
    assert Session.objects.filter(id=other, wake_attempts=0, wake_step_attempts=0).exists()


def test_the_backoff_lets_one_crash_retry_at_once_then_doubles():
    from harness.harnesses.steps import crash_backoff

    with override_settings(WAKE_CRASH_BACKOFF_SECONDS=0.5):
        assert [crash_backoff(n) for n in (1, 2, 3, 4, 5)] == [0.0, 0.0, 0.5, 1.0, 2.0]


def test_an_interrupt_cuts_a_backoff_short(model_url):
    session_id = make_session()
    message(session_id, "hello")
    crash(session_id)
    crash(session_id)  # the third wake on this step waits before trying it
    outcome: list[Outcome] = []
    with override_settings(WAKE_CRASH_BACKOFF_SECONDS=600, WAKE_CRASH_LIMIT=5):
        thread = threading.Thread(target=lambda: outcome.append(run_brain(session_id)))
        thread.start()
        deadline = time.monotonic() + 30
        while (
            not Session.objects.filter(id=session_id, lease_owner__gt="").exclude(lease_owner="dead").exists()
        ):
            assert time.monotonic() < deadline, "the third wake never took the lease"
            time.sleep(0.05)
        emit_event(session_id, {"type": "user.interrupt"})
        thread.join(timeout=60)
    assert not thread.is_alive(), "the interrupt did not end the backoff"
    assert outcome == [Outcome.IDLE]
    types = [e.type for e in get_events(session_id)]
    # It waited (until the interrupt) before it tried the step again: its recovery is written after it.
    assert types.index("brain.recovered") > types.index("user.interrupt")
    assert types[-1] == "session.status_idle"


# --- leases of processes known gone ---------------------------------------------------------------------


def a_gone_pid() -> int:
    import subprocess

    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_restarted_worker_frees_only_the_leases_of_this_hosts_processes_that_are_gone():
    import os

    from harness.lease import leases_of_gone_processes, owner_name

    held = {
        "dead here": owner_name(a_gone_pid()),
        "alive here": owner_name(os.getpid()),
        "on another host": "another-host:1",
    }
    sessions = {}
    for what, owner in held.items():
        session_id = make_session()
        message(session_id, "hello")
        assert lease_acquire(session_id, owner=owner, seconds=60) is not None
        sessions[what] = session_id

    assert leases_of_gone_processes() == [sessions["dead here"]]
    rows = {s.id: s for s in Session.objects.filter(id__in=sessions.values())}
    freed = rows[sessions["dead here"]]
    assert freed.lease_owner == "" and freed.lease_expires_at is None
    assert freed.wake_attempts == 1, "a freed lease is a crash: the counter goes on"
    for what in ("alive here", "on another host"):
        row = rows[sessions[what]]
        assert row.lease_owner == held[what] and row.lease_expires_at is not None, what
    assert leases_of_gone_processes() == []

    # The next wake takes the freed lease at once and records the recovery.
    assert run_brain(sessions["dead here"], by="worker_lost") is Outcome.IDLE
    [recovered] = [e for e in get_events(sessions["dead here"]) if e.type == "brain.recovered"]
    assert recovered.payload == {"woken_by": "worker_lost", "epoch": 2, "unfinished_wakes": 1}


def cut_every_connection() -> int:
    """What a PostgreSQL restart does to every process's connections, to the test database's alone: each
    backend but the killer's own is terminated. How many were."""
    import psycopg
    from django.db import connection

    found = connection.settings_dict
    with psycopg.connect(
        host=found["HOST"],
        port=found["PORT"],
        user=found["USER"],
        password=found["PASSWORD"] or None,
        dbname=found["NAME"],
        autocommit=True,
    ) as killer:
        rows = killer.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_a_wake_rides_out_the_database_cutting_its_connections_mid_turn(model_url, settings):
    """PostgreSQL restarting breaks every connection: the brain, waiting on its model, fails its next write
    and cannot release its lease. The wake waits for the database, releases the lease its brain held and
    takes the session up again at once, so the turn ends in this wake, not after the lease lapses (60 s
    here) and a sweep wakes the session. Before, the wake raised and the session waited the lease out."""
    from harness.tasks import wake

    settings.LEASE_SECONDS = 60
    session_id = make_session()
    message(session_id, "/sleep 1.5")
    cut: list[int] = []
    timer = threading.Timer(0.7, lambda: cut.append(cut_every_connection()))
    timer.start()
    started = time.monotonic()
    outcome = wake(session_id)
    timer.join()
    assert cut and cut[0] >= 1, "no connection was cut while the brain worked"
    assert outcome == "idle"
    assert time.monotonic() - started < 30
    log = get_events(session_id)
    recovered = [e for e in log if e.type == "brain.recovered"]
    assert recovered and recovered[0].payload["epoch"] == 2
    assert log[-1].type == "session.status_idle"
    assert [e.type for e in log].count("agent.message") == 1
    session = Session.objects.get(id=session_id)
    assert not session.lease_owner and session.status == Session.Status.IDLE


def test_a_wake_that_never_took_the_lease_waits_for_the_database_too(model_url, settings, monkeypatch):
    """A wake whose first statement fails (the database restarting as it starts) tries again once it
    answers, within WAKE_DATABASE_WAIT_SECONDS; past it, it fails as before."""
    from django.db import OperationalError

    from harness import brain, tasks

    session_id = make_session()
    message(session_id, "hello")
    real, failures = brain._take_lease, []

    def failing_twice(wanted: str):
        if len(failures) < 2:
            failures.append(wanted)
            raise OperationalError("the database system is starting up")
        return real(wanted)

    monkeypatch.setattr(brain, "_take_lease", failing_twice)
    monkeypatch.setattr(tasks, "DATABASE_RETRY_PAUSE_SECONDS", 0.05)
    assert tasks.wake(session_id) == "idle" and len(failures) == 2
    assert get_events(session_id)[-1].type == "session.status_idle"
    settings.WAKE_DATABASE_WAIT_SECONDS = 0
    failures.clear()
    message(session_id, "again")
    with pytest.raises(OperationalError):
        tasks.wake(session_id)
