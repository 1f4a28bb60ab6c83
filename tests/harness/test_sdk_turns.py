"""The official SDK drives whole turns against the live server, a real Celery worker and the offline model."""

from __future__ import annotations

import threading
import time
from typing import Any

import anthropic
import httpx
import pytest

pytestmark = pytest.mark.server

TOOLSET = {"type": "agent_toolset_20260401"}
LOOKUP = {
    "type": "custom",
    "name": "lookup",
    "description": "Look a word up.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


@pytest.fixture
def sdk(live_server_url, api_key, brain_worker):
    return anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def environment(sdk):
    return sdk.beta.environments.create(name="docker", config={"type": "cloud"}).id


def new_session(sdk, environment, **agent: Any) -> str:
    created = sdk.beta.agents.create(name="e2e", model="claude-sonnet-5-5", **agent)
    return sdk.beta.sessions.create(agent=created.id, environment_id=environment).id


def turn(sdk, session_id: str, events: list[dict], *, stop_on_action: bool = True, during=None) -> list[Any]:
    """Open the stream, send `events`, and collect until the session goes idle."""
    collected: list[Any] = []
    with sdk.beta.sessions.events.stream(session_id) as stream:
        sdk.beta.sessions.events.send(session_id, events=events)
        for event in stream:
            collected.append(event)
            if during is not None:
                during(event)
            if event.type == "session.status_idle" and (
                stop_on_action or event.stop_reason.type != "requires_action"
            ):
                return collected
    raise AssertionError("the stream ended before the session went idle")


def say(text: str) -> dict:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


def of(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


def test_a_bash_turn_runs_in_docker_and_the_answer_quotes_it(sdk, environment):
    session_id = new_session(sdk, environment, tools=[TOOLSET])
    events = turn(sdk, session_id, [say("/bash echo hello from $(whoami)")])
    assert events[-1].stop_reason.type == "end_turn"
    [use] = of(events, "agent.tool_use")
    assert use.name == "bash" and use.input == {"command": "echo hello from $(whoami)"}
    [result] = of(events, "agent.tool_result")
    assert result.tool_use_id == use.id and not result.is_error
    assert result.content[0].text == "hello from sandbox"
    assert "hello from sandbox" in of(events, "agent.message")[-1].content[0].text
    assert of(events, "sandbox.provisioned") and of(events, "session.status_running")
    assert sdk.beta.sessions.retrieve(session_id).status == "idle"


def test_a_custom_tool_round_trip_waits_for_the_client(sdk, environment):
    session_id = new_session(sdk, environment, tools=[LOOKUP])
    events = turn(sdk, session_id, [say('/tool lookup {"q": "otter"}')])
    [use] = of(events, "agent.custom_tool_use")
    assert use.name == "lookup" and use.input == {"q": "otter"}
    assert events[-1].stop_reason.type == "requires_action" and events[-1].stop_reason.event_ids == [use.id]
    events = turn(
        sdk,
        session_id,
        [
            {
                "type": "user.custom_tool_result",
                "custom_tool_use_id": use.id,
                "content": [{"type": "text", "text": "a water weasel"}],
            }
        ],
    )
    assert events[-1].stop_reason.type == "end_turn"
    assert "a water weasel" in of(events, "agent.message")[-1].content[0].text

    before = len(list(sdk.beta.sessions.events.list(session_id)))
    second = {
        "type": "user.custom_tool_result",
        "custom_tool_use_id": use.id,
        "content": [{"type": "text", "text": "a second answer"}],
    }
    with pytest.raises(anthropic.BadRequestError, match="already has a result"):
        sdk.beta.sessions.events.send(session_id, events=[second])
    assert len(list(sdk.beta.sessions.events.list(session_id))) == before


def test_a_tool_that_asks_runs_on_allow_and_returns_the_message_on_deny(sdk, environment):
    asking = {
        "type": "agent_toolset_20260401",
        "default_config": {"permission_policy": {"type": "always_ask"}},
    }
    session_id = new_session(sdk, environment, tools=[asking])
    events = turn(sdk, session_id, [say("/bash echo allowed")])
    [use] = of(events, "agent.tool_use")
    assert use.evaluated_permission == "ask" and events[-1].stop_reason.event_ids == [use.id]
    events = turn(
        sdk, session_id, [{"type": "user.tool_confirmation", "tool_use_id": use.id, "result": "allow"}]
    )
    assert of(events, "agent.tool_result")[0].content[0].text == "allowed"
    assert events[-1].stop_reason.type == "end_turn"

    events = turn(sdk, session_id, [say("/bash rm -rf /workspace")])
    [use] = of(events, "agent.tool_use")
    events = turn(
        sdk,
        session_id,
        [
            {
                "type": "user.tool_confirmation",
                "tool_use_id": use.id,
                "result": "deny",
                "deny_message": "Not on my watch.",
            }
        ],
    )
    [result] = of(events, "agent.tool_result")
    assert result.is_error and result.content[0].text == "Not on my watch."
    assert events[-1].stop_reason.type == "end_turn"


def test_an_interrupt_stops_a_streaming_answer_and_leaves_the_session_idle(sdk, environment, offline_model):
    offline_model.set_latency(tps=20)
    session_id = new_session(sdk, environment)
    sent = threading.Event()

    def interrupt_once_streaming(event: Any) -> None:
        if event.type == "span.model_request_start" and not sent.is_set():
            sent.set()
            time.sleep(0.5)
            sdk.beta.sessions.events.send(session_id, events=[{"type": "user.interrupt"}])

    events = turn(sdk, session_id, [say("/long 2000")], during=interrupt_once_streaming)
    assert sent.is_set()
    assert events[-1].type == "session.status_idle" and events[-1].stop_reason.type == "end_turn"
    ends = of(events, "span.model_request_end")
    assert ends and ends[-1].is_error
    assert not of(events, "agent.message"), "an interrupted answer is not recorded as if it were complete"


def test_an_overloaded_model_is_retried_and_the_turn_completes(sdk, environment, offline_model):
    offline_model.inject_fault("529", count=2)
    session_id = new_session(sdk, environment)
    events = turn(sdk, session_id, [say("are you there?")])
    errors = of(events, "session.error")
    assert [e.error.type for e in errors] == ["model_overloaded_error"] * 2
    assert all(e.error.retry_status.type == "retrying" for e in errors)
    assert of(events, "agent.message")[-1].content[0].text == "You said: are you there?"
    assert events[-1].stop_reason.type == "end_turn"


def test_switching_the_harness_between_turns_changes_the_next_turn(
    sdk, environment, live_server_url, api_key
):
    session_id = new_session(sdk, environment, tools=[TOOLSET])
    events = turn(sdk, session_id, [say('/tool write {"file_path": "notes.txt", "content": "kept"}')])
    assert not of(events, "agent.tool_result")[0].is_error
    switched = httpx.post(
        f"{live_server_url}/v1/sessions/{session_id}",
        json={"harness": "bash-only"},
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert switched.status_code == 200, switched.text
    events = turn(sdk, session_id, [say('/tool read {"file_path": "notes.txt"}\n/bash cat notes.txt')])
    results = of(events, "agent.tool_result")
    assert results[0].is_error and "Unknown tool 'read'" in results[0].content[0].text
    assert results[1].content[0].text == "kept"
    log = sdk.beta.sessions.events.list(session_id, limit=1000).data
    assert [e for e in log if e.type == "brain.harness_switched"][0].harness == "bash-only"
