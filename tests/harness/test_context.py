"""The model's context from the log (harness.context): pure, events in, messages out."""

from __future__ import annotations

from typing import Any

from harness.context import messages_from_events
from sessions import events
from sessions.models import Event


def _log(*payloads: dict[str, Any]) -> list[Event]:
    return [Event(seq=seq, type=payload["type"], payload=payload) for seq, payload in enumerate(payloads)]


def _use(uid: str) -> dict[str, Any]:
    return {"type": "agent.tool_use", "name": "bash", "input": {"command": "ls"}, "_uid": uid}


def _result(tool_use_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "user.tool_result",
        "tool_use_id": tool_use_id,
        "content": [{"type": "text", "text": text}],
    }


def _with_uids(log: list[Event]) -> list[Event]:
    for event in log:
        if "_uid" in event.payload:
            event.uid = event.payload.pop("_uid")
    return log


def _results(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {
        block["tool_use_id"]: [part["text"] for part in block["content"]]
        for message in messages
        if message["role"] == "user"
        for block in message["content"]
        if block["type"] == "tool_result"
    }


def _attached(work_id: str, worker_id: str) -> dict[str, Any]:
    return events.sandbox_attached(
        "sbx_1", "worker", provider="self_hosted", work_id=work_id, worker_id=worker_id
    )


def test_the_first_result_from_another_worker_tells_the_model_its_machine_may_have_changed():
    log = _with_uids(
        _log(
            {"type": "user.message", "content": [{"type": "text", "text": "go"}]},
            _attached("work_1", "host-a-1"),
            _use("call_1"),
            _result("call_1", "one"),
            _use("call_2"),
            events.sandbox_failed("worker", "the worker was lost", work_id="work_1", worker_id="host-a-1"),
            _attached("work_2", "host-b-2"),
            _result("call_2", "two"),
            _use("call_3"),
            _result("call_3", "three"),
        )
    )
    results = _results(messages_from_events(log))
    assert results["call_1"] == ["one"]
    assert results["call_2"][0] == "two" and "worker host-b-2" in results["call_2"][1]
    assert "worker host-a-1 was lost or stopped" in results["call_2"][1]
    assert results["call_3"] == ["three"], "told once, on the first result after the takeover"


def test_the_same_worker_claiming_again_or_the_first_claim_says_nothing():
    log = _with_uids(
        _log(
            {"type": "user.message", "content": [{"type": "text", "text": "go"}]},
            _attached("work_1", "host-a-1"),
            _use("call_1"),
            _result("call_1", "one"),
            _attached("work_2", "host-a-1"),
            _use("call_2"),
            _result("call_2", "two"),
        )
    )
    assert _results(messages_from_events(log)) == {"call_1": ["one"], "call_2": ["two"]}


def test_workers_without_an_id_are_told_apart_by_their_work_item():
    log = _with_uids(
        _log(
            {"type": "user.message", "content": [{"type": "text", "text": "go"}]},
            _attached("work_1", ""),
            _use("call_1"),
            _attached("work_2", ""),
            _result("call_1", "one"),
        )
    )
    note = _results(messages_from_events(log))["call_1"][1]
    assert "a new worker (work item work_2)" in note and "the worker of work item work_1" in note
