"""A used sandbox is never handed out as a fresh pooled one (issue 13, item 1), through the official SDK
against the live server, a real Celery worker and Docker, exactly as it was reproduced."""

from __future__ import annotations

import time

import anthropic
import httpx
import pytest

from tests.harness.test_sdk_turns import TOOLSET, of, say, turn

# A brain worker and the server write at once: PostgreSQL's pass runs it (SQLite would lock).
pytestmark = [pytest.mark.server, pytest.mark.postgres]


@pytest.fixture
def sdk(live_server_url, api_key, brain_worker, docker_engine):
    return anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=60)


def _hands(live_server_url: str, api_key: str, session_id: str) -> list[dict]:
    response = httpx.get(
        f"{live_server_url}/v1/sessions/{session_id}/sandboxes", headers={"x-api-key": api_key}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.json()["data"]


def _wait_for_pool(live_server_url: str, api_key: str, environment_id: str, *, not_ids: set[str]) -> None:
    """Until the environment's warm pool holds a ready sandbox other than `not_ids` (the refill is a task)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        free = httpx.get(
            f"{live_server_url}/v1/sandboxes",
            params={"free": "true"},
            headers={"x-api-key": api_key},
            timeout=30,
        ).json()["data"]
        if any(
            s["environment_id"] == environment_id and s["status"] == "ready" and s["id"] not in not_ids
            for s in free
        ):
            return
        time.sleep(0.2)
    raise AssertionError("the warm pool was not refilled within 120 s")


def test_a_detached_sandbox_is_not_handed_to_a_new_session_as_a_pooled_one(sdk, live_server_url, api_key):
    agent = sdk.beta.agents.create(name="pool", model="claude-sonnet-5-5", tools=[TOOLSET])
    env = sdk.beta.environments.create(name="pooled", config={"type": "cloud", "sandbox": {"warm_pool": 1}})
    _wait_for_pool(live_server_url, api_key, env.id, not_ids=set())

    first = sdk.beta.sessions.create(agent=agent.id, environment_id=env.id)
    events = turn(sdk, first.id, [say("/bash echo secret-of-A > /tmp/leak.txt && echo written")])
    assert "written" in of(events, "agent.tool_result")[0].content[0].text
    [held] = _hands(live_server_url, api_key, first.id)
    detached = httpx.post(
        f"{live_server_url}/v1/sessions/{first.id}/sandboxes/{held['id']}/detach",
        headers={"x-api-key": api_key},
        json={},
        timeout=30,
    )
    assert detached.status_code == 200, detached.text
    _wait_for_pool(live_server_url, api_key, env.id, not_ids={held["id"]})

    second = sdk.beta.sessions.create(agent=agent.id, environment_id=env.id)
    events = turn(sdk, second.id, [say("/bash cat /tmp/leak.txt; echo done")])
    output = of(events, "agent.tool_result")[0].content[0].text
    assert "done" in output
    assert "secret-of-A" not in output, "session B read session A's file from a reused sandbox"
    [main] = _hands(live_server_url, api_key, second.id)
    assert main["name"] == "main" and main["id"] != held["id"]
    logged = httpx.get(
        f"{live_server_url}/v1/sessions/{second.id}/events",
        params={"limit": 1000},
        headers={"x-api-key": api_key},
        timeout=30,
    ).json()["data"]
    assert [e["sandbox_id"] for e in logged if e["type"] == "sandbox.provisioned"] == [main["id"]]
    free = httpx.get(
        f"{live_server_url}/v1/sandboxes", params={"free": "true"}, headers={"x-api-key": api_key}, timeout=30
    ).json()["data"]
    assert held["id"] in {s["id"] for s in free}, "the detached sandbox stays free for an explicit attach"
