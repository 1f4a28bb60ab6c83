"""The fragment endpoint the timeline and the player load, through Django's test client (no browser)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from sessions.services import emit_event
from tests.conftest import make_session, operator_of
from workbench.ui.views.timeline import parse_slice

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator_client(client):
    client.force_login(operator_of(User.objects.create_user("op", password="x", is_staff=True)))
    return client


def seqs(response) -> list[int]:
    return [int(seq) for seq in re.findall(r'data-seq="(\d+)"', response.content.decode())]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("start=2&stop=5", [2, 3, 4]),
        ("start=-3", [7, 8, 9]),
        ("start=-3&stop=-1", [7, 8]),
        ("start=8&stop=50", [8, 9]),
        ("start=12", []),
    ],
)
def test_a_fragment_is_the_slice_with_python_semantics_and_says_how_it_resolved(
    operator_client, query, expected
):
    session_id = make_session()
    for i in range(10):
        emit_event(session_id, {"type": "system.message", "content": [{"type": "text", "text": f"m{i}"}]})
    response = operator_client.get(f"/sessions/{session_id}/events?{query}")
    assert response.status_code == 200
    assert seqs(response) == expected
    assert response["X-Session-Length"] == "10"
    if expected:
        assert (int(response["X-Slice-Start"]), int(response["X-Slice-Stop"])) == (
            expected[0],
            expected[-1] + 1,
        )


def test_a_fragment_is_refused_without_an_operator_login_and_names_a_bad_bound(client, operator_client):
    session_id = make_session()
    from django.test import Client

    anonymous = Client()
    assert anonymous.get(f"/sessions/{session_id}/events", HTTP_X_WORKBENCH_FRAGMENT="1").status_code == 401
    assert anonymous.get(f"/sessions/{session_id}/events")["Location"].startswith("/login/?next=")
    bad = operator_client.get(f"/sessions/{session_id}/events?start=x")
    assert bad.status_code == 400 and "'start' must be an integer" in bad.content.decode()
    assert operator_client.get("/sessions/sesn_nope/events").status_code == 404


def test_a_tool_call_answered_after_its_slice_renders_without_its_buttons(operator_client):
    session_id = make_session()
    call = emit_event(
        session_id,
        {"type": "agent.tool_use", "name": "bash", "input": {"command": "ls"}, "evaluated_permission": "ask"},
    )
    page = operator_client.get(f"/sessions/{session_id}/events?start=0&stop=1").content.decode()
    assert "Allow" in page
    emit_event(session_id, {"type": "user.tool_confirmation", "tool_use_id": call.uid, "result": "allow"})
    page = operator_client.get(f"/sessions/{session_id}/events?start=0&stop=2").content.decode()
    assert "Allow</button>" not in page and "The answer is further down" in page


@pytest.mark.parametrize(
    ("text", "bounds"),
    [
        ("120:180", (120, 180)),
        ("-50:", (-50, None)),
        (":100", (None, 100)),
        ("7", (7, 8)),
        ("-1", (-1, None)),
        ("", (None, None)),
    ],
)
def test_a_replay_slice_reads_like_python(text, bounds):
    assert parse_slice(text) == bounds
