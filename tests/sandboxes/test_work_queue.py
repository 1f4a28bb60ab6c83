"""The self-hosted work queue (reference §3.3, §5): poll, ack, heartbeat, stop, list, retrieve, update and
stats as the SDK's worker calls them, the credentials each takes, and lost workers' items back in the queue."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import anthropic
import pytest
import redis
from anthropic.lib.environments._poller import iter_work
from anthropic.types.beta.environments import BetaHeartbeatPreconditionFailedError
from django.conf import settings as django_settings
from django.utils import timezone

from sandboxes import work_queue
from sandboxes.models import Sandbox, WorkItem
from sandboxes.reaper import reap_idle
from sandboxes.tasks import sweep_work
from sandboxes.work import (
    add_work_lost_hook,
    add_work_stopped_hook,
    work_ensure,
    work_live,
    work_stop_for_session,
)
from sandboxes.work_keys import SessionsTokenPrincipal, environment_key_create
from sandboxes.work_queue import _lost_hooks, _stopped_hooks, work_enqueue_healthcheck, work_poll, work_sweep
from sandboxes.work_wake import channel
from sessions.models import Event, Session
from tests.conftest import in_thread, make_agent, make_environment, make_session, on_postgres, require

pytestmark = pytest.mark.django_db


@pytest.fixture
def env_id(db: Any) -> str:
    return make_environment(config={"type": "self_hosted"})


@pytest.fixture
def env_key(env_id: str) -> str:
    return environment_key_create(env_id, name="test worker")[1]


@pytest.fixture
def session(env_id: str) -> str:
    return make_session(environment_id=env_id)


class Caller:
    """Django's test client with one bearer credential."""

    def __init__(self, client: Any, token: str):
        self.client = client
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    def get(self, path: str, **headers: str) -> Any:
        return self.client.get(path, **self.headers, **headers)

    def post(self, path: str, body: Any = None) -> Any:
        data = b"" if body is None else json.dumps(body).encode()
        return self.client.post(path, data, content_type="application/json", **self.headers)

    def delete(self, path: str) -> Any:
        return self.client.delete(path, **self.headers)


@pytest.fixture
def worker(client: Any, env_key: str) -> Caller:
    return Caller(client, env_key)


@pytest.fixture
def operator(client: Any, api_key: str) -> Caller:
    return Caller(client, api_key)


def token_of(secret: str) -> str:
    payload = json.loads(base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4)))
    assert set(payload) == {"sessions_token"}
    return str(payload["sessions_token"])


def poll(worker: Caller, env_id: str, query: str = "", worker_id: str = "worker-a") -> Any:
    response = worker.get(f"/v1/environments/{env_id}/work/poll{query}", HTTP_ANTHROPIC_WORKER_ID=worker_id)
    assert response.status_code == 200, response.content
    return response.json()


def claimed(worker: Caller, env_id: str, session: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The session's item polled, acked and claimed by a first heartbeat; with its sessions token."""
    work_ensure(session)
    item = poll(worker, env_id)
    token = token_of(item["secret"])
    assert worker.post(f"/v1/environments/{env_id}/work/{item['id']}/ack").status_code == 200
    beat = worker.post(
        f"/v1/environments/{env_id}/work/{item['id']}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT"
    )
    assert beat.status_code == 200, beat.content
    return item, token, beat.json()


@pytest.fixture
def hooks() -> Iterator[dict[str, list[tuple[str, str]]]]:
    seen: dict[str, list[tuple[str, str]]] = {"lost": [], "stopped": []}

    def lost(session_id: str, work_id: str) -> None:
        seen["lost"].append((session_id, work_id))

    def stopped(session_id: str, work_id: str) -> None:
        seen["stopped"].append((session_id, work_id))

    add_work_lost_hook(lost)
    add_work_stopped_hook(stopped)
    yield seen
    _lost_hooks.remove(lost)
    _stopped_hooks.remove(stopped)


# -- poll


def test_a_poll_with_no_work_answers_json_null(worker, env_id):
    response = worker.get(f"/v1/environments/{env_id}/work/poll")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response.content == b"null"


def test_a_poll_hands_out_the_sessions_item_with_a_secret_carrying_a_sessions_token(worker, env_id, session):
    work_id = work_ensure(session)
    item = poll(worker, env_id)
    assert item["id"] == work_id and item["type"] == "work" and item["environment_id"] == env_id
    assert item["data"] == {"type": "session", "id": session}
    assert item["state"] == "queued" and item["metadata"] == {}
    assert token_of(item["secret"]).startswith(f"wbst_{work_id}.")
    row = WorkItem.objects.get(id=work_id)
    assert row.polled_by == "worker-a" and row.polled_at is not None
    assert item["secret"] not in json.dumps([list(e.payload.values()) for e in Event.objects.all()])


def test_a_handed_out_item_is_not_handed_out_again_until_reclaim_older_than_ms(worker, env_id, session):
    first = poll(worker, env_id)
    assert first is None
    work_ensure(session)
    first = poll(worker, env_id)
    assert poll(worker, env_id, "?reclaim_older_than_ms=60000") is None
    again = poll(worker, env_id, "?reclaim_older_than_ms=0", worker_id="worker-b")
    assert again["id"] == first["id"] and token_of(again["secret"]) != token_of(first["secret"])
    assert WorkItem.objects.get(id=first["id"]).polled_by == "worker-b"


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("?block_ms=0", "'block_ms' must be between 1 and 999, not '0'"),
        ("?block_ms=1000", "'block_ms' must be between 1 and 999, not '1000'"),
        ("?block_ms=soon", "'block_ms' must be an integer"),
        ("?reclaim_older_than_ms=-1", "'reclaim_older_than_ms' must be between 0 and 86400000"),
    ],
)
def test_a_poll_with_bad_parameters_is_a_400_naming_them(worker, env_id, query, said):
    response = worker.get(f"/v1/environments/{env_id}/work/poll{query}")
    assert response.status_code == 400
    assert said in response.json()["error"]["message"]


def test_polling_takes_the_environment_key_not_an_api_key(operator, env_id):
    refused = operator.get(f"/v1/environments/{env_id}/work/poll")
    assert refused.status_code == 403
    assert "environment's key" in refused.json()["error"]["message"]


def test_a_queue_only_exists_in_a_self_hosted_environment(operator, db):
    cloud = make_environment()
    response = operator.get(f"/v1/environments/{cloud}/work/stats")
    assert response.status_code == 400
    assert "not self-hosted" in response.json()["error"]["message"]
    assert operator.get("/v1/environments/env_nope/work/stats").status_code == 404


# -- ack


def test_ack_takes_a_polled_item_once_and_refuses_it_after(worker, env_id, session):
    work_id = work_ensure(session)
    never_polled = worker.post(f"/v1/environments/{env_id}/work/{work_id}/ack")
    assert never_polled.status_code == 409
    assert "not been handed out by a poll" in never_polled.json()["error"]["message"]
    poll(worker, env_id)
    acked = worker.post(f"/v1/environments/{env_id}/work/{work_id}/ack")
    assert acked.status_code == 200
    assert acked.json()["state"] == "starting" and acked.json()["acknowledged_at"]
    assert acked.json()["secret"] is None
    twice = worker.post(f"/v1/environments/{env_id}/work/{work_id}/ack")
    assert twice.status_code == 409
    assert "already acknowledged" in twice.json()["error"]["message"]
    assert WorkItem.objects.get(id=work_id).state == "starting"
    assert worker.post(f"/v1/environments/{env_id}/work/work_nope/ack").status_code == 404


# -- heartbeat


def test_the_first_heartbeat_claims_the_item_and_each_next_must_echo_the_last(worker, env_id, session):
    item, _, beat = claimed(worker, env_id, session)
    assert beat["type"] == "work_heartbeat" and beat["lease_extended"] is True
    assert beat["state"] == "active" and beat["ttl_seconds"] == 90 and beat["last_heartbeat"]
    path = f"/v1/environments/{env_id}/work/{item['id']}/heartbeat"
    second = worker.post(f"{path}?expected_last_heartbeat={beat['last_heartbeat']}&desired_ttl_seconds=20")
    assert second.status_code == 200
    assert second.json()["ttl_seconds"] == 20 and second.json()["last_heartbeat"] != beat["last_heartbeat"]
    row = WorkItem.objects.get(id=item["id"])
    assert row.latest_heartbeat == second.json()["last_heartbeat"] and row.ttl_seconds == 20


def test_a_heartbeat_out_of_order_is_a_412_with_the_current_state_and_changes_nothing(
    worker, env_id, session
):
    item, _, beat = claimed(worker, env_id, session)
    path = f"/v1/environments/{env_id}/work/{item['id']}/heartbeat"
    before = WorkItem.objects.get(id=item["id"])
    for stale in ("NO_HEARTBEAT", "2020-01-01T00:00:00+00:00"):
        refused = worker.post(f"{path}?expected_last_heartbeat={stale}")
        assert refused.status_code == 412
        error = refused.json()["error"]
        assert error["details"] == {
            "error_code": "heartbeat_precondition_failed",
            "current_state": {
                "last_heartbeat": beat["last_heartbeat"],
                "lease_extended": False,
                "state": "active",
                "ttl_seconds": 90,
            },
        }
        assert "another worker may hold it" in error["message"]
    after = WorkItem.objects.get(id=item["id"])
    assert (after.latest_heartbeat, after.lease_expires_at) == (
        before.latest_heartbeat,
        before.lease_expires_at,
    )


def test_a_heartbeat_before_the_ack_is_a_412(worker, env_id, session):
    work_ensure(session)
    item = poll(worker, env_id)
    refused = worker.post(
        f"/v1/environments/{env_id}/work/{item['id']}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT"
    )
    assert refused.status_code == 412
    assert refused.json()["error"]["details"]["current_state"]["state"] == "queued"
    assert refused.json()["error"]["details"]["current_state"]["last_heartbeat"] is None


@pytest.mark.parametrize("ttl", ["0", "1", "100000", "x"])
def test_a_desired_ttl_out_of_bounds_is_a_400(worker, env_id, session, ttl):
    item, _, beat = claimed(worker, env_id, session)
    response = worker.post(
        f"/v1/environments/{env_id}/work/{item['id']}/heartbeat"
        f"?expected_last_heartbeat={beat['last_heartbeat']}&desired_ttl_seconds={ttl}"
    )
    assert response.status_code == 400
    assert "'desired_ttl_seconds'" in response.json()["error"]["message"]


def test_the_claim_records_which_worker_holds_the_sessions_hands_in_the_log_and_the_hands_panel(
    worker, env_id, session
):
    item, _, _ = claimed(worker, env_id, session)
    hand = Sandbox.objects.get(session_id=session)
    assert (hand.provider, hand.handle, hand.status) == ("self_hosted", item["id"], "ready")
    assert hand.labels["worker_id"] == "worker-a"
    attached = Event.objects.get(session_id=session, type="sandbox.attached")
    assert attached.payload == {
        "sandbox_id": hand.id,
        "name": "worker",
        "provider": "self_hosted",
        "work_id": item["id"],
        "worker_id": "worker-a",
    }


# -- stop


@pytest.mark.django_db(transaction=True)
def test_a_graceful_stop_is_seen_by_the_next_heartbeat_uncompared_and_a_second_stop_is_a_409(
    worker, env_id, session, hooks
):
    item, _, _ = claimed(worker, env_id, session)
    base = f"/v1/environments/{env_id}/work/{item['id']}"
    stopping = worker.post(f"{base}/stop", {})
    assert stopping.status_code == 200
    assert stopping.json()["state"] == "stopping" and stopping.json()["stop_requested_at"]
    told = worker.post(f"{base}/heartbeat?expected_last_heartbeat=anything")
    assert told.status_code == 200
    assert told.json()["lease_extended"] is False and told.json()["state"] == "stopping"
    stopped = worker.post(f"{base}/stop", {"force": True})
    assert stopped.json()["state"] == "stopped" and stopped.json()["stopped_at"]
    again = worker.post(f"{base}/stop", {"force": True})
    assert again.status_code == 409
    assert "already stopped" in again.json()["error"]["message"]
    assert worker.post(f"{base}/heartbeat").json()["state"] == "stopped"
    assert hooks["stopped"] == [(session, item["id"])]
    assert Sandbox.objects.get(session_id=session).status == "terminated"
    ended = Event.objects.get(session_id=session, type="sandbox.terminated")
    assert ended.payload["work_id"] == item["id"] and ended.payload["worker_id"] == "worker-a"


def test_a_sessions_end_asks_its_worker_to_stop_and_releases_its_hand_at_once(worker, env_id, session):
    item, _, _ = claimed(worker, env_id, session)
    work_stop_for_session(session)
    assert WorkItem.objects.get(id=item["id"]).state == "stopping"
    assert Sandbox.objects.get(session_id=session).status == "terminated"
    beat = worker.post(
        f"/v1/environments/{env_id}/work/{item['id']}/heartbeat?expected_last_heartbeat=x"
    ).json()
    assert (beat["state"], beat["lease_extended"]) == ("stopping", False)
    worker.post(f"/v1/environments/{env_id}/work/{item['id']}/stop", {"force": True})
    assert WorkItem.objects.get(id=item["id"]).state == "stopped"
    assert Event.objects.filter(session_id=session, type="sandbox.terminated").count() == 1


def test_a_stop_body_with_an_unknown_field_or_a_non_boolean_is_a_400(worker, env_id, session):
    work_id = work_ensure(session)
    for body in ({"force": "yes"}, {"forced": True}):
        response = worker.post(f"/v1/environments/{env_id}/work/{work_id}/stop", body)
        assert response.status_code == 400
    assert WorkItem.objects.get(id=work_id).state == "queued"


def test_a_queued_item_stops_at_once_and_the_session_gets_a_new_one_on_the_next_ensure(env_id, session):
    work_id = work_ensure(session)
    assert work_ensure(session) == work_id
    work_stop_for_session(session)
    assert WorkItem.objects.get(id=work_id).state == "stopped" and work_live(session) is None
    work_stop_for_session(session)  # nothing live: nothing to do
    fresh = work_ensure(session)
    assert fresh != work_id and work_live(session).id == fresh


def test_work_ensure_refuses_a_session_outside_a_self_hosted_environment(db):
    with pytest.raises(Exception, match="not self-hosted"):
        work_ensure(make_session())


# -- list, retrieve, update, stats


def test_list_takes_the_environment_key_and_pages(worker, operator, env_id):
    ids = [work_ensure(make_session(environment_id=env_id)) for _ in range(3)]
    page = worker.get(f"/v1/environments/{env_id}/work?limit=2").json()
    assert [w["id"] for w in page["data"]] == ids[::-1][:2] and page["next_page"]
    rest = worker.get(f"/v1/environments/{env_id}/work?limit=2&page={page['next_page']}").json()
    assert [w["id"] for w in rest["data"]] == [ids[0]] and rest["next_page"] is None
    assert all(w["secret"] is None for w in page["data"] + rest["data"])
    refused = operator.get(f"/v1/environments/{env_id}/work")
    assert refused.status_code == 403


def test_retrieve_and_update_take_an_api_key_and_update_merges_metadata(worker, operator, env_id, session):
    work_id = work_ensure(session)
    item = poll(worker, env_id)
    token = token_of(item["secret"])
    path = f"/v1/environments/{env_id}/work/{work_id}"
    shown = operator.get(path).json()
    assert shown["id"] == work_id and shown["secret"] is None
    assert operator.post(path, {"metadata": {"a": "1", "b": "2"}}).json()["metadata"] == {"a": "1", "b": "2"}
    assert operator.post(path, {"metadata": {"a": None, "c": "3"}}).json()["metadata"] == {"b": "2", "c": "3"}
    assert operator.post(path, {"metadata": {"a": 1}}).status_code == 400
    assert operator.post(path, {"metadata": {"k" * 65: "v"}}).status_code == 400
    assert operator.post(path, {}).status_code == 400
    for other in (worker, Caller(worker.client, token)):
        assert other.get(path).status_code == 403
        assert other.post(path, {"metadata": {"x": "y"}}).status_code == 403
    assert "needs an API key" in worker.get(path).json()["error"]["message"]
    assert WorkItem.objects.get(id=work_id).metadata == {"b": "2", "c": "3"}
    assert operator.get(f"/v1/environments/{env_id}/work/work_nope").status_code == 404


def test_stats_count_the_queue_the_handed_out_the_oldest_and_the_workers_polling(worker, operator, env_id):
    empty = operator.get(f"/v1/environments/{env_id}/work/stats").json()
    assert empty == {
        "type": "work_queue_stats",
        "depth": 0,
        "pending": 0,
        "oldest_queued_at": None,
        "workers_polling": 0,
    }
    first, *_ = [work_ensure(make_session(environment_id=env_id)) for _ in range(3)]
    poll(worker, env_id, worker_id="worker-a")
    poll(worker, env_id, worker_id="worker-b")
    poll(worker, env_id, worker_id="worker-b")
    worker.get(f"/v1/environments/{env_id}/work/poll")  # no Anthropic-Worker-ID: not counted
    stats = worker.get(f"/v1/environments/{env_id}/work/stats").json()
    assert (stats["depth"], stats["pending"], stats["workers_polling"]) == (0, 3, 2)
    assert stats["oldest_queued_at"] == WorkItem.objects.get(id=first).queued_at.isoformat()
    acked = WorkItem.objects.order_by("queued_at").first()
    worker.post(f"/v1/environments/{env_id}/work/{acked.id}/ack")
    assert worker.get(f"/v1/environments/{env_id}/work/stats").json()["pending"] == 2


def test_a_healthcheck_item_is_served_as_such(worker, env_id):
    work_id = work_enqueue_healthcheck(env_id)
    item = poll(worker, env_id)
    assert item["id"] == work_id and item["data"] == {"type": "healthcheck", "id": work_id}


# -- credentials on the queue and the sessions' endpoints


def test_an_environment_key_reaches_only_its_own_environments_queue(worker, env_id, session):
    other = make_environment(config={"type": "self_hosted"})
    refused = worker.get(f"/v1/environments/{other}/work/poll")
    assert refused.status_code == 403
    assert f"belongs to environment {env_id}, not {other}" in refused.json()["error"]["message"]
    on_session = worker.get(f"/v1/sessions/{session}")
    assert on_session.status_code == 403
    assert "sessions token" in on_session.json()["error"]["message"]
    assert worker.get("/v1/agents").status_code == 403
    assert worker.get(f"/v1/environments/{env_id}").status_code == 403


def test_a_sessions_token_reaches_its_session_and_item_only(worker, env_id, session):
    item, token, _ = claimed(worker, env_id, session)
    holder = Caller(worker.client, token)
    assert holder.get(f"/v1/sessions/{session}").json()["id"] == session
    assert holder.get(f"/v1/sessions/{session}/events").status_code == 200
    other_session = make_session(environment_id=env_id)
    for path in (f"/v1/sessions/{other_session}", f"/v1/sessions/{other_session}/events", "/v1/sessions"):
        refused = holder.get(path)
        assert refused.status_code == 403
        assert f"reaches only session {session}" in refused.json()["error"]["message"]
    assert holder.get(f"/v1/environments/{env_id}/work/poll").status_code == 403
    other_item = work_ensure(other_session)
    assert (
        holder.post(f"/v1/environments/{env_id}/work/{other_item}/stop", {"force": True}).status_code == 403
    )
    assert WorkItem.objects.get(id=other_item).state == "queued"


def test_a_sessions_token_allows_its_sessions_stream_and_nothing_else_of_it():
    principal = SessionsTokenPrincipal(
        work_id="work_1",
        environment_id="env_1",
        workspace_id="wrkspc_default",
        session_id="sesn_1",
        token_hash="h",
        state="active",
        retired=False,
    )
    assert principal.allows("GET", "/v1/sessions/sesn_1/events/stream") is None
    assert principal.allows("POST", "/v1/sessions/sesn_1/events") is None
    assert principal.allows("POST", "/v1/environments/env_1/work/work_1/heartbeat") is None
    for method, path in (
        ("POST", "/v1/sessions/sesn_1/archive"),
        ("DELETE", "/v1/sessions/sesn_1"),
        ("POST", "/v1/sessions/sesn_1"),
        ("GET", "/v1/sessions/sesn_1/sandboxes"),
        ("POST", "/v1/environments/env_2/work/work_1/stop"),
        ("GET", "/v1/environments/env_1/work/work_1"),
    ):
        assert principal.allows(method, path) is not None, (method, path)


def test_a_sessions_token_after_its_item_stopped_reaches_nothing(worker, env_id, session):
    item, token, _ = claimed(worker, env_id, session)
    holder = Caller(worker.client, token)
    assert (
        holder.post(f"/v1/environments/{env_id}/work/{item['id']}/stop", {"force": True}).status_code == 200
    )
    refused = holder.get(f"/v1/sessions/{session}")
    assert refused.status_code == 403
    assert f"Work item {item['id']} is stopped" in refused.json()["error"]["message"]
    assert (
        holder.post(f"/v1/environments/{env_id}/work/{item['id']}/stop", {"force": True}).status_code == 409
    )


def test_an_unknown_sessions_token_or_environment_key_is_a_401_saying_so(client, env_id, session):
    work_id = work_ensure(session)
    for token, said in (
        (f"wbst_{work_id}.forged", "sessions token is not known"),
        ("wbst_nothing", "sessions token is not known"),
        ("wbek_forged", "environment key is not known"),
    ):
        response = Caller(client, token).get(f"/v1/environments/{env_id}/work/poll")
        assert response.status_code == 401
        assert said in response.json()["error"]["message"]
        assert token not in response.content.decode()


# -- lost workers


@pytest.mark.django_db(transaction=True)
def test_an_item_acked_and_never_heartbeated_goes_back_to_the_queue_after_the_bound(
    worker, env_id, session, settings, hooks
):
    settings.WORK_START_TIMEOUT_SECONDS = 0
    work_ensure(session)
    first = poll(worker, env_id)
    worker.post(f"/v1/environments/{env_id}/work/{first['id']}/ack")
    again = poll(worker, env_id, worker_id="worker-b")
    assert again["id"] == first["id"] and again["state"] == "queued" and again["acknowledged_at"] is None
    assert hooks["lost"] == [(session, first["id"])]
    row = WorkItem.objects.get(id=first["id"])
    assert row.lost_count == 1 and row.polled_by == "worker-b"
    late = Caller(worker.client, token_of(first["secret"]))
    refused = late.post(
        f"/v1/environments/{env_id}/work/{first['id']}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT"
    )
    assert refused.status_code == 412
    assert refused.json()["error"]["details"]["current_state"]["state"] == "queued"
    assert late.get(f"/v1/sessions/{session}").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_an_active_item_whose_lease_expired_goes_back_and_its_old_token_is_refused(
    worker, env_id, session, settings, hooks
):
    settings.WORK_LEASE_TTL_SECONDS = 0
    item, token, beat = claimed(worker, env_id, session)
    assert work_sweep() == [item["id"]]
    assert hooks["lost"] == [(session, item["id"])]
    assert WorkItem.objects.get(id=item["id"]).state == "queued"
    hand = Sandbox.objects.get(session_id=session)
    assert hand.status == "dead"
    failed = Event.objects.get(session_id=session, type="sandbox.failed")
    assert failed.payload["work_id"] == item["id"] and "no heartbeat within" in failed.payload["reason"]
    old = Caller(worker.client, token)
    late = old.post(
        f"/v1/environments/{env_id}/work/{item['id']}/heartbeat?expected_last_heartbeat={beat['last_heartbeat']}"
    )
    assert late.status_code == 412
    assert late.json()["error"]["details"]["current_state"] == {
        "last_heartbeat": None,
        "lease_extended": False,
        "state": "queued",
        "ttl_seconds": 0,
    }
    refused = old.get(f"/v1/sessions/{session}")
    assert refused.status_code == 403
    assert "claim of work item" in refused.json()["error"]["message"]
    assert old.post(f"/v1/environments/{env_id}/work/{item['id']}/stop", {"force": True}).status_code == 403
    settings.WORK_LEASE_TTL_SECONDS = 90
    _, new_token, _ = claimed(worker, env_id, session)
    assert Caller(worker.client, new_token).get(f"/v1/sessions/{session}").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_stop_requested_on_an_item_whose_worker_is_gone_ends_it_as_stopped(
    worker, env_id, session, settings, hooks
):
    item, _, _ = claimed(worker, env_id, session)
    worker.post(f"/v1/environments/{env_id}/work/{item['id']}/stop", {})
    WorkItem.objects.filter(id=item["id"]).update(lease_expires_at=timezone.now())
    assert sweep_work() == [item["id"]]  # beat's task
    assert WorkItem.objects.get(id=item["id"]).state == "stopped"
    assert hooks == {"lost": [], "stopped": [(session, item["id"])]}


def test_a_sweep_leaves_live_leases_alone(worker, env_id, session):
    claimed(worker, env_id, session)
    assert work_sweep() == []


def test_a_token_of_a_reclaimed_hand_out_may_still_claim_until_another_does(worker, env_id, session):
    """A slow worker's poll was reclaimed by another; whichever first heartbeats holds the item."""
    work_ensure(session)
    slow = poll(worker, env_id)
    fast = poll(worker, env_id, "?reclaim_older_than_ms=0", worker_id="worker-b")
    assert worker.post(f"/v1/environments/{env_id}/work/{slow['id']}/ack").status_code == 200
    path = f"/v1/environments/{env_id}/work/{slow['id']}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT"
    assert Caller(worker.client, token_of(slow["secret"])).post(path).status_code == 200
    assert Caller(worker.client, token_of(fast["secret"])).post(path).status_code == 412
    assert Caller(worker.client, token_of(fast["secret"])).get(f"/v1/sessions/{session}").status_code == 403
    assert Caller(worker.client, token_of(slow["secret"])).get(f"/v1/sessions/{session}").status_code == 200


# -- concurrency (real services)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_polls_never_hand_out_one_item_twice(env_id):
    require(on_postgres(), "needs PostgreSQL (SKIP LOCKED)")
    ids = {work_ensure(make_session(environment_id=env_id)) for _ in range(12)}

    def drain() -> list[str]:
        def run() -> list[str]:
            got = []
            while (handed := work_poll(env_id, worker_id="w", reclaim_older_than_ms=86_400_000)) is not None:
                got.append(handed.item.id)
            return got

        return in_thread(run)

    with ThreadPoolExecutor(4) as pool:
        results = [f.result() for f in [pool.submit(drain) for _ in range(4)]]
    handed = [work_id for got in results for work_id in got]
    assert sorted(handed) == sorted(ids)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_ensures_make_one_live_item_per_session(env_id):
    require(on_postgres(), "needs PostgreSQL")
    session = make_session(environment_id=env_id)
    barrier = threading.Barrier(4)

    def ensure() -> str:
        barrier.wait()
        return in_thread(lambda: work_ensure(session))

    with ThreadPoolExecutor(4) as pool:
        got = {f.result() for f in [pool.submit(ensure) for _ in range(4)]}
    assert len(got) == 1 and WorkItem.objects.filter(session_id=session).count() == 1


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_long_poll_wakes_when_an_item_is_enqueued(env_id, redis_url):
    session = make_session(environment_id=env_id)
    listener = redis.Redis.from_url(django_settings.REDIS_URL)
    result: list[Any] = []
    polling = threading.Thread(
        target=lambda: result.append(in_thread(lambda: work_poll(env_id, block_ms=999)))
    )
    polling.start()
    while not listener.pubsub_numsub(channel(env_id))[0][1] and polling.is_alive():
        threading.Event().wait(0.001)
    work_id = work_ensure(session)
    polling.join()
    assert result[0] is not None and result[0].item.id == work_id


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_waiting_long_poll_holds_no_database_connection(env_id, redis_url, monkeypatch):
    from django.db import connection

    listen = work_queue.listening
    held_while_waiting: list[bool] = []

    @contextmanager
    def watched(environment_id: str) -> Iterator[Any]:
        with listen(environment_id) as wait:

            def watched_wait(seconds: float) -> None:
                held_while_waiting.append(connection.connection is not None)
                wait(seconds)

            yield watched_wait

    monkeypatch.setattr(work_queue, "listening", watched)
    assert in_thread(lambda: work_poll(env_id, block_ms=300)) is None
    assert held_while_waiting and not any(held_while_waiting)


# -- the official SDK against the live server


@pytest.fixture
def sdk_worker(live_server_url: str, env_key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server_url, api_key=env_key, max_retries=0, timeout=30)


@pytest.mark.server
@pytest.mark.django_db(transaction=True)
def test_the_sdk_polls_acks_heartbeats_stops_and_reads_stats(sdk_worker, live_server_url, api_key, env_id):
    work = sdk_worker.beta.environments.work
    assert work.poll(env_id) is None
    session = make_session(environment_id=env_id)
    work_id = work_ensure(session)
    item = work.poll(env_id, block_ms=999, anthropic_worker_id="sdk-worker")
    assert item is not None and item.id == work_id and item.data.id == session and item.secret
    stats = work.stats(env_id)
    assert (stats.depth, stats.pending, stats.workers_polling) == (0, 1, 1)
    holder = anthropic.Anthropic(base_url=live_server_url, api_key=token_of(item.secret), max_retries=0)
    assert holder.beta.sessions.retrieve(session).id == session
    stream = holder.beta.sessions.events.stream(session)
    assert stream.response.status_code == 200
    stream.close()
    with pytest.raises(anthropic.PermissionDeniedError, match="reaches only session"):
        holder.beta.sessions.list()
    assert work.ack(work_id, environment_id=env_id).state == "starting"
    with pytest.raises(anthropic.ConflictError):
        work.ack(work_id, environment_id=env_id)
    beat = work.heartbeat(work_id, environment_id=env_id, expected_last_heartbeat="NO_HEARTBEAT")
    assert beat.lease_extended and beat.state == "active" and beat.ttl_seconds == 90
    with pytest.raises(BetaHeartbeatPreconditionFailedError) as lost:
        work.heartbeat(work_id, environment_id=env_id, expected_last_heartbeat="NO_HEARTBEAT")
    assert lost.value.error_code == "heartbeat_precondition_failed"
    assert lost.value.body["error"]["details"]["current_state"]["last_heartbeat"] == beat.last_heartbeat
    assert [w.id for w in work.list(env_id)] == [work_id]
    operator = anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0)
    assert operator.beta.environments.work.retrieve(work_id, environment_id=env_id).secret is None
    updated = operator.beta.environments.work.update(work_id, environment_id=env_id, metadata={"k": "v"})
    assert updated.metadata == {"k": "v"}
    with pytest.raises(anthropic.PermissionDeniedError):
        operator.beta.environments.work.list(env_id)
    assert work.stop(work_id, environment_id=env_id, force=True).state == "stopped"
    with pytest.raises(anthropic.ConflictError):
        work.stop(work_id, environment_id=env_id, force=True)


@pytest.mark.server
@pytest.mark.django_db(transaction=True)
def test_a_sessions_token_stream_ends_with_an_error_once_its_item_stops(sdk_worker, live_server_url, env_id):
    session = make_session(environment_id=env_id)
    work_id = work_ensure(session)
    work = sdk_worker.beta.environments.work
    item = work.poll(env_id, block_ms=999)
    work.ack(work_id, environment_id=env_id)
    work.heartbeat(work_id, environment_id=env_id, expected_last_heartbeat="NO_HEARTBEAT")
    holder = anthropic.Anthropic(base_url=live_server_url, api_key=token_of(item.secret), max_retries=0)
    with holder.beta.sessions.events.stream(session) as stream:
        threading.Event().wait(1.5)  # past a few re-checks (0.5 s here), which a live item's token passes
        holder.beta.sessions.events.send(
            session, events=[{"type": "system.message", "content": [{"type": "text", "text": "still here"}]}]
        )
        assert (
            next(event for event in stream if event.type == "system.message").content[0].text == "still here"
        )
        work.stop(work_id, environment_id=env_id, force=True)
        with pytest.raises(anthropic.APIStatusError, match="is stopped") as ended:
            for _ in stream:
                pass
    assert ended.value.body["error"]["type"] == "permission_error"


@pytest.mark.server
@pytest.mark.django_db(transaction=True)
def test_the_sdks_own_poller_takes_an_item_and_stops_it_with_its_sessions_token(sdk_worker, env_id):
    session = make_session(environment_id=env_id, agent=make_agent())
    work_id = work_ensure(session)
    served = []
    for item in iter_work(
        sdk_worker.beta.environments.work, environment_id=env_id, block_ms=None, drain=True
    ):
        served.append((item.id, item.state))
    assert served == [(work_id, "queued")]
    row = WorkItem.objects.get(id=work_id)
    assert row.state == "stopped" and row.worker_id.startswith(__import__("socket").gethostname())


def test_a_workers_hand_cannot_change_hands_and_terminating_it_asks_the_worker_to_stop(
    worker, operator, env_id, session
):
    item, _, beat = claimed(worker, env_id, session)
    hand = Sandbox.objects.get(session_id=session, provider="self_hosted")
    other = make_session(environment_id=env_id)
    for path, body in (
        (f"/v1/sessions/{session}/sandboxes/{hand.id}/detach", {}),
        (f"/v1/sessions/{session}/sandboxes/{hand.id}/transfer", {"to_session": other}),
        (f"/v1/sessions/{other}/sandboxes", {"sandbox_id": hand.id}),
    ):
        refused = operator.post(path, body)
        assert refused.status_code == 400, (path, refused.content)
        assert "self-hosted worker's hold" in refused.json()["error"]["message"]
    assert Sandbox.objects.get(id=hand.id).session_id == session
    assert operator.delete(f"/v1/sessions/{session}/sandboxes/{hand.id}").status_code == 200
    assert Sandbox.objects.get(id=hand.id).status == "terminated"
    next_beat = worker.post(
        f"/v1/environments/{env_id}/work/{item['id']}/heartbeat?expected_last_heartbeat={beat['last_heartbeat']}"
    )
    assert next_beat.json()["state"] in ("stopping", "stopped"), next_beat.content


def test_the_reaper_ends_a_finished_sessions_worker_hand_without_a_provider(worker, env_id, session):
    claimed(worker, env_id, session)
    Session.objects.filter(id=session).update(status="terminated")
    reaped = reap_idle()
    hand = Sandbox.objects.get(session_id=session, provider="self_hosted")
    assert hand.id in reaped and hand.status == "terminated"


@pytest.mark.django_db(transaction=True)
def test_a_requeued_item_is_held_from_polls_until_its_lost_workers_calls_are_settled(
    worker, env_id, session, settings
):
    """No worker may read a lost worker's session before the harness has closed what it left."""
    settings.WORK_START_TIMEOUT_SECONDS = 0
    work_ensure(session)
    first = poll(worker, env_id)
    worker.post(f"/v1/environments/{env_id}/work/{first['id']}/ack")
    seen_during_the_hook: list[Any] = []

    def settle(session_id: str, work_id: str) -> None:
        try:
            seen_during_the_hook.append(work_poll(env_id, worker_id="worker-c", reclaim_older_than_ms=0))
        except Exception as error:  # noqa: BLE001 - shown by the assertion below
            seen_during_the_hook.append(error)

    add_work_lost_hook(settle)
    try:
        again = poll(worker, env_id, worker_id="worker-b")
    finally:
        _lost_hooks.remove(settle)
    assert seen_during_the_hook == [None], "held while the hook ran"
    assert again is not None and again["id"] == first["id"], "released after it"


@pytest.mark.django_db(transaction=True)
def test_an_end_whose_process_died_before_its_hooks_ran_is_settled_by_a_later_sweep(
    worker, env_id, session, settings, hooks, monkeypatch
):
    """The process that noticed the lost worker commits the requeue and dies before its hooks run: the item
    stays held from polls, and a sweep after the grace runs the hooks and releases it."""
    settings.WORK_LEASE_TTL_SECONDS = 0
    item, _, _ = claimed(worker, env_id, session)
    with monkeypatch.context() as died:
        died.setattr(work_queue, "_settle", lambda work_id, due_at: False)  # the after-commit step never runs
        assert work_sweep() == [item["id"]]
    assert hooks["lost"] == []
    assert WorkItem.objects.get(id=item["id"]).hooks_due_at is not None
    assert work_poll(env_id, worker_id="worker-b", reclaim_older_than_ms=0) is None, (
        "held: nothing settled it"
    )
    settings.WORK_SETTLE_GRACE_SECONDS = 0
    assert work_sweep() == [item["id"]]
    assert hooks["lost"] == [(session, item["id"])]
    assert WorkItem.objects.get(id=item["id"]).hooks_due_at is None
    assert work_sweep() == [], "settled once"
    handed = work_poll(env_id, worker_id="worker-b")
    assert handed is not None and handed.item.id == item["id"]


@pytest.mark.django_db(transaction=True)
def test_a_stop_whose_hook_failed_is_tried_again_by_a_sweep(worker, env_id, session, settings):
    item, _, _ = claimed(worker, env_id, session)
    calls: list[str] = []

    def flaky(session_id: str, work_id: str) -> None:
        calls.append(work_id)
        if len(calls) == 1:
            raise RuntimeError("the database went away")

    add_work_stopped_hook(flaky)
    try:
        worker.post(f"/v1/environments/{env_id}/work/{item['id']}/stop", {"force": True})
        assert calls == [item["id"]]
        assert WorkItem.objects.get(id=item["id"]).hooks_due_at is not None, "kept for a retry"
        settings.WORK_SETTLE_GRACE_SECONDS = 0
        assert work_sweep() == [item["id"]]
        assert calls == [item["id"], item["id"]]
        assert WorkItem.objects.get(id=item["id"]).hooks_due_at is None
    finally:
        _stopped_hooks.remove(flaky)


def test_no_platform_sandbox_is_provisioned_or_attached_for_a_self_hosted_session(operator, session):
    refused = operator.post(f"/v1/sessions/{session}/sandboxes", {"name": "main"})
    assert refused.status_code == 400, refused.content
    assert "hands are its workers' machines" in refused.json()["error"]["message"]
    assert not Sandbox.objects.filter(session_id=session).exists()
