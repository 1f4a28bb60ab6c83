"""Tools run by a self-hosted worker, not the server (issue 16, part 3, and part 4's recovery).

The first tests run a brain in-process against the offline model and play the worker with the work queue's
own services; the Show tests at the end run the official SDK's environment worker, unmodified, as separate
processes against the live server and a real Celery brain worker.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from django.test import override_settings

from harness.brain import run_brain
from harness.harnesses import steps
from harness.harnesses.base import WORKERS_PER_CALL
from harness.services.lifecycle import session_archive, session_create, session_send_events
from kernel.errors import Invalid
from sandboxes.models import Sandbox, WorkItem
from sandboxes.work import work_live
from sandboxes.work_keys import environment_key_create
from sandboxes.work_queue import NO_HEARTBEAT, work_ack, work_heartbeat, work_poll, work_stop, work_sweep
from sessions.models import Event
from sessions.selectors import get_events
from tests.conftest import ROOT, child_env, make_agent, make_environment

TOOLSET = {"type": "agent_toolset_20260401"}
ASKING = {"type": "agent_toolset_20260401", "default_config": {"permission_policy": {"type": "always_ask"}}}
WORKER_SCRIPT = ROOT / "tests" / "harness" / "self_hosted_worker.py"


def say(text: str) -> dict[str, Any]:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


def result_for(use_id: str, text: str) -> dict[str, Any]:
    return {"type": "user.tool_result", "tool_use_id": use_id, "content": [{"type": "text", "text": text}]}


def of(log: list[Any], kind: str) -> list[Any]:
    return [e for e in log if e.type == kind]


def results_of(log: list[Any], use_id: str) -> list[Any]:
    return [
        e
        for e in log
        if e.type in ("agent.tool_result", "user.tool_result") and e.payload.get("tool_use_id") == use_id
    ]


# -- in-process: the brain, the log and the queue's services

in_process = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env_id(db: Any) -> str:
    return make_environment(config={"type": "self_hosted"})


def new_session(env_id: str, tools: list[dict[str, Any]] | None = None) -> str:
    return session_create(agent=make_agent(tools=tools or [TOOLSET]), environment_id=env_id).id


def send(session_id: str, *events: dict[str, Any]) -> None:
    session_send_events(session_id, events=list(events))


def turn(session_id: str, *events: dict[str, Any]) -> list[Any]:
    """Send the events, let a brain work, and return the log."""
    send(session_id, *events)
    run_brain(session_id)
    return get_events(session_id)


def claim(env_id: str, worker_id: str) -> WorkItem:
    """Play a worker: poll, ack and claim (the first heartbeat) the item the queue hands out."""
    handed = work_poll(env_id, worker_id=worker_id)
    assert handed is not None
    work_ack(env_id, handed.item.id)
    assert work_heartbeat(env_id, handed.item.id, expected_last_heartbeat=NO_HEARTBEAT)["lease_extended"]
    return WorkItem.objects.get(id=handed.item.id)


def lose(item: WorkItem) -> None:
    """The worker holding `item` dies: its lease runs out, and the queue's sweep notices (as a poll does)."""
    WorkItem.objects.filter(id=item.id).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert item.id in work_sweep(environment_id=item.environment_id)


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The model requests brains of this process make (they still go to the offline model)."""
    made: list[dict[str, Any]] = []
    real = steps.stream_response

    def recording(request: dict[str, Any], **kwargs: Any) -> Any:
        made.append(request)
        return real(request, **kwargs)

    monkeypatch.setattr(steps, "stream_response", recording)
    return made


@in_process
@override_settings(SANDBOX_PROVISIONING="eager")
def test_a_toolset_call_waits_for_the_worker_and_the_platform_provisions_nothing(model_url, env_id, requests):
    session_id = new_session(env_id)
    log = turn(session_id, say("/bash echo hello"))
    [use] = of(log, "agent.tool_use")
    assert use.payload["name"] == "bash" and use.payload["evaluated_permission"] == "allow"
    assert log[-1].type == "session.status_idle"
    assert log[-1].payload["stop_reason"] == {"type": "requires_action", "event_ids": [use.uid]}
    assert not of(log, "agent.tool_result") and not Sandbox.objects.filter(session_id=session_id).exists()
    item = work_live(session_id)
    assert item is not None and item.state == "queued"

    # The model was offered the SDK worker's shapes: no `sandbox` field, no tools for platform sandboxes.
    offered = {tool["name"]: tool for tool in requests[0]["tools"]}
    assert set(offered) == {"bash", "read", "write", "edit", "glob", "grep"}
    assert set(offered["bash"]["input_schema"]["properties"]) == {"command", "restart", "timeout_ms"}
    assert set(offered["edit"]["input_schema"]["properties"]) == {
        "file_path",
        "old_string",
        "new_string",
        "replace_all",
    }
    assert "sandbox" not in requests[0].get("system", "")

    log = turn(session_id, result_for(use.uid, "hello from the worker's machine"))
    assert log[-1].payload["stop_reason"] == {"type": "end_turn"}
    assert "hello from the worker's machine" in of(log, "agent.message")[-1].payload["content"][0]["text"]
    assert [e.uid for e in results_of(log, use.uid)] == [of(log, "user.tool_result")[0].uid]
    assert not Sandbox.objects.filter(session_id=session_id).exists()


@in_process
def test_a_result_for_a_call_that_does_not_exist_or_already_has_one_is_refused_and_nothing_is_added(
    model_url, env_id, api
):
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say("/bash echo hi")), "agent.tool_use")
    idle = Event.objects.filter(session_id=session_id, type="session.status_idle").first()
    before = len(get_events(session_id))

    for events, message in [
        ([result_for("sevt_nope", "x")], "not the id of an agent.tool_use event"),
        ([result_for(idle.uid, "x")], "not the id of an agent.tool_use event"),
        ([result_for(use.uid, "a"), result_for(use.uid, "b")], "answer tool call"),
        ([say("and then"), result_for("sevt_nope", "x")], "not the id of an agent.tool_use event"),
    ]:
        answer = api.post(f"/v1/sessions/{session_id}/events", {"events": events})
        assert answer.status_code == 400, answer.content
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and message in error["message"]
    assert len(get_events(session_id)) == before

    send(session_id, result_for(use.uid, "first"))
    answer = api.post(f"/v1/sessions/{session_id}/events", {"events": [result_for(use.uid, "second")]})
    assert answer.status_code == 400 and "already has a result" in answer.json()["error"]["message"]
    assert [e.payload["content"][0]["text"] for e in results_of(get_events(session_id), use.uid)] == ["first"]


@in_process
def test_a_result_landing_between_the_check_and_the_append_is_refused_by_the_append(
    model_url, env_id, monkeypatch
):
    """The append itself keeps one result per call: the platform's answer (an interrupt's, a recovery's)
    written after the check found none makes the worker's append write nothing."""
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say("/bash echo hi")), "agent.tool_use")
    from harness.fold import result_key
    from harness.services import lifecycle
    from sessions.services import emit_event

    real = lifecycle._check_references

    def then_the_platform_answers(session: str, events: list[dict[str, Any]]) -> None:
        real(session, events)
        emit_event(
            session,
            {"type": "agent.tool_result", "tool_use_id": use.uid},
            idempotency_key=result_key(use.uid),
        )

    monkeypatch.setattr(lifecycle, "_check_references", then_the_platform_answers)
    before = len(get_events(session_id))
    with pytest.raises(Invalid, match="got its result meanwhile"):
        send(session_id, result_for(use.uid, "late"), say("more"))
    log = get_events(session_id)
    assert len(log) == before + 1 and [e.type for e in results_of(log, use.uid)] == ["agent.tool_result"]


@in_process
def test_with_always_ask_the_confirmation_comes_first_then_the_worker_runs_it(model_url, env_id):
    session_id = new_session(env_id, [ASKING])
    log = turn(session_id, say("/bash echo asked"))
    [use] = of(log, "agent.tool_use")
    assert use.payload["evaluated_permission"] == "ask"
    assert log[-1].payload["stop_reason"]["event_ids"] == [use.uid]
    assert work_live(session_id) is None  # no worker is asked for while the user has not allowed it
    with pytest.raises(Invalid, match="waits for a user.tool_confirmation"):
        send(session_id, result_for(use.uid, "too early"))

    log = turn(session_id, {"type": "user.tool_confirmation", "tool_use_id": use.uid, "result": "allow"})
    confirmation = of(log, "user.tool_confirmation")[0]
    assert log[-1].seq > confirmation.seq and log[-1].payload["stop_reason"]["event_ids"] == [use.uid]
    assert work_live(session_id) is not None and not results_of(log, use.uid)
    log = turn(session_id, result_for(use.uid, "asked"))
    assert log[-1].payload["stop_reason"] == {"type": "end_turn"}

    [denied] = [e for e in of(turn(session_id, say("/bash rm -rf ~")), "agent.tool_use") if e.uid != use.uid]
    log = turn(
        session_id,
        {
            "type": "user.tool_confirmation",
            "tool_use_id": denied.uid,
            "result": "deny",
            "deny_message": "No.",
        },
    )
    [answer] = results_of(log, denied.uid)
    assert answer.type == "agent.tool_result" and answer.payload["content"][0]["text"] == "No."
    with pytest.raises(Invalid, match="already has a result"):
        send(session_id, result_for(denied.uid, "ran anyway"))


@in_process
@pytest.mark.parametrize(
    ("script", "problem"),
    [
        ('/tool launch_rockets {"count": 3}', "Unknown tool 'launch_rockets'"),
        ('/tool read {"view_range": [1, 2]}', "missing the required field 'file_path'"),
    ],
)
def test_a_call_the_platform_refuses_is_recorded_denied_and_answered_never_run(
    model_url, env_id, script, problem
):
    """The SDK's runner runs every allowed call it knows by name: one the platform answers itself is
    recorded as refused before any policy applied (evaluated_permission deny, no evaluation)."""
    session_id = new_session(env_id)
    log = turn(session_id, say(script))
    [use] = of(log, "agent.tool_use")
    assert use.payload["evaluated_permission"] == "deny" and "evaluation" not in use.payload
    [answer] = results_of(log, use.uid)
    assert answer.type == "agent.tool_result" and problem in answer.payload["content"][0]["text"]
    assert log[-1].payload["stop_reason"] == {"type": "end_turn"} and work_live(session_id) is None


@in_process
@pytest.mark.parametrize(
    "script",
    ['/tool bash {"command": "sleep 1", "timeout_ms": 0}', '/tool glob {"pattern": "*.py", "path": null}'],
)
def test_an_input_the_sdk_s_tool_takes_goes_to_the_worker(model_url, env_id, script):
    session_id = new_session(env_id)
    log = turn(session_id, say(script))
    [use] = of(log, "agent.tool_use")
    assert use.payload["evaluated_permission"] == "allow" and not results_of(log, use.uid)
    assert log[-1].payload["stop_reason"]["event_ids"] == [use.uid]


@in_process
def test_a_lost_worker_s_unsafe_call_is_closed_as_unverified_and_the_turn_goes_on(model_url, env_id):
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say("/bash make deploy")), "agent.tool_use")
    item = claim(env_id, "worker-a")
    lose(item)  # the hook has run: the recovery is in the log before any worker can read it again

    log = get_events(session_id)
    failed = of(log, "sandbox.failed")[-1]
    assert failed.payload["work_id"] == item.id and failed.payload["worker_id"] == "worker-a"
    [answer] = results_of(log, use.uid)
    assert answer.seq > failed.seq and answer.payload["is_error"]
    assert "effect is unverified" in answer.payload["content"][0]["text"]
    [note] = of(log, "brain.recovered")
    assert note.payload["tool_use_id"] == use.uid and note.payload["action"] == "closed"

    run_brain(session_id)  # the wake the hook queued, taken here
    log = get_events(session_id)
    assert log[-1].payload["stop_reason"] == {"type": "end_turn"}
    assert "Error from bash" in of(log, "agent.message")[-1].payload["content"][0]["text"]
    with pytest.raises(Invalid, match="already has a result"):
        send(session_id, result_for(use.uid, "the lost worker's late answer"))


@in_process
def test_a_lost_worker_s_safe_call_waits_for_the_next_worker(model_url, env_id):
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say('/tool read {"file_path": "notes.txt"}')), "agent.tool_use")
    lose(claim(env_id, "worker-a"))

    log = get_events(session_id)
    failed = of(log, "sandbox.failed")[-1]
    assert not results_of(log, use.uid)
    [note] = of(log, "brain.recovered")
    assert note.payload == {"tool_use_id": use.uid, "tool": "read", "action": "left for the next worker"}
    assert log[-1].seq > failed.seq and log[-1].payload["stop_reason"]["event_ids"] == [use.uid]
    assert work_live(session_id).state == "queued"

    claim(env_id, "worker-b")
    log = turn(session_id, result_for(use.uid, "the notes"))
    assert log[-1].payload["stop_reason"] == {"type": "end_turn"} and len(results_of(log, use.uid)) == 1


@in_process
def test_a_safe_call_that_worker_after_worker_leaves_is_given_up_and_the_session_told(model_url, env_id):
    """A call the worker's runner keeps failing on (its item stopped each time) is not handed out forever."""
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say('/tool grep {"pattern": "TODO"}')), "agent.tool_use")
    for n in range(WORKERS_PER_CALL + 1):
        item = claim(env_id, f"worker-{n}")
        work_stop(env_id, item.id, force=True)  # its runner failed; the SDK's worker stops the item
        assert len(results_of(get_events(session_id), use.uid)) == (n == WORKERS_PER_CALL)
    log = get_events(session_id)
    [answer] = results_of(log, use.uid)
    assert (
        answer.payload["is_error"]
        and f"{WORKERS_PER_CALL + 1} workers in a row" in answer.payload["content"][0]["text"]
    )
    [error] = of(log, "session.error")
    assert error.payload["error"]["retry_status"] == {"type": "exhausted"}
    assert [n.payload["action"] for n in of(log, "brain.recovered")] == ["left for the next worker"] * 3 + [
        "closed"
    ]


@in_process
def test_a_worker_told_to_stop_on_its_first_heartbeat_leaves_a_new_item_for_the_waiting_calls(
    model_url, env_id
):
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say("/bash echo hi")), "agent.tool_use")
    handed = work_poll(env_id, worker_id="worker-a")
    work_ack(env_id, handed.item.id)
    work_stop(env_id, handed.item.id)  # stopping: its worker learns it from its first heartbeat
    beat = work_heartbeat(env_id, handed.item.id, expected_last_heartbeat=NO_HEARTBEAT)
    assert not beat["lease_extended"] and beat["state"] == "stopping"
    work_stop(env_id, handed.item.id, force=True)  # what the SDK's worker does then

    item = work_live(session_id)
    assert item is not None and item.id != handed.item.id and item.state == "queued"
    log = get_events(session_id)
    assert log[-1].payload["stop_reason"]["event_ids"] == [use.uid] and not results_of(log, use.uid)


@in_process
def test_a_session_whose_worker_runner_exited_gets_a_new_item_on_its_next_call(model_url, env_id):
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say("/bash echo one")), "agent.tool_use")
    first = claim(env_id, "worker-a")
    assert turn(session_id, result_for(use.uid, "one"))[-1].payload["stop_reason"] == {"type": "end_turn"}
    work_stop(env_id, first.id, force=True)  # max_idle after the end of the turn: the runner exits
    assert work_live(session_id) is None

    log = turn(session_id, say("/bash echo two"))
    assert log[-1].payload["stop_reason"]["type"] == "requires_action"
    item = work_live(session_id)
    assert item is not None and item.id != first.id


@in_process
def test_an_interrupt_closes_a_call_the_worker_may_have_begun_as_unverified(model_url, env_id):
    session_id = new_session(env_id)
    [use] = of(turn(session_id, say("/bash sleep 100")), "agent.tool_use")
    log = turn(session_id, {"type": "user.interrupt"})
    [answer] = results_of(log, use.uid)
    assert (
        answer.type == "agent.tool_result" and "effect is unverified" in answer.payload["content"][0]["text"]
    )
    assert log[-1].payload["stop_reason"] == {"type": "end_turn"}


@in_process
def test_archiving_a_session_stops_its_work_item(model_url, env_id):
    session_id = new_session(env_id)
    turn(session_id, say("/bash echo hi"))
    item = work_live(session_id)
    session_archive(session_id)
    assert WorkItem.objects.get(id=item.id).state == "stopped" and work_live(session_id) is None


# -- the Show: the official SDK's worker, unmodified, in processes of its own, against the live server

BOUNDS = {
    # A lease of 4 s (heartbeats every 2 s); an acked item never heartbeated goes back after 3 s.
    "WORK_LEASE_TTL_SECONDS": "4",
    "WORK_MIN_TTL_SECONDS": "2",
    "WORK_START_TIMEOUT_SECONDS": "3",
}


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The work queue's bounds for the processes the test starts (the live server reads them)."""
    for name, value in BOUNDS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def sdk(short_bounds, live_server_url, api_key, brain_worker) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def environment(sdk) -> tuple[str, str]:
    """A self-hosted environment and a key for its workers."""
    env_id = sdk.beta.environments.create(
        name=f"hands-{uuid.uuid4().hex[:8]}", config={"type": "self_hosted"}
    ).id
    return env_id, environment_key_create(env_id, name="the test's workers")[1]


class Workers:
    """The SDK's workers this test starts, each a process of its own with its own working directory; all
    SIGKILLed at the end."""

    def __init__(self, base_url: str, environment: tuple[str, str], tmp: Path):
        self.base_url, (self.env_id, self.key), self.tmp = base_url, environment, tmp
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def workdir(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir(exist_ok=True)
        return path

    def start(self, name: str, *, mode: str = "serve", max_idle: float = 2.0) -> subprocess.Popen[bytes]:
        env = child_env(ANTHROPIC_ENVIRONMENT_KEY=self.key, WORKER_ID=name, WORKER_MARK=f"mark-of-{name}")
        command = [sys.executable, str(WORKER_SCRIPT), mode, self.base_url, self.env_id]
        command += ["--workdir", str(self.workdir(name)), "--max-idle", str(max_idle)]
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the process holds it
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE if mode == "ack" else log, stderr=log, cwd=ROOT
        )
        self.processes[name] = process
        return process

    def kill(self, name: str) -> None:
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def stop_all(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is None:
                self.kill(name)


@pytest.fixture
def workers(live_server_url, environment, tmp_path) -> Iterator[Workers]:
    started = Workers(live_server_url, environment, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def wait_for(what: str, check: Callable[[], Any], *, seconds: float = 90) -> Any:
    """`check()`'s first truthy answer; fail (saying what) if none comes before the deadline."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")


def log_of(sdk: anthropic.Anthropic, session_id: str) -> list[Any]:
    return list(sdk.beta.sessions.events.list(session_id, limit=1000))


def ended_turns(sdk: anthropic.Anthropic, session_id: str) -> list[Any]:
    return [
        e
        for e in log_of(sdk, session_id)
        if e.type == "session.status_idle" and e.stop_reason.type != "requires_action"
    ]


def run_turn(sdk: anthropic.Anthropic, session_id: str, text: str) -> list[Any]:
    """Send a message and wait for its turn to end (not on requires_action: the worker answers those)."""
    done = len(ended_turns(sdk, session_id))
    sdk.beta.sessions.events.send(session_id, events=[say(text)])
    wait_for(f"the turn of {text!r} to end", lambda: len(ended_turns(sdk, session_id)) > done)
    return log_of(sdk, session_id)


def new_sdk_session(sdk: anthropic.Anthropic, env_id: str) -> str:
    agent = sdk.beta.agents.create(name="on the worker", model="claude-sonnet-5-5", tools=[TOOLSET])
    return sdk.beta.sessions.create(agent=agent.id, environment_id=env_id).id


def one_result_each(log: list[Any]) -> dict[str, Any]:
    """Every tool call's one result (the test fails on a call with none or with two)."""
    uses = [e.id for e in log if e.type == "agent.tool_use"]
    results: dict[str, list[Any]] = {use: [] for use in uses}
    for e in log:
        if e.type in ("agent.tool_result", "user.tool_result"):
            results[e.tool_use_id].append(e)
    assert all(len(found) == 1 for found in results.values()), results
    return {use: found[0] for use, found in results.items()}


def text_of(event: Any) -> str:
    return "".join(block.text for block in event.content or [] if block.type == "text")


def platform_sandboxes(session_id: str) -> list[Sandbox]:
    return list(Sandbox.objects.filter(session_id=session_id).exclude(provider="self_hosted"))


@pytest.mark.server
def test_a_bash_turn_runs_on_the_worker_s_machine(sdk, environment, workers):
    env_id, _ = environment
    token = uuid.uuid4().hex
    (workers.workdir("worker-a") / "left-by-the-test.txt").write_text(token)
    workers.start("worker-a")
    session_id = new_sdk_session(sdk, env_id)

    log = run_turn(sdk, session_id, "/bash cat left-by-the-test.txt; echo; echo $WORKER_MARK; pwd")
    [(use_id, result)] = one_result_each(log).items()
    assert result.type == "user.tool_result" and not result.is_error
    assert text_of(result).split() == [token, "mark-of-worker-a", str(workers.workdir("worker-a"))]
    assert token in text_of([e for e in log if e.type == "agent.message"][-1])
    [attached] = [e for e in log if e.type == "sandbox.attached"]
    assert (
        attached.model_extra["worker_id"] == "worker-a" and attached.model_extra["provider"] == "self_hosted"
    )
    assert platform_sandboxes(session_id) == []


@pytest.mark.server
def test_after_its_worker_is_killed_mid_call_a_second_worker_serves_the_next_turn(sdk, environment, workers):
    env_id, _ = environment
    workers.start("worker-a")
    session_id = new_sdk_session(sdk, env_id)
    started = workers.workdir("worker-a") / "started"
    sdk.beta.sessions.events.send(session_id, events=[say("/bash touch started; sleep 30; echo slept")])
    wait_for("worker-a to run the call", started.exists)
    workers.kill("worker-a")
    workers.start("worker-b")

    wait_for("the first turn to end", lambda: ended_turns(sdk, session_id))
    log = run_turn(sdk, session_id, "/bash echo $WORKER_MARK")
    results = list(one_result_each(log).values())
    assert [r.type for r in results] == ["agent.tool_result", "user.tool_result"]
    assert results[0].is_error and "effect is unverified" in text_of(results[0])
    assert text_of(results[1]).strip() == "mark-of-worker-b"
    # worker-b did not run the first call again: its recovery was in the log before worker-b read it.
    assert not (workers.workdir("worker-b") / "started").exists()
    hands = [(e.type, e.model_extra.get("worker_id")) for e in log if e.type.startswith("sandbox.")]
    assert hands[:3] == [
        ("sandbox.attached", "worker-a"),
        ("sandbox.failed", "worker-a"),
        ("sandbox.attached", "worker-b"),
    ]
    assert platform_sandboxes(session_id) == []


@pytest.mark.server
def test_two_workers_and_ten_sessions_each_served_by_one_worker_at_a_time(sdk, environment, workers):
    env_id, _ = environment
    workers.start("worker-a", max_idle=1)
    workers.start("worker-b", max_idle=1)
    sessions = [new_sdk_session(sdk, env_id) for _ in range(10)]
    for session_id in sessions:
        sdk.beta.sessions.events.send(session_id, events=[say("/bash echo $WORKER_MARK")])

    served: set[str] = set()
    for session_id in sessions:
        wait_for(f"the turn of {session_id}", lambda s=session_id: ended_turns(sdk, s), seconds=150)
        log = log_of(sdk, session_id)
        [result] = one_result_each(log).values()
        holder = None
        for event in log:  # the hands' comings and goings alternate: one worker at a time
            if event.type == "sandbox.attached":
                assert holder is None, f"{session_id}: {event.model_extra['worker_id']} joined {holder}"
                holder = event.model_extra["worker_id"]
            elif event.type in ("sandbox.failed", "sandbox.terminated"):
                assert holder == event.model_extra["worker_id"]
                holder = None
            elif event.id == result.id:
                assert text_of(result).strip() == f"mark-of-{holder}"
                served.add(holder)
        assert WorkItem.objects.filter(session_id=session_id).exclude(state="stopped").count() <= 1
    assert served <= {"worker-a", "worker-b"}


@pytest.mark.server
def test_a_worker_killed_between_its_ack_and_its_first_heartbeat_leaves_nothing_starting(
    sdk, environment, workers
):
    env_id, _ = environment
    acking = workers.start("worker-dies", mode="ack")
    session_id = new_sdk_session(sdk, env_id)
    sdk.beta.sessions.events.send(session_id, events=[say("/bash echo $WORKER_MARK")])
    line = acking.stdout.readline().decode()
    assert line.startswith("acked "), line
    work_id = line.split()[1]
    workers.kill("worker-dies")
    assert WorkItem.objects.get(id=work_id).state == "starting"

    workers.start("worker-b")
    wait_for("the turn to end", lambda: ended_turns(sdk, session_id))
    log = log_of(sdk, session_id)
    [result] = one_result_each(log).values()
    assert text_of(result).strip() == "mark-of-worker-b"
    [attached] = [e for e in log if e.type == "sandbox.attached"]
    assert attached.model_extra["work_id"] == work_id and attached.model_extra["worker_id"] == "worker-b"
    item = WorkItem.objects.get(id=work_id)
    assert item.lost_count == 1
    assert not WorkItem.objects.filter(environment_id=env_id, state="starting").exists()
