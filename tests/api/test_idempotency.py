"""`Idempotency-Key` on /v1 POSTs, the 5xx envelope, and the sweeper's one queued wake (issue 13, item 4)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kernel.models import IdempotentRequest
from sessions.models import Event, Session
from tests.conftest import make_agent, make_environment


def _post(client: Any, api_key: str, path: str, body: dict, *, key: str | None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(path, json.dumps(body).encode(), content_type="application/json", **headers)


def _message(text: str) -> dict:
    return {"events": [{"type": "user.message", "content": [{"type": "text", "text": text}]}]}


def test_a_retried_send_with_the_same_idempotency_key_returns_the_first_answer_and_appends_once(
    client, api_key, session_id
):
    first = _post(client, api_key, f"/v1/sessions/{session_id}/events", _message("once"), key="retry-1")
    again = _post(client, api_key, f"/v1/sessions/{session_id}/events", _message("once"), key="retry-1")
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Event.objects.filter(session_id=session_id, type="user.message").count() == 1
    other = _post(client, api_key, f"/v1/sessions/{session_id}/events", _message("once"), key="retry-2")
    assert other.json() != first.json()
    assert Event.objects.filter(session_id=session_id, type="user.message").count() == 2


def test_a_create_retried_with_its_key_makes_one_agent(client, api_key):
    from harness.models import Agent

    body = {"name": "once", "model": "claude-sonnet-5-5"}
    first = _post(client, api_key, "/v1/agents", body, key="agent-create")
    again = _post(client, api_key, "/v1/agents", body, key="agent-create")
    assert first.json()["id"] == again.json()["id"] and Agent.objects.count() == 1


def test_an_idempotency_key_reused_for_another_request_is_refused_and_changes_nothing(
    client, api_key, session_id
):
    from harness.models import Agent

    _post(client, api_key, f"/v1/sessions/{session_id}/archive", {}, key="k")
    agents = Agent.objects.count()
    refused = _post(client, api_key, "/v1/agents", {"name": "a", "model": "claude-sonnet-5-5"}, key="k")
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    assert "different request" in refused.json()["error"]["message"]
    assert Agent.objects.count() == agents


def test_a_request_refused_with_an_error_frees_its_key_for_the_corrected_request(client, api_key):
    bad = _post(client, api_key, "/v1/agents", {"name": "a"}, key="fix-me")
    assert bad.status_code == 400
    assert not IdempotentRequest.objects.filter(key="fix-me").exists()
    good = _post(client, api_key, "/v1/agents", {"name": "a", "model": "claude-sonnet-5-5"}, key="fix-me")
    assert good.status_code == 200


def test_a_request_whose_first_try_is_still_running_gets_a_retryable_409(client, api_key):
    body = {"name": "slow", "model": "claude-sonnet-5-5"}
    probe = _post(client, api_key, "/v1/agents", body, key="probe")
    assert probe.status_code == 200
    IdempotentRequest.objects.filter(key="probe").update(status=None)  # as while the first one runs
    running = _post(client, api_key, "/v1/agents", body, key="probe")
    assert running.status_code == 409 and running.get("x-should-retry") != "false"
    assert "still being processed" in running.json()["error"]["message"]


def test_a_key_of_another_api_key_is_not_shared(client, api_key):
    from kernel.keys import api_key_create

    other = api_key_create(name="other")[1]
    body = {"name": "mine", "model": "claude-sonnet-5-5"}
    first = _post(client, api_key, "/v1/agents", body, key="shared")
    second = _post(client, other, "/v1/agents", body, key="shared")
    assert first.json()["id"] != second.json()["id"]


def test_an_idempotency_key_that_is_not_printable_ascii_is_a_400(client, api_key):
    response = _post(
        client, api_key, "/v1/agents", {"name": "a", "model": "claude-sonnet-5-5"}, key="x" * 256
    )
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["error"]["message"]


def test_an_unexpected_error_in_a_handler_is_a_500_in_the_error_envelope(client, api_key, monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr("harness.api.agents.agent_create", broken)
    response = _post(client, api_key, "/v1/agents", {"name": "a", "model": "claude-sonnet-5-5"}, key=None)
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert response["request-id"] in error["error"]["message"]


def _queued_wakes(redis_url: str, session_id: str) -> int:
    import redis

    count = 0
    for raw in redis.Redis.from_url(redis_url).lrange("celery", 0, -1):
        message = json.loads(raw)
        if message["headers"].get("task") != "harness.tasks.wake":
            continue
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        count += args == [session_id]
    return count


@pytest.mark.redis
def test_the_sweeper_keeps_at_most_one_wake_queued_per_session(transactional_db, redis_url, settings):
    from datetime import timedelta

    from django.utils import timezone

    from harness.lease import lease_acquire, lease_release
    from harness.services.lifecycle import session_create
    from harness.tasks import sweep

    session = session_create(
        **{
            "agent": make_agent(),
            "environment_id": make_environment(),
            "initial_events": [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}],
        }
    )
    assert Session.objects.get(id=session.id).status == "running"
    long_ago = timezone.now() - timedelta(minutes=5)
    Session.objects.filter(id=session.id).update(updated_at=long_ago)
    before = _queued_wakes(redis_url, session.id)
    sweep()
    sweep()
    sweep()
    assert _queued_wakes(redis_url, session.id) - before == 1
    lease = lease_acquire(session.id, owner="test", seconds=0.001)
    assert lease is not None and Session.objects.get(id=session.id).wake_queued_at is None
    lease_release(lease, clean=False)
    Session.objects.filter(id=session.id).update(updated_at=long_ago)
    sweep()
    assert _queued_wakes(redis_url, session.id) - before == 2, (
        "once a brain took the lease, the sweeper queues again"
    )


@pytest.mark.redis
def test_a_broker_that_lost_its_queue_gets_every_waiting_wake_again_at_the_next_sweep(
    transactional_db, redis_url, settings
):
    """Redis restarted without persistence (as `make run` runs it) forgets the wakes it held; the sweeper
    notices its own mark is gone and queues them again at once, not after the grace (2 x LEASE_SECONDS) or
    WAKE_REQUEUE_SECONDS that otherwise keep a session from being queued twice."""
    import redis

    from harness.services.lifecycle import session_create
    from harness.tasks import sweep

    broker = redis.Redis.from_url(redis_url)
    session = session_create(
        agent=make_agent(),
        environment_id=make_environment(),
        initial_events=[{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}],
    )
    sweep()  # the broker now holds the sweeper's mark (and perhaps one wake more)
    broker.flushdb()  # the restart: the wake the message queued is gone, and so is the mark
    assert _queued_wakes(redis_url, session.id) == 0
    sweep()
    assert _queued_wakes(redis_url, session.id) == 1, "the running session was not woken again at once"
    sweep()
    assert _queued_wakes(redis_url, session.id) == 1, "while the broker remembers, one wake is enough"
    broker.flushdb()  # again, now that the sweeper itself had queued it (wake_queued_at is set)
    sweep()
    assert _queued_wakes(redis_url, session.id) == 1


@pytest.mark.redis
def test_a_process_forked_after_queueing_a_wake_queues_its_own(redis_url):
    """A worker's main process queues wakes (for a dead pool process's sessions) and then forks pool
    processes. kombu closes the connection pools a child inherits, so the child must make its own: with the
    parent's closed pool every wake the child queued failed ("Acquire on closed pool", found by bench/chaos)
    and its sessions waited for the sweeper."""
    import os

    from billiard.util import _run_after_forkers

    from harness.tasks import queue_wake

    session_id = f"sesn_fork_{os.getpid()}"
    assert queue_wake(session_id)
    child = os.fork()
    if child == 0:  # the child, as Celery's prefork pool starts one; its exit status is the answer
        _run_after_forkers()
        os._exit(0 if queue_wake(session_id) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked process could not queue its wake"
    assert _queued_wakes(redis_url, session_id) == 2
