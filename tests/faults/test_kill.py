"""Killing the brain: real Celery workers on Redis, SIGKILLed (or frozen) mid-turn; another one finishes.

Every test runs the product's processes (prefork workers, beat with the sweeper, the offline model, Docker
sandboxes) against the test database, with LEASE_SECONDS=2 and SWEEP_SECONDS=0.5. A worker is killed with
SIGKILL to its whole process group, so nothing can requeue its task: only the sweeper can bring the session
back. Afterwards the log must hold: seq contiguous; no older epoch writing after a newer one; every model
request closed, with at most one agent.message; every agent.tool_use answered exactly once; the session idle.
"""

from __future__ import annotations

import signal
import time
from functools import partial

import pytest

from harness.services.lifecycle import session_send_events
from harness.tasks import wake
from offline_model.script import long_text
from sandboxes.models import Sandbox
from sessions.models import Event, Session
from tests.faults.conftest import (
    Cluster,
    Worker,
    check_log,
    describe,
    first,
    log_of,
    new_session,
    process_state,
    settled,
    wait_for,
)

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

TURN_SECONDS = 30.0
STRANDED_SECONDS = 3.0  # six sweeps


def lease_epoch(session_id: str) -> int:
    return Session.objects.values_list("lease_epoch", flat=True).get(id=session_id)


def stranded(session_id: str) -> bool:
    """Running, yet no brain holds it and the log shows nothing to do: nobody will ever end this turn."""
    from harness.brain import has_pending_work

    session = Session.objects.get(id=session_id)
    return (
        session.status == Session.Status.RUNNING
        and not session.lease_owner
        and not has_pending_work(session_id)
    )


def wait_settled(cluster: Cluster, session_id: str, *, last_is_idle: bool = True) -> list[Event]:
    """Wait for the turn to end; fail at once if the session is left stranded for a few sweeps."""
    stranded_since: list[float] = []

    def done() -> bool:
        if settled(session_id, last_is_idle=last_is_idle):
            return True
        if not stranded(session_id):
            stranded_since.clear()
        elif not stranded_since:
            stranded_since.append(time.monotonic())
        elif time.monotonic() - stranded_since[0] > STRANDED_SECONDS:
            pytest.fail(
                f"session {session_id} is stranded: running, no lease, nothing pending\n"
                f"{describe(log_of(session_id))}"
            )
        return False

    wait_for(
        done,
        timeout=TURN_SECONDS,
        what=f"session {session_id} to finish its turn",
        on_timeout=lambda: (
            f"log:\n{describe(log_of(session_id))}\nsession: "
            f"{Session.objects.filter(id=session_id).values().first()}\n{cluster.diagnostics()}"
        ),
    )
    return log_of(session_id)


def waiting_on_the_model(session_id: str, *, newer_than: int) -> bool:
    events = log_of(session_id)
    return (
        bool(events) and events[-1].type == "span.model_request_start" and events[-1].lease_epoch > newer_than
    )


def holder_of(cluster: Cluster, session_id: str) -> Worker:
    worker = wait_for(lambda: cluster.holder(session_id), timeout=5, what="the worker holding the lease")
    assert isinstance(worker, Worker)
    return worker


def paused_holder(cluster: Cluster, session_id: str) -> Worker:
    """The worker whose brain froze itself at the fault hook (its pool process is in state T)."""

    def frozen() -> Worker | None:
        worker = cluster.holder(session_id)
        if worker is not None and any(process_state(pid) == "T" for pid in worker.pool_pids()):
            return worker
        return None

    worker = wait_for(
        frozen,
        timeout=TURN_SECONDS,
        what="the brain to stop at the fault hook",
        on_timeout=lambda: describe(log_of(session_id)) + "\n" + cluster.diagnostics(),
    )
    assert isinstance(worker, Worker)
    return worker


def assert_brought_back_by_the_sweeper(events: list[Event], killed_epoch: int) -> Event:
    """The first recovery after the kill was a wake sent by the sweeper, not a redelivered task."""
    recoveries = [e for e in events if e.type == "brain.recovered" and "woken_by" in e.payload]
    assert recoveries, f"no brain.recovered with woken_by:\n{describe(events)}"
    recovered = recoveries[0]
    assert recovered.payload["woken_by"] == "sweeper", describe(events)
    assert recovered.lease_epoch is not None and recovered.lease_epoch > killed_epoch
    assert recovered.payload["unfinished_wakes"] >= 1
    assert not [e for e in events if e.lease_epoch == killed_epoch and e.seq > recovered.seq]
    return recovered


def texts(events: list[Event], kind: str = "agent.message") -> list[str]:
    return [
        "".join(block.get("text", "") for block in e.payload.get("content", []))
        for e in events
        if e.type == kind
    ]


# --- (a) while the model streams ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_while_the_model_streams_is_resumed_by_the_sweeper(cluster):
    """The request the dead brain started is closed as an error, and the new brain asks the model again."""
    cluster.model.set_latency(tps=100)  # 300 words: three seconds of streaming
    cluster.start_workers(2)
    cluster.start_beat()
    session_id = new_session("/long 300")
    start = wait_for(
        lambda: first(log_of(session_id), "span.model_request_start"),
        timeout=TURN_SECONDS,
        what="the first model request",
        on_timeout=cluster.diagnostics,
    )
    wait_for(lambda: cluster.model.stats()["in_flight"] == 1, timeout=5, what="the model to stream")
    time.sleep(0.5)
    victim = holder_of(cluster, session_id)
    killed_epoch = lease_epoch(session_id)
    assert cluster.model.stats()["in_flight"] == 1 and not first(log_of(session_id), "agent.message")
    cluster.model.set_latency(tps=0)
    victim.kill()

    wait_for(
        lambda: cluster.model.stats()["disconnects"] >= 1, timeout=5, what="the model to see the client go"
    )
    wait_settled(cluster, session_id)
    events = check_log(session_id)
    assert_brought_back_by_the_sweeper(events, killed_epoch)
    closed = first(events, "span.model_request_end", model_request_start_id=start.uid)
    assert closed is not None and closed.payload["is_error"] and closed.lease_epoch > killed_epoch
    assert first(events, "brain.recovered", closed_model_request=start.uid) is not None
    assert texts(events) == [long_text(300)]
    assert first(events, "agent.message").lease_epoch > killed_epoch


# --- (b) while a tool runs ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_while_bash_runs_closes_the_call_as_unverified(cluster, docker_engine):
    """bash is not safe to repeat: the recovering brain answers the call with an error saying so."""
    import docker

    cluster.start_workers(2)
    cluster.start_beat()
    session_id = new_session("/bash sleep 3; echo done", tools=True)
    wait_for(
        lambda: first(log_of(session_id), "sandbox.provisioned"),
        timeout=TURN_SECONDS,
        what="the sandbox of the first tool call",
        on_timeout=cluster.diagnostics,
    )
    sandbox = Sandbox.objects.get(session_id=session_id)
    container = docker.from_env().containers.get(sandbox.handle)

    def sleeping() -> bool:
        return any("sleep 3" in " ".join(process) for process in container.top()["Processes"])

    wait_for(sleeping, timeout=5, what="`sleep 3` to run in the sandbox")
    use = first(log_of(session_id), "agent.tool_use")
    assert use is not None and not first(log_of(session_id), "agent.tool_result")
    victim = holder_of(cluster, session_id)
    killed_epoch = lease_epoch(session_id)
    victim.kill()

    wait_settled(cluster, session_id)
    events = check_log(session_id)
    assert_brought_back_by_the_sweeper(events, killed_epoch)
    recovered = first(events, "brain.recovered", tool_use_id=use.uid)
    assert recovered is not None and recovered.payload["action"] == "closed"
    result = first(events, "agent.tool_result", tool_use_id=use.uid)
    assert result is not None and result.payload["is_error"] and result.lease_epoch > killed_epoch
    assert "unverified" in texts([result], "agent.tool_result")[0]
    assert "Error from bash" in texts(events)[-1]


# --- (c) between two emits ----------------------------------------------------------------------------

BETWEEN = {
    # After the turn opened (status and request start commit together), before the model was called: the
    # new brain closes the request the dead one left open and asks again.
    "after the request started": ("after:span.model_request_start", "hello", False),
    # After the response with the tool call was recorded, before the tool started (no sandbox yet): the
    # new brain cannot know that, and closes the bash call as unverified.
    "after the recorded tool call": ("after:span.model_request_end", "/bash echo one", True),
    # After the tool's result, before the next model request: the tool is not run again.
    "after the tool result": ("after:agent.tool_result", "/bash echo one", True),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("point", list(BETWEEN))
def test_a_worker_killed_between_two_emits_resumes_at_the_next_step(cluster, request, point):
    """The brain is frozen right after committing an event (a fault hook in the worker stops it with
    SIGSTOP), then SIGKILLed there: the turn goes on from exactly that event."""
    pause, text, tools = BETWEEN[point]
    if tools:
        request.getfixturevalue("docker_engine")
    (frozen,) = cluster.start_workers(1, WORKBENCH_FAULT_PAUSE=pause)
    session_id = new_session(text, tools=tools)
    assert paused_holder(cluster, session_id) is frozen
    before = log_of(session_id)
    killed_epoch = lease_epoch(session_id)
    assert before[-1].type == pause.split(":", 1)[1] and before[-1].lease_epoch == killed_epoch
    cluster.start_workers(1)
    cluster.start_beat()
    frozen.kill()

    wait_settled(cluster, session_id)
    events = check_log(session_id)
    assert events[: len(before)] == before
    assert_brought_back_by_the_sweeper(events, killed_epoch)
    if point == "after the request started":
        assert texts(events) == ["You said: hello"]
        assert [e.type for e in events].count("session.status_running") == 1
        assert first(events, "brain.recovered", closed_model_request=before[-1].uid)
    elif point == "after the recorded tool call":
        use = first(events, "agent.tool_use")
        assert not [e for e in events if e.type == "sandbox.provisioned" and e.lease_epoch == killed_epoch]
        assert first(events, "brain.recovered", tool_use_id=use.uid).payload["action"] == "closed"
        assert "unverified" in texts(events, "agent.tool_result")[0]
    else:
        (result,) = [e for e in events if e.type == "agent.tool_result"]
        assert result.lease_epoch == killed_epoch and not result.payload["is_error"]
        assert texts(events)[-1] == "Result of bash: one"
        assert [e.type for e in events].count("sandbox.provisioned") == 1


# --- one writer per session ---------------------------------------------------------------------------


def turns(events: list[Event]) -> list[list[Event]]:
    """The log cut after each session.status_idle."""
    cut, current = [], []
    for event in events:
        current.append(event)
        if event.type == "session.status_idle":
            cut.append(current)
            current = []
    return cut + ([current] if current else [])


@pytest.mark.django_db(transaction=True)
def test_two_workers_woken_at_once_leave_one_epoch_per_turn(cluster):
    """Three wakes for each message (the one queued on commit, and one sent to each worker's own queue)
    race: the lease admits one brain, the others find it busy and write nothing."""
    cluster.model.set_latency(ttft_ms=800)  # the first brain holds the lease while the others arrive
    workers = cluster.start_workers(2)
    session_id = new_session()
    for i in range(3):
        session_send_events(
            session_id,
            events=[{"type": "user.message", "content": [{"type": "text", "text": f"turn {i}"}]}],
        )
        for worker in workers:
            wake.apply_async((session_id,), queue=worker.queue)
        wait_settled(cluster, session_id)

    events = check_log(session_id)
    assert texts(events) == [f"You said: turn {i}" for i in range(3)]
    for turn in turns(events):
        epochs = {e.lease_epoch for e in turn if e.lease_epoch is not None}
        assert len(epochs) == 1, f"a turn written by epochs {epochs}:\n{describe(turn)}"
    outcomes = " ".join(w.log() for w in workers)
    assert outcomes.count(f"wake({session_id}): busy") >= 3, cluster.diagnostics()


# --- fencing: a brain paused past its lease -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_brain_frozen_mid_stream_past_its_lease_stops_when_it_wakes(cluster):
    """SIGSTOP the worker while the model streams (a VM pause, a long GC); another worker takes the session
    over and finishes the turn; after SIGCONT the first brain writes nothing more."""
    cluster.model.set_latency(tps=60)
    cluster.start_workers(2)
    cluster.start_beat()
    session_id = new_session("/long 200")
    wait_for(
        lambda: cluster.model.stats()["in_flight"] == 1,
        timeout=TURN_SECONDS,
        what="the model to stream",
        on_timeout=cluster.diagnostics,
    )
    time.sleep(0.5)
    frozen = holder_of(cluster, session_id)
    frozen_epoch = lease_epoch(session_id)
    frozen.signal_group(signal.SIGSTOP)
    cluster.model.set_latency(tps=0)

    events = wait_settled(cluster, session_id)
    assert lease_epoch(session_id) > frozen_epoch
    frozen.signal_group(signal.SIGCONT)
    wait_for(
        lambda: f"wake({session_id}): lease lost" in frozen.log(),
        timeout=10,
        what="the resumed brain to stop",
        on_timeout=cluster.diagnostics,
    )

    assert log_of(session_id) == events
    events = check_log(session_id)
    assert_brought_back_by_the_sweeper(events, frozen_epoch)
    assert texts(events) == [long_text(200)]
    assert {e.type for e in events if e.lease_epoch == frozen_epoch} == {
        "session.status_running",
        "span.model_request_start",
    }


@pytest.mark.django_db(transaction=True)
def test_a_brain_frozen_before_a_write_past_its_lease_has_that_write_refused(cluster):
    """The brain holds the model's whole response and is about to record it when it freezes (the fault
    hook stops it before the write). Another worker finishes the turn; resumed, the first brain's write
    is refused by the database (StaleEpoch) and the brain stops."""
    # The frozen brain's lease watcher sleeps through the test (it would otherwise race the resumed write
    # to notice the lost lease); its lease lapses unrenewed, which is what a freeze does anyway.
    (frozen,) = cluster.start_workers(
        1, WORKBENCH_FAULT_PAUSE="before:span.model_request_end", INTERRUPT_POLL_SECONDS="60"
    )
    session_id = new_session("hello")
    assert paused_holder(cluster, session_id) is frozen
    frozen_epoch = lease_epoch(session_id)
    cluster.start_workers(1)
    cluster.start_beat()

    events = wait_settled(cluster, session_id)
    frozen.signal_group(signal.SIGCONT)
    wait_for(
        lambda: f"wake({session_id}): lease lost" in frozen.log(),
        timeout=10,
        what="the resumed brain to stop",
        on_timeout=cluster.diagnostics,
    )

    assert log_of(session_id) == events
    events = check_log(session_id)
    assert_brought_back_by_the_sweeper(events, frozen_epoch)
    assert texts(events) == ["You said: hello"]
    assert not [e for e in events if e.type == "agent.message" and e.lease_epoch == frozen_epoch]
    refused = [line for line in frozen.log().splitlines() if "fault-hook: write refused" in line]
    assert len(refused) == 1 and "(StaleEpoch)" in refused[0], frozen.log()[-3000:]


# --- a crash loop ends parked ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_session_whose_wakes_keep_dying_is_parked_idle(cluster):
    """WAKE_CRASH_LIMIT=2: two wakes killed in a row, and the third parks the session instead of calling
    the model again (session.error, brain.parked, idle); a new message then gets an answer."""
    cluster.model.set_latency(ttft_ms=60_000)  # every brain waits on the model until it is killed
    cluster.start_workers(3, WAKE_CRASH_LIMIT="2")
    cluster.start_beat()
    session_id = new_session("hello")
    killed = 0
    for _ in range(2):
        wait_for(
            partial(waiting_on_the_model, session_id, newer_than=killed),
            timeout=TURN_SECONDS,
            what="a brain waiting on the model",
            on_timeout=lambda: describe(log_of(session_id)),
        )
        killed = lease_epoch(session_id)
        holder_of(cluster, session_id).kill()

    parked = wait_for(
        lambda: first(log_of(session_id), "brain.parked"),
        timeout=TURN_SECONDS,
        what="the session to be parked",
        on_timeout=lambda: describe(log_of(session_id)),
    )
    wait_settled(cluster, session_id, last_is_idle=False)
    events = check_log(session_id)
    assert parked.payload["attempts"] == 2
    error, idle = events[parked.seq - 1], events[parked.seq + 1]
    assert error.type == "session.error" and error.payload["error"]["retry_status"] == {"type": "terminal"}
    assert idle.type == "session.status_idle" and idle.payload["stop_reason"] == {"type": "retries_exhausted"}
    assert not [
        e for e in events if e.type == "span.model_request_start" and e.lease_epoch >= parked.lease_epoch
    ]
    session = Session.objects.get(id=session_id)
    assert session.status == Session.Status.IDLE and session.wake_attempts == 0

    cluster.model.set_latency(ttft_ms=0)
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": "again"}]}]
    )
    wait_settled(cluster, session_id)
    events = check_log(session_id)
    assert texts(events) == ["You said: hello\nagain"]  # the parked message is answered with the new one
