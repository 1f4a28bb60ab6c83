"""The /v1 core through Django's test client: shapes, paging, and bad input that changes nothing."""

from __future__ import annotations

import pytest

from sessions.models import Event, Session
from sessions.services import emit_event
from tests.conftest import make_agent, make_environment

pytestmark = pytest.mark.django_db


def user_message(text: str = "hi") -> dict:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


def new_session(api) -> str:
    agent = api.post("/v1/agents", {"name": "a", "model": "claude-sonnet-5-5"}).json()
    env = api.post("/v1/environments", {"name": f"e {agent['id']}", "config": {"type": "cloud"}}).json()
    response = api.post("/v1/sessions", {"agent": agent["id"], "environment_id": env["id"]})
    assert response.status_code == 200, response.content
    return response.json()["id"]


def assert_error(response, status: int, error_type: str, *, mentions: str = "") -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert mentions in body["error"]["message"], body["error"]["message"]
    assert response["request-id"].startswith("req_")
    return body


def test_requests_without_a_valid_key_get_401(client):
    response = client.get("/v1/agents")
    assert_error(response, 401, "authentication_error", mentions="Authorization: Bearer")
    response = client.get("/v1/agents", HTTP_X_API_KEY="wbk_not-a-key")
    assert_error(response, 401, "authentication_error")


def test_x_api_key_header_authenticates(client, api_key):
    assert client.get("/v1/agents", HTTP_X_API_KEY=api_key).status_code == 200


def test_agent_create_normalises_model_and_toolset(api):
    agent = api.post(
        "/v1/agents",
        {"name": "coder", "model": "claude-sonnet-5-5", "tools": [{"type": "agent_toolset_20260401"}]},
    ).json()
    assert agent["id"].startswith("agent_") and agent["type"] == "agent" and agent["version"] == 1
    assert agent["model"]["id"] == "claude-sonnet-5-5"
    toolset = agent["tools"][0]
    assert [c["name"] for c in toolset["configs"]] == [
        "bash",
        "edit",
        "read",
        "write",
        "glob",
        "grep",
        "web_fetch",
        "web_search",
    ]
    assert all(
        c["permission_policy"] == {"type": "always_allow"} and c["enabled"] for c in toolset["configs"]
    )
    assert agent["execution_identity"] == {"type": "service_account"} and agent["archived_at"] is None


def test_agent_update_makes_a_new_version_and_keeps_the_old(api):
    agent = api.post("/v1/agents", {"name": "v", "model": "m", "metadata": {"a": "1", "b": "2"}}).json()
    updated = api.post(f"/v1/agents/{agent['id']}", {"system": "be brief", "metadata": {"a": None}}).json()
    assert updated["version"] == 2 and updated["system"] == "be brief" and updated["metadata"] == {"b": "2"}
    unchanged = api.post(f"/v1/agents/{agent['id']}", {"system": "be brief"}).json()
    assert unchanged["version"] == 2
    assert api.get(f"/v1/agents/{agent['id']}", version=1).json()["system"] is None
    versions = api.get(f"/v1/agents/{agent['id']}/versions").json()
    assert [v["version"] for v in versions["data"]] == [2, 1]
    conflict = api.post(f"/v1/agents/{agent['id']}", {"name": "x", "version": 1})
    assert_error(conflict, 409, "invalid_request_error", mentions="version 2")


def test_agent_archive_hides_it_from_the_list_unless_asked(api):
    agent = api.post("/v1/agents", {"name": "old", "model": "m"}).json()
    archived = api.post(f"/v1/agents/{agent['id']}/archive").json()
    assert archived["archived_at"] is not None
    assert agent["id"] not in [a["id"] for a in api.get("/v1/agents").json()["data"]]
    assert agent["id"] in [a["id"] for a in api.get("/v1/agents", include_archived="true").json()["data"]]


def test_agents_list_pages_with_next_page(api):
    ids = [api.post("/v1/agents", {"name": f"a{i}", "model": "m"}).json()["id"] for i in range(5)]
    seen, page = [], None
    while True:
        params = {"limit": 2, **({"page": page} if page else {})}
        body = api.get("/v1/agents", **params).json()
        seen += [a["id"] for a in body["data"]]
        page = body["next_page"]
        if not page:
            break
    assert seen == list(reversed(ids))


def test_environment_lifecycle_and_config_type_change_refused(api):
    env = api.post(
        "/v1/environments",
        {
            "name": "box",
            "config": {"type": "cloud", "networking": {"type": "limited", "allowed_hosts": ["pypi.org"]}},
        },
    ).json()
    assert env["id"].startswith("env_") and env["config"]["networking"]["allow_package_managers"] is False
    assert env["config"]["packages"]["pip"] == []
    changed = api.post(f"/v1/environments/{env['id']}", {"config": {"type": "self_hosted"}})
    body = assert_error(changed, 400, "invalid_request_error", mentions="cannot change")
    assert body["error"]["details"]["error_code"] == "invalid_config_type_change"
    assert api.post(f"/v1/environments/{env['id']}/archive").json()["archived_at"]
    deleted = api.delete(f"/v1/environments/{env['id']}").json()
    assert deleted == {"id": env["id"], "type": "environment_deleted"}
    missing = api.get(f"/v1/environments/{env['id']}")
    assert (
        assert_error(missing, 404, "not_found_error")["error"]["details"]["error_code"]
        == "environment_not_found"
    )


def test_session_create_resolves_the_agent_and_starts_idle(api):
    agent = api.post("/v1/agents", {"name": "a", "model": "m"}).json()
    api.post(f"/v1/agents/{agent['id']}", {"system": "v2"})
    env = api.post("/v1/environments", {"name": "e"}).json()
    session = api.post(
        "/v1/sessions",
        {
            "agent": {"type": "agent", "id": agent["id"], "version": 1},
            "environment_id": env["id"],
            "title": "t",
            "resources": [
                {
                    "type": "github_repository",
                    "url": "https://x/y/repo.git",
                    "authorization_token": "secret-token",
                }
            ],
        },
    ).json()
    assert session["id"].startswith("sesn_") and session["status"] == "idle"
    assert session["agent"]["version"] == 1 and session["agent"]["system"] is None
    assert session["resources"][0]["mount_path"] == "/workspace/repo"
    assert "secret-token" not in str(api.get(f"/v1/sessions/{session['id']}").json())
    assert "secret-token" not in str(Session.objects.get(id=session["id"]).resources)


def test_sending_a_user_message_records_it_and_marks_the_session_running(api):
    session_id = new_session(api)
    sent = api.post(f"/v1/sessions/{session_id}/events", {"events": [user_message("hello")]}).json()
    assert sent["data"][0]["type"] == "user.message" and sent["data"][0]["id"]
    assert Session.objects.get(id=session_id).status == "running"
    listed = api.get(f"/v1/sessions/{session_id}/events").json()
    assert [e["content"][0]["text"] for e in listed["data"]] == ["hello"]


def test_events_list_pages_orders_and_filters(api):
    session_id = new_session(api)
    for i in range(7):
        emit_event(
            session_id,
            {
                "type": "agent.message" if i % 2 else "system.message",
                "content": [{"type": "text", "text": str(i)}],
            },
        )
    texts, page = [], None
    while True:
        body = api.get(
            f"/v1/sessions/{session_id}/events", limit=3, **({"page": page} if page else {})
        ).json()
        texts += [e["content"][0]["text"] for e in body["data"]]
        page = body["next_page"]
        if not page:
            break
    assert texts == [str(i) for i in range(7)]
    desc = api.get(f"/v1/sessions/{session_id}/events", order="desc", limit=2).json()
    assert [e["content"][0]["text"] for e in desc["data"]] == ["6", "5"]
    typed = api.get(f"/v1/sessions/{session_id}/events", **{"types[]": "agent.message"}).json()
    assert [e["content"][0]["text"] for e in typed["data"]] == ["1", "3", "5"]
    later = api.get(f"/v1/sessions/{session_id}/events", **{"created_at[gt]": "2999-01-01T00:00:00Z"}).json()
    assert later == {"data": [], "next_page": None}


def test_sessions_list_has_a_bidirectional_cursor(api):
    agent, env = make_agent(), make_environment()
    ids = [api.post("/v1/sessions", {"agent": agent, "environment_id": env}).json()["id"] for _ in range(5)]
    first = api.get("/v1/sessions", limit=2).json()
    assert [s["id"] for s in first["data"]] == ids[::-1][:2] and first["prev_page"] is None
    second = api.get("/v1/sessions", limit=2, page=first["next_page"]).json()
    assert [s["id"] for s in second["data"]] == ids[::-1][2:4]
    back = api.get("/v1/sessions", limit=2, page=second["prev_page"]).json()
    assert [s["id"] for s in back["data"]] == ids[::-1][:2]
    running = api.get("/v1/sessions", **{"statuses[]": "running"}).json()
    assert running["data"] == []


def test_session_archive_and_delete_are_recorded_in_the_log(api):
    session_id = new_session(api)
    assert api.post(f"/v1/sessions/{session_id}/archive").json()["status"] == "terminated"
    refused = api.post(f"/v1/sessions/{session_id}/events", {"events": [user_message()]})
    assert_error(refused, 400, "invalid_request_error", mentions="archived")
    assert api.delete(f"/v1/sessions/{session_id}").json() == {"id": session_id, "type": "session_deleted"}
    assert_error(api.get(f"/v1/sessions/{session_id}"), 404, "not_found_error")
    types = list(Event.objects.filter(session_id=session_id).order_by("seq").values_list("type", flat=True))
    assert types == ["session.status_terminated", "session.deleted"]


def test_events_sent_to_a_terminated_or_unknown_session_are_refused_and_nothing_is_written(api):
    session_id = new_session(api)
    Session.objects.filter(id=session_id).update(status="terminated")
    refused = api.post(f"/v1/sessions/{session_id}/events", {"events": [user_message()]})
    assert_error(refused, 400, "invalid_request_error", mentions="terminated")
    assert not Event.objects.filter(session_id=session_id).exists()
    assert_error(
        api.post("/v1/sessions/sesn_nope/events", {"events": [user_message()]}), 404, "not_found_error"
    )


def test_session_update_patches_and_records_session_updated(api):
    session_id = new_session(api)
    updated = api.post(f"/v1/sessions/{session_id}", {"title": "renamed", "metadata": {"k": "v"}}).json()
    assert updated["title"] == "renamed" and updated["metadata"] == {"k": "v"}
    event = Event.objects.get(session_id=session_id)
    assert event.type == "session.updated" and event.payload["title"] == "renamed"
    assert_error(
        api.post(f"/v1/sessions/{session_id}", {"vault_ids": ["vlt_nope"]}),
        404,
        "not_found_error",
        mentions="vault_ids[0]",
    )
    assert api.post(f"/v1/sessions/{session_id}", {"vault_ids": []}).json()["vault_ids"] == []


BAD_SENDS = [
    ({"events": [{"type": "agent.message", "content": []}]}, "events you can send"),
    ({"events": [{"type": "no.such.type"}]}, "events you can send"),
    ({"events": [{"type": "user.message"}]}, "'events[0].content' is required"),
    ({"events": [{"type": "user.message", "content": "hi"}]}, "must be an array"),
    ({"events": [{"type": "user.message", "content": [{"type": "text", "text": 5}]}]}, "must be a string"),
    ({"events": [{"type": "user.message", "content": [{"type": "text"}]}]}, "is required"),
    (
        {
            "events": [
                user_message(),
                {"type": "user.tool_confirmation", "tool_use_id": "sevt_x", "result": "maybe"},
            ]
        },
        "'allow' or 'deny'",
    ),
    (
        {"events": [{"type": "user.tool_confirmation", "tool_use_id": "sevt_nope", "result": "allow"}]},
        "not the id of an agent.tool_use",
    ),
    (
        {"events": [{"type": "user.custom_tool_result", "custom_tool_use_id": "sevt_nope"}]},
        "agent.custom_tool_use",
    ),
    ({"events": []}, "at least one"),
    ({"events": "x"}, "must be an array"),
    ({}, "'events' is required"),
    ({"events": [user_message()], "extra": 1}, "unknown field"),
]


@pytest.mark.parametrize(("body", "mentions"), BAD_SENDS)
def test_bad_events_are_refused_with_a_clear_400_and_nothing_is_written(api, body, mentions):
    session_id = new_session(api)
    response = api.post(f"/v1/sessions/{session_id}/events", body)
    assert_error(response, 400, "invalid_request_error", mentions=mentions)
    assert Event.objects.filter(session_id=session_id).count() == 0
    assert Session.objects.get(id=session_id).status == "idle"


def test_malformed_json_is_a_400_that_says_so(api):
    session_id = new_session(api)
    response = api.post(f"/v1/sessions/{session_id}/events", raw=b'{"events": [')
    assert_error(response, 400, "invalid_request_error", mentions="not valid JSON")
    response = api.post(f"/v1/sessions/{session_id}/events", raw=b"[1, 2]")
    assert_error(response, 400, "invalid_request_error", mentions="must be a JSON object")
    assert Event.objects.filter(session_id=session_id).count() == 0


def test_a_body_over_one_mebibyte_is_a_413_and_nothing_is_written(api):
    session_id = new_session(api)
    huge = {"events": [user_message("x" * (1024 * 1024 + 10))]}
    response = api.post(f"/v1/sessions/{session_id}/events", huge)
    assert_error(response, 413, "request_too_large", mentions="1 MiB")
    assert Event.objects.filter(session_id=session_id).count() == 0


@pytest.mark.parametrize("session_id", ["sesn_doesnotexist", "agent_0000000000000000000000000", "../etc"])
def test_unknown_or_foreign_session_ids_are_404(api, session_id):
    for response in (
        api.get(f"/v1/sessions/{session_id}"),
        api.get(f"/v1/sessions/{session_id}/events"),
        api.post(f"/v1/sessions/{session_id}/events", {"events": [user_message()]}),
    ):
        assert_error(response, 404, "not_found_error")
    assert Event.objects.count() == 0


def test_a_page_cursor_that_was_not_issued_is_a_400(api):
    session_id = new_session(api)
    response = api.get(f"/v1/sessions/{session_id}/events", page="forged")
    assert_error(response, 400, "invalid_request_error", mentions="not valid")
    other = new_session(api)
    for i in range(3):
        emit_event(other, {"type": "system.message", "content": [{"type": "text", "text": str(i)}]})
    cursor = api.get(f"/v1/sessions/{other}/events", limit=1).json()["next_page"]
    response = api.get(f"/v1/sessions/{session_id}/events", page=cursor)
    assert_error(response, 400, "invalid_request_error", mentions="another session")


@pytest.mark.parametrize(
    ("params", "mentions"),
    [
        ({"limit": "0"}, "between 1 and 1000"),
        ({"limit": "1001"}, "between 1 and 1000"),
        ({"limit": "ten"}, "integer"),
        ({"order": "sideways"}, "asc, desc"),
        ({"types[]": "agent.nonsense"}, "unknown event type"),
        ({"created_at[gt]": "yesterday"}, "RFC 3339"),
    ],
)
def test_bad_list_queries_are_400(api, params, mentions):
    session_id = new_session(api)
    assert_error(
        api.get(f"/v1/sessions/{session_id}/events", **params),
        400,
        "invalid_request_error",
        mentions=mentions,
    )


@pytest.mark.parametrize(
    ("body", "mentions"),
    [
        ({"model": "m"}, "'name' is required"),
        ({"name": "x"}, "'model' is required"),
        ({"name": "", "model": "m"}, "must not be empty"),
        ({"name": "x", "model": 3}, "'model' must be an object"),
        ({"name": "x", "model": "m", "tools": [{"type": "shell"}]}, "tools[0].type"),
        (
            {
                "name": "x",
                "model": "m",
                "tools": [
                    {
                        "type": "custom",
                        "name": "bad name!",
                        "description": "d",
                        "input_schema": {"type": "object"},
                    }
                ],
            },
            "letters, digits",
        ),
        (
            {"name": "x", "model": "m", "mcp_servers": [{"type": "url", "name": "s", "url": "http://x"}]},
            "must each be used by an mcp_toolset",
        ),
        ({"name": "x", "model": "m", "metadata": {"k": 1}}, "must be a string"),
        ({"name": "x", "model": "m", "harness": "nope"}, "'harness' must be one of"),
        ({"name": "x", "model": "m", "colour": "blue"}, "unknown field"),
    ],
)
def test_bad_agents_are_refused_and_nothing_is_created(api, body, mentions):
    from harness.models import Agent

    assert_error(api.post("/v1/agents", body), 400, "invalid_request_error", mentions=mentions)
    assert Agent.objects.count() == 0


def test_session_create_refuses_unknown_agent_and_environment(api):
    env = make_environment()
    assert_error(
        api.post("/v1/sessions", {"agent": "agent_missing", "environment_id": env}), 404, "not_found_error"
    )
    assert_error(
        api.post("/v1/sessions", {"agent": make_agent(), "environment_id": "env_missing"}),
        404,
        "not_found_error",
    )
    assert_error(
        api.post("/v1/sessions", {"environment_id": env}),
        400,
        "invalid_request_error",
        mentions="'agent' is required",
    )
    assert Session.objects.count() == 0


def test_wrong_method_and_unknown_path_use_the_envelope(api):
    assert_error(api.delete("/v1/agents"), 405, "invalid_request_error", mentions="use GET, POST")
    assert_error(api.get("/v1/nothing/here"), 404, "not_found_error", mentions="/v1/nothing/here")
