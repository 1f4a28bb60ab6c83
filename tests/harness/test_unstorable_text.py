"""What the model and the tools produce is stored whatever it holds, and a wake that keeps failing ends
parked idle: no session is wedged for good. Brains in-process against the offline model; tool calls in real
Docker sandboxes. On PostgreSQL (`make test`) and on SQLite."""

from __future__ import annotations

import pytest
from django.test import override_settings

from harness.brain import has_pending_work, run_brain
from harness.services.lifecycle import session_create, session_send_events
from harness.tasks import wake
from sandboxes.models import Environment
from sessions.models import Session
from sessions.selectors import get_events
from sessions.services import emit_event
from tests.conftest import make_agent, make_environment

pytestmark = pytest.mark.django_db(transaction=True)
TOOLSET = [{"type": "agent_toolset_20260401"}]


@pytest.fixture
def sandboxed(model_url, docker_engine):
    with override_settings(SANDBOX_PROVIDER="docker"):
        yield model_url


def new_session(**agent) -> str:
    return session_create(**{"agent": make_agent(**agent), "environment_id": make_environment()}).id


def say(session_id: str, text: str) -> None:
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
    )


def turn(session_id: str, text: str) -> list:
    before = len(get_events(session_id))
    say(session_id, text)
    assert run_brain(session_id) == "idle"
    return get_events(session_id, before)


def assert_ended_well(events: list) -> None:
    assert not [e.payload["error"] for e in events if e.type == "session.error"]
    assert events[-1].type == "session.status_idle" and events[-1].payload["stop_reason"] == {
        "type": "end_turn"
    }


def results(events: list) -> list[tuple[str, bool]]:
    return [
        (e.payload["content"][0]["text"], e.payload["is_error"])
        for e in events
        if e.type == "agent.tool_result"
    ]


@pytest.mark.parametrize("escape", ["\\u0000", "\\ud800"])
def test_a_tool_input_the_database_or_the_model_cannot_take_is_stored_spelled_out(sandboxed, escape):
    """The model's own output: `/tool write` with a NUL (PostgreSQL's DataError on every wake) or an unpaired
    surrogate (on SQLite, every later model request failed to encode) in its input."""
    session_id = new_session(tools=TOOLSET)
    events = turn(
        session_id, f'/tool write {{"file_path": "n.txt", "content": "a{escape}b"}}\n/bash cat n.txt'
    )
    assert_ended_well(events)
    [write] = [e for e in events if e.type == "agent.tool_use" and e.payload["name"] == "write"]
    assert write.payload["input"]["content"] == f"a{escape}b"  # the six characters, not the one
    [(created, failed), (content, _)] = results(events)
    assert not failed and created.startswith("Created") and content == f"a{escape}b"
    assert_ended_well(turn(session_id, "and now?"))
    assert Session.objects.get(id=session_id).status == "idle"


def test_tool_results_with_a_nul_or_a_file_name_that_is_not_utf8_are_stored_spelled_out(sandboxed):
    """`read` shows a NUL past the part it sniffs for binary files, and lists a name with a byte that is not
    UTF-8 as an unpaired surrogate (Python's surrogateescape)."""
    session_id = new_session(tools=TOOLSET)
    events = turn(
        session_id,
        "\n".join(
            [
                r"/bash printf '%9000s\n' x > big.txt && printf 'tail\0end\n' >> big.txt && touch $'\xff.txt'",
                '/tool read {"file_path": "big.txt", "view_range": [2, 2]}',
                '/tool read {"file_path": "."}',
            ]
        ),
    )
    assert_ended_well(events)
    [_, (line, _), (listing, _)] = results(events)
    assert line.endswith("tail\\u0000end")
    assert "\\udcff.txt" in listing.splitlines()
    assert_ended_well(turn(session_id, "and now?"))


def test_a_wake_that_keeps_failing_is_parked_idle_and_a_later_message_works_once_the_cause_is_gone(model_url):
    """A row that makes every wake raise (an environment config of the wrong shape, as an older version or a
    hand in the database may leave it): after WAKE_CRASH_LIMIT crashes the next wake parks the session."""
    session_id = new_session()
    environment = Environment.objects.get(sessions__id=session_id)
    good_config = environment.config
    Environment.objects.filter(pk=environment.pk).update(config={**good_config, "sandbox": "eager"})
    say(session_id, "hello")
    with override_settings(WAKE_CRASH_LIMIT=2):
        for _ in range(2):
            with pytest.raises(AttributeError):
                wake(session_id)
            assert Session.objects.get(id=session_id).status == "running" and has_pending_work(session_id)
        assert wake(session_id) == "idle"
    events = get_events(session_id)
    error, parked, idle = events[-3:]
    assert error.type == "session.error" and error.payload["error"]["retry_status"] == {"type": "terminal"}
    assert parked.type == "brain.parked" and parked.payload["attempts"] == 2
    assert idle.type == "session.status_idle" and idle.payload["stop_reason"] == {"type": "retries_exhausted"}
    session = Session.objects.get(id=session_id)
    assert session.status == "idle" and session.wake_attempts == 0 and not has_pending_work(session_id)

    Environment.objects.filter(pk=environment.pk).update(config=good_config)
    events = turn(session_id, "again")
    [answer] = [e.payload["content"][0]["text"] for e in events if e.type == "agent.message"]
    assert answer == "You said: hello\nagain"  # the parked message is answered with the new one
    assert_ended_well(events)


def test_a_log_no_brain_can_fold_is_parked_idle_not_left_running(model_url):
    """An event of a shape the fold trips on (`model_usage` a list). The fold was outside the wake's guard:
    every wake raised holding the lease, the crash limit never parked, and the session stayed running."""
    session_id = new_session()
    emit_event(
        session_id,
        {
            "type": "span.model_request_end",
            "model_request_start_id": "sevt_x",
            "is_error": False,
            "model_usage": ["not", "a", "mapping"],
        },
    )
    say(session_id, "hello")
    with override_settings(WAKE_CRASH_LIMIT=2):
        for _ in range(2):
            with pytest.raises(AttributeError):
                wake(session_id)
            assert has_pending_work(session_id)  # so the sweeper brings the next wake
        assert wake(session_id) == "parked"
    error, parked, idle = get_events(session_id)[-3:]
    assert (error.type, parked.type, idle.type) == ("session.error", "brain.parked", "session.status_idle")
    assert idle.payload["stop_reason"] == {"type": "retries_exhausted"}
    session = Session.objects.get(id=session_id)
    assert session.status == "idle" and session.wake_attempts == 0 and session.lease_expires_at is None
