"""bench/common/app.py is the one module of bench/ that calls the platform's services; these calls keep it
in step with their signatures (`make bench` is not part of `make test`, so nothing else would notice)."""

from __future__ import annotations

import pytest

from bench.common import app
from kernel.auth import api_key_from_headers
from sessions.models import Event, Session

pytestmark = pytest.mark.django_db


def test_the_benchmarks_helpers_make_an_agent_an_environment_and_a_session_with_its_first_message():
    agent = app.new_agent("bench test", description="made by the benchmarks' helper")
    environment = app.new_environment(
        "bench test env", {"type": "cloud", "networking": {"type": "unrestricted"}}
    )
    session_id = app.new_session("hello", agent=agent, environment=environment)

    session = Session.objects.get(id=session_id)
    assert (session.agent_id, session.environment_id) == (agent, environment)
    first = Event.objects.filter(session_id=session_id, type="user.message").get()
    assert first.payload["content"][0]["text"] == "hello"


def test_a_session_without_arguments_gets_an_agent_and_environment_of_its_own():
    one, two = app.new_session(), app.new_session()
    assert Session.objects.get(id=one).environment_id != Session.objects.get(id=two).environment_id
    assert app.event_uid().startswith("sevt_")
    key = app.new_api_key("bench test")
    assert api_key_from_headers({"x-api-key": key}).name == "bench test"
