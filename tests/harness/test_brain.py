"""A brain in-process against the offline model: bad input becomes clear events, never a hung session."""

from __future__ import annotations

import re

import pytest
from django.test import override_settings

from harness.brain import run_brain
from harness.services.lifecycle import session_archive, session_create, session_send_events
from harness.tasks import wake
from sessions.models import Session
from sessions.selectors import get_events
from tests.conftest import make_agent, make_environment

pytestmark = pytest.mark.django_db(transaction=True)


def session_with(**agent) -> str:
    return session_create(**{"agent": make_agent(**agent), "environment_id": make_environment()}).id


def say(session_id: str, text: str) -> None:
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
    )


def log(session_id: str) -> list:
    return get_events(session_id)


def test_a_tool_the_agent_does_not_have_becomes_an_error_result(model_url):
    session_id = session_with()
    say(session_id, '/tool launch_rockets {"count": 3}')
    assert run_brain(session_id) == "idle"
    [result] = [e for e in log(session_id) if e.type == "agent.tool_result"]
    assert (
        result.payload["is_error"] and "Unknown tool 'launch_rockets'" in result.payload["content"][0]["text"]
    )
    assert log(session_id)[-1].type == "session.status_idle"


def test_tool_input_that_fails_its_schema_becomes_an_error_result(model_url):
    session_id = session_with(tools=[{"type": "agent_toolset_20260401"}])
    say(session_id, '/tool read {"view_range": [1, 2]}')
    run_brain(session_id)
    [result] = [e for e in log(session_id) if e.type == "agent.tool_result"]
    assert (
        result.payload["is_error"]
        and "missing the required field 'file_path'" in result.payload["content"][0]["text"]
    )


def test_a_stream_cut_off_midway_is_retried_and_recorded_once(model_url):
    model_url.inject_fault("broken_stream", count=1)
    session_id = session_with()
    say(session_id, "hello")
    run_brain(session_id)
    events = log(session_id)
    errors = [e for e in events if e.type == "session.error"]
    assert [e.payload["error"]["type"] for e in errors] == ["model_request_failed_error"]
    assert errors[0].payload["error"]["retry_status"] == {"type": "retrying"}
    messages = [e for e in events if e.type == "agent.message"]
    assert [m.payload["content"][0]["text"] for m in messages] == ["You said: hello"]
    assert events[-1].type == "session.status_idle"
    assert [e.seq for e in events] == list(range(len(events)))


def test_retries_exhausted_leave_the_session_idle_with_that_reason(model_url):
    model_url.inject_fault("429", count=20)
    session_id = session_with()
    say(session_id, "hello")
    with override_settings(MODEL_RETRIES=2):
        run_brain(session_id)
    events = log(session_id)
    statuses = [e.payload["error"]["retry_status"]["type"] for e in events if e.type == "session.error"]
    assert statuses == ["retrying", "retrying", "exhausted"]
    assert events[-1].payload["stop_reason"] == {"type": "retries_exhausted"}
    assert Session.objects.get(id=session_id).status == "idle"


def test_wake_on_a_missing_or_archived_session_does_nothing(model_url):
    assert wake("sesn_missing") == "gone"
    session_id = session_with()
    session_archive(session_id)
    before = len(log(session_id))
    assert wake(session_id) == "gone"
    assert len(log(session_id)) == before


def test_the_lease_brings_the_agent_and_environment_and_is_refused_to_a_closed_session(model_url):
    from harness.lease import lease_acquire, lease_release
    from sessions.models import Session

    session_id = session_with()
    lease = lease_acquire(session_id, owner="me", seconds=60)
    session = Session.objects.select_related("environment").get(id=session_id)
    assert lease.agent == session.agent_snapshot and lease.environment == (session.environment.config or {})
    lease_release(lease)
    Session.objects.filter(id=session_id).update(status="terminated")
    assert lease_acquire(session_id, owner="me", seconds=60) is None
    assert wake(session_id) == "gone"


def test_a_lease_brings_the_log_after_a_seq_and_a_refused_one_brings_nothing(model_url):
    from harness.lease import lease_acquire, lease_release

    session_id = session_with()
    for text in ("one", "two", "three"):
        say(session_id, text)
    lease = lease_acquire(session_id, owner="me", seconds=60, read_after=0)
    assert [(e.seq, e.payload["content"][0]["text"]) for e in lease.events] == [(1, "two"), (2, "three")]
    assert [e.pk for e in lease.events] == [e.pk for e in log(session_id)[1:]]
    assert lease.events[0].processed_at == log(session_id)[1].processed_at
    assert lease_acquire(session_id, owner="other", seconds=60, read_after=-1) is None
    lease_release(lease)
    assert lease_acquire(session_id, owner="me", seconds=60, read_after=2).events == []


def test_a_brain_that_loses_its_lease_while_its_request_goes_out_stops_and_closes_the_stream(
    model_url, streams, monkeypatch
):
    """The request goes out while its start is written (harness/model.py, `meanwhile`): a brain whose lease
    another brain took meanwhile has its start refused, stops, and closes the model's stream unread."""
    from django.db.models import F

    from harness import brain as brains

    session_id = session_with()
    say(session_id, "hello")
    real_emit = brains.emit_events

    def emit(session, items, **kwargs):
        if any(event["type"] == "span.model_request_start" for event, _ in items):
            assert streams.sent.wait(10), "the request was not out while its start was written"
            Session.objects.filter(id=session).update(lease_epoch=F("lease_epoch") + 1)  # another brain
        return real_emit(session, items, **kwargs)

    monkeypatch.setattr(brains, "emit_events", emit)
    before = [e.type for e in log(session_id)]
    assert run_brain(session_id) == "lease lost"
    assert streams.closed.wait(10) and len(streams.opened) == 1
    assert [e.type for e in log(session_id)] == before  # the stale brain wrote nothing


def test_a_second_brain_finds_the_lease_taken_and_writes_nothing(model_url):
    from harness.lease import lease_acquire

    session_id = session_with()
    say(session_id, "hello")
    assert lease_acquire(session_id, owner="other", seconds=60) is not None
    assert run_brain(session_id) == "busy"
    assert [e.type for e in log(session_id)] == ["user.message"]


def test_the_window_strategy_shows_the_model_a_slice_and_changes_no_event(model_url, monkeypatch):
    from harness.context import messages_from_events
    from harness.harnesses import steps

    shown: list[list] = []
    real = steps.stream_response

    def recording(request, **kwargs):
        shown.append(request["messages"])
        return real(request, **kwargs)

    monkeypatch.setattr(steps, "stream_response", recording)
    session_id = session_with(context={"type": "window", "last_events": 4})
    for text in ("one", "two", "three"):
        say(session_id, text)
        run_brain(session_id)
    events = log(session_id)
    assert [m.payload["content"][0]["text"] for m in events if m.type == "agent.message"] == [
        "You said: one",
        "You said: two",
        "You said: three",
    ]
    assert [e.seq for e in events] == list(range(len(events)))
    # Each request showed the last 4 events of the log its span says it read, and no earlier one.
    starts = [e for e in events if e.type == "span.model_request_start"]
    assert len(starts) == len(shown) == 3
    for start, messages in zip(starts, shown, strict=True):
        through = start.payload["through_seq"]
        assert messages == messages_from_events(events[: through + 1][-4:])
    assert "one" not in str(shown[-1]) and "three" in str(shown[-1])


def test_compaction_summarises_older_events_and_keeps_them(model_url):
    session_id = session_with(context={"type": "compaction", "trigger_events": 12, "keep_events": 6})
    for i in range(4):
        say(session_id, f"message {i}")
        run_brain(session_id)
    events = log(session_id)
    compacted = [e for e in events if e.type == "agent.thread_context_compacted"]
    assert compacted and compacted[0].payload["summary"].startswith("You said: Summarise")
    assert [e.payload["content"][0]["text"] for e in events if e.type == "user.message"] == [
        f"message {i}" for i in range(4)
    ]


def test_a_later_wake_reads_only_new_events_and_folds_the_same_state_as_a_fresh_read(model_url):
    from harness.cache import known_logs
    from harness.fold import fold
    from sessions.services import emit_event

    session_id = session_with()
    say(session_id, "first")
    assert run_brain(session_id) == "idle"
    # Appended behind the brain's back (another process would do the same): the next wake must see it.
    emit_event(session_id, {"type": "system.message", "content": [{"type": "text", "text": "a note"}]})
    say(session_id, "second")
    from django.db import connection

    known_before = known_logs._logs[session_id].state.last_seq
    reads: list[tuple[str, list]] = []

    def note(execute, sql, params, many, context):
        if re.search(r'(FROM|JOIN) "?agent_sessions_event"? ', sql) and "INSERT" not in sql:
            reads.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(note):
        assert run_brain(session_id) == "idle"
    # Every read of the log this wake asked for events after a seq it knew (the first with the lease, on
    # PostgreSQL in the same statement); none read the log from the start.
    assert reads and all(re.search(r'"?seq"? > %s', sql) for sql, _ in reads), reads
    assert all(params[-1] >= known_before for _, params in reads), reads
    events, state = known_logs.pop(session_id)
    fresh = fold(log(session_id))
    assert [e.seq for e in events] == list(range(len(log(session_id))))
    for name in ("status", "last_seq", "consumed_through", "idle_through", "harness", "usage"):
        assert getattr(state, name) == getattr(fresh, name), name
    assert [e.payload for e in events] == [e.payload for e in log(session_id)]
    [note] = [e for e in events if e.type == "system.message"]
    assert state.consumed_through > note.seq  # the second turn's model request saw it


def test_the_hands_note_asks_the_database_only_once_the_log_shows_a_sandbox(django_assert_num_queries):
    from harness.fold import fold
    from harness.harnesses.steps import hands_note
    from sessions.services import emit_event

    session_id = session_with()
    say(session_id, "hello")
    state = fold(log(session_id))
    assert not state.hands_seen
    with django_assert_num_queries(0):
        assert "no sandbox yet" in hands_note(session_id, logged=state.hands_seen)
    emit_event(session_id, {"type": "sandbox.failed", "name": "main", "reason": "the engine is down"})
    state = fold(log(session_id))
    assert state.hands_seen
    with django_assert_num_queries(1):
        assert "no sandbox yet" in hands_note(session_id, logged=state.hands_seen)
