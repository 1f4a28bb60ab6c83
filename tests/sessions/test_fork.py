"""Forking: a new session starting with a copy of events [0:N], recorded as a fork of its origin."""

from __future__ import annotations

import pytest

from sessions.models import Session
from sessions.selectors import get_events
from sessions.services import emit_event

pytestmark = pytest.mark.django_db


def test_a_fork_copies_the_first_n_events_and_records_its_origin(api, session_id):
    for i in range(6):
        emit_event(session_id, {"type": "system.message", "content": [{"type": "text", "text": str(i)}]})
    fork = api.post(f"/v1/sessions/{session_id}/fork", {"at_seq": 4, "harness": "bash-only"}).json()
    events = get_events(fork["id"])
    assert [e.payload.get("content", [{}])[0].get("text") for e in events[:4]] == ["0", "1", "2", "3"]
    assert [e.type for e in events[4:]] == ["fork.created", "brain.harness_switched"]
    assert events[4].payload == {"from_session": session_id, "through_seq": 4}
    assert {e.uid for e in events[:4]}.isdisjoint({e.uid for e in get_events(session_id)})
    assert [e.seq for e in events] == list(range(6))
    row = Session.objects.get(id=fork["id"])
    assert row.forked_from_id == session_id and row.forked_at_seq == 4
    assert len(get_events(session_id)) == 6


@pytest.mark.parametrize(
    ("body", "mentions"),
    [
        ({"at_seq": 99}, "from 0 to 0"),
        ({}, "'at_seq' is required"),
        ({"at_seq": 0, "harness": "nope"}, "'harness' must be one of"),
    ],
)
def test_a_bad_fork_is_refused_and_creates_nothing(api, session_id, body, mentions):
    response = api.post(f"/v1/sessions/{session_id}/fork", body)
    assert response.status_code == 400 and mentions in response.json()["error"]["message"]
    assert Session.objects.count() == 1
