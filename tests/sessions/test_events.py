"""The constructors of the events the platform writes: one shape each, as the fold and the API read them."""

from __future__ import annotations

import pytest

from harness.fold import fold
from sessions import events
from sessions.models import Event


def folded(*payloads: dict) -> object:
    """The fold of these events as if they were the log from seq 0."""
    log = []
    for seq, payload in enumerate(payloads):
        body = dict(payload)
        log.append(Event(uid=f"sevt_{seq}", seq=seq, type=body.pop("type"), payload=body, lease_epoch=1))
    return fold(log)


def test_status_idle_carries_its_reason_and_only_the_fields_given():
    assert events.status_idle("end_turn") == {
        "type": "session.status_idle",
        "stop_reason": {"type": "end_turn"},
    }
    assert events.status_idle("requires_action", event_ids=["sevt_1"], through_seq=4) == {
        "type": "session.status_idle",
        "stop_reason": {"type": "requires_action", "event_ids": ["sevt_1"]},
        "through_seq": 4,
    }


def test_a_failed_model_request_end_gives_its_inputs_back_and_a_finished_one_counts_usage():
    start = events.model_request_start(through_seq=0)
    message = {"type": "user.message", "content": events.text_content("hi")}
    failed = folded(message, start, events.model_request_end("sevt_1", error="the worker stopped"))
    assert failed.open_request is None and [e.seq for e in failed.pending_inputs] == [0]
    done = folded(
        message, start, events.model_request_end("sevt_1", stop_reason="end_turn", usage={"input_tokens": 3})
    )
    assert done.pending_inputs == [] and done.usage == {"input_tokens": 3}
    assert done.last_response_end.payload["stop_reason"] == "end_turn"


def test_session_error_nests_its_retry_status_and_details():
    error = events.session_error("repository_clone_error", "no", retry="retrying", repository_url="https://x")
    assert error == {
        "type": "session.error",
        "error": {
            "type": "repository_clone_error",
            "message": "no",
            "retry_status": {"type": "retrying"},
            "repository_url": "https://x",
        },
    }


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (events.tool_result("sevt_9", "done", is_error=False), {"tool_use_id": "sevt_9", "is_error": False}),
        (events.sandbox_failed("main", "engine down"), {"name": "main", "reason": "engine down"}),
        (events.sandbox_failed("main", "gone", sandbox_id="sbx_1"), {"sandbox_id": "sbx_1", "name": "main"}),
        (events.sandbox_attached("sbx_1", "main", from_session="sesn_a"), {"from_session": "sesn_a"}),
        (events.sandbox_detached("sbx_1", "main"), {"sandbox_id": "sbx_1", "name": "main"}),
        (events.brain_parked(attempts=3), {"attempts": 3}),
        (events.harness_switched("bash-only"), {"harness": "bash-only"}),
    ],
)
def test_each_constructor_writes_its_fields(event, expected):
    assert expected.items() <= event.items()


def test_every_constructed_type_is_in_the_catalogue():
    from sessions.event_types import KNOWN_TYPES

    made = [
        events.status_running(),
        events.status_idle("end_turn"),
        events.status_terminated(),
        events.session_error("unknown_error", "x", retry="terminal"),
        events.session_usage({}),
        events.session_updated(title="t"),
        events.session_deleted(),
        events.model_request_start(through_seq=0),
        events.model_request_end("sevt_1", error="x"),
        events.tool_result("sevt_1", "x", is_error=True),
        events.brain_recovered(woken_by="event"),
        events.brain_parked(attempts=1),
        events.harness_switched("claude"),
        events.sandbox_provisioned("sbx_1", "main", provider="docker", pooled=False),
        events.sandbox_failed("main", "x"),
        events.sandbox_attached("sbx_1", "main"),
        events.sandbox_detached("sbx_1", "main"),
        events.sandbox_terminated("sbx_1", "main"),
        events.fork_created("sesn_a", through_seq=3),
    ]
    assert {event["type"] for event in made} <= KNOWN_TYPES
