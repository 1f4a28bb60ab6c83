"""The official `anthropic` SDK against the real server (Daphne), unchanged."""

from __future__ import annotations

import threading
import time

import anthropic
import pytest
from django.utils import timezone

from tests.conftest import make_agent, make_environment

pytestmark = pytest.mark.server


@pytest.fixture
def sdk(live_server_url, api_key):
    return anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=30)


def test_sdk_creates_retrieves_and_lists_agents_environments_and_sessions(sdk):
    agent = sdk.beta.agents.create(
        name="sdk agent",
        model="claude-sonnet-5-5",
        system="You help.",
        tools=[{"type": "agent_toolset_20260401"}],
    )
    assert agent.id.startswith("agent_") and agent.version == 1 and agent.model.id == "claude-sonnet-5-5"
    assert sdk.beta.agents.retrieve(agent.id).name == "sdk agent"
    updated = sdk.beta.agents.update(agent.id, system="You help briefly.", version=1)
    assert updated.version == 2
    assert [a.id for a in sdk.beta.agents.list()] == [agent.id]

    env = sdk.beta.environments.create(
        name="sdk env", config={"type": "cloud", "networking": {"type": "unrestricted"}}
    )
    assert env.id.startswith("env_") and sdk.beta.environments.retrieve(env.id).name == "sdk env"
    assert [e.id for e in sdk.beta.environments.list()] == [env.id]

    session = sdk.beta.sessions.create(agent=agent.id, environment_id=env.id, title="first")
    assert session.status == "idle" and session.agent.version == 2
    assert sdk.beta.sessions.retrieve(session.id).title == "first"
    pinned = sdk.beta.sessions.create(
        agent={"type": "agent", "id": agent.id, "version": 1}, environment_id=env.id
    )
    assert pinned.agent.version == 1
    assert {s.id for s in sdk.beta.sessions.list()} == {session.id, pinned.id}
    with pytest.raises(anthropic.NotFoundError):
        sdk.beta.sessions.retrieve("sesn_nope")
    with pytest.raises(anthropic.BadRequestError) as error:
        sdk.beta.sessions.create(
            agent=agent.id, environment_id=env.id, initial_events=[{"type": "user.interrupt"}]
        )
    assert "initial_events" in str(error.value)


def test_sdk_sends_and_lists_events_across_several_pages(sdk):
    session = sdk.beta.sessions.create(agent=make_agent(), environment_id=make_environment())
    for batch in range(3):
        sdk.beta.sessions.events.send(
            session.id,
            events=[
                {"type": "system.message", "content": [{"type": "text", "text": f"{batch}-{i}"}]}
                for i in range(5)
            ],
        )
    page = sdk.beta.sessions.events.list(session.id, limit=4)
    assert len(page.data) == 4 and page.next_page
    texts = [event.content[0].text for event in sdk.beta.sessions.events.list(session.id, limit=4)]
    assert texts == [f"{b}-{i}" for b in range(3) for i in range(5)]
    only = sdk.beta.sessions.events.list(session.id, types=["system.message"], order="desc", limit=1000)
    assert only.data[0].content[0].text == "2-4"


def test_sdk_stream_receives_the_events_sent_after_it_opened(sdk):
    session = sdk.beta.sessions.create(agent=make_agent(), environment_id=make_environment())
    sdk.beta.sessions.events.send(
        session.id, events=[{"type": "system.message", "content": [{"type": "text", "text": "before"}]}]
    )
    received: list[str] = []
    opened = threading.Event()

    def read() -> None:
        with sdk.beta.sessions.events.stream(session.id) as stream:
            opened.set()
            for event in stream:
                if event.type == "system.message":
                    received.append(event.content[0].text)
                    if len(received) == 3:
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(20)
    time.sleep(0.2)
    for text in ("one", "two", "three"):
        sdk.beta.sessions.events.send(
            session.id, events=[{"type": "system.message", "content": [{"type": "text", "text": text}]}]
        )
    reader.join(20)
    assert received == ["one", "two", "three"]


def test_a_stream_whose_api_key_is_revoked_ends_with_an_error_the_sdk_raises(live_server_url, api_key):
    from kernel.models import ApiKey, hash_key

    sdk = anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=30)
    session = sdk.beta.sessions.create(agent=make_agent(), environment_id=make_environment())
    with sdk.beta.sessions.events.stream(session.id) as stream:
        time.sleep(1.5)  # past a few re-checks (0.5 s here), which a valid key passes
        sdk.beta.sessions.events.send(
            session.id,
            events=[{"type": "system.message", "content": [{"type": "text", "text": "still here"}]}],
        )
        assert (
            next(event for event in stream if event.type == "system.message").content[0].text == "still here"
        )
        ApiKey.objects.filter(key_hash=hash_key(api_key)).update(revoked_at=timezone.now())
        started = time.monotonic()
        with pytest.raises(anthropic.APIStatusError, match="No valid API key"):
            for _ in stream:
                assert time.monotonic() - started < 20, "the stream went on after its key was revoked"


def test_the_api_over_daphne_refuses_a_host_outside_allowed_hosts_in_its_error_envelope(
    live_server_url, api_key
):
    """/v1 runs without Django's middleware under ASGI (workbench/asgi.py); the host is still checked."""
    import httpx

    headers = {"x-api-key": api_key, "host": "evil.example"}
    for method, path in (
        ("GET", "/v1/sessions"),
        ("POST", "/v1/agents"),
        ("GET", "/v1/sessions/x/events/stream"),
    ):
        response = httpx.request(method, f"{live_server_url}{path}", headers=headers, json={}, timeout=30)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and "evil.example" in error["message"]
    assert (
        httpx.get(f"{live_server_url}/v1/sessions", headers={"x-api-key": api_key}, timeout=30).status_code
        == 200
    )
