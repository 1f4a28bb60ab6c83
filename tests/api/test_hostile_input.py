"""Malformed input at the /v1 edge and in the UI is a 400 (or a 404 page) that says where, never a 500.

Each case changes nothing: a refused event is not in the log. They run on SQLite and on PostgreSQL, where a
NUL that reached the database would be a `DataError`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from django.contrib.auth.models import User

from sessions.models import Event
from tests.api.test_api import assert_error, new_session, user_message
from tests.conftest import make_session, operator_of

pytestmark = pytest.mark.django_db

DEEP = b"[" * 200_000


def send(api, session_id: str, *, body: dict | None = None, raw: bytes | None = None):
    return api.post(f"/v1/sessions/{session_id}/events", body, raw=raw)


def test_a_message_with_an_unpaired_surrogate_is_refused_and_names_the_field(api):
    session_id = new_session(api)
    response = send(api, session_id, body={"events": [user_message("hi \ud800")]})
    assert_error(
        response,
        400,
        "invalid_request_error",
        mentions="'events[0].content[0].text' holds an unpaired surrogate (U+D800) at index 3",
    )
    # The same bytes a client other than Python's json would send.
    raw = b'{"events": [{"type": "user.message", "content": [{"type": "text", "text": "hi \\ud800"}]}]}'
    assert_error(send(api, session_id, raw=raw), 400, "invalid_request_error", mentions="U+D800")
    assert_error(
        send(api, session_id, raw=raw.replace(b"\\ud800", b"\\udfff")),
        400,
        "invalid_request_error",
        mentions="U+DFFF",
    )
    assert not Event.objects.filter(session_id=session_id).exists()


def test_a_surrogate_pair_is_one_character_and_is_taken(api):
    session_id = new_session(api)
    raw = (
        b'{"events": [{"type": "user.message", "content": [{"type": "text", "text": "hi \\ud83d\\ude00"}]}]}'
    )
    response = send(api, session_id, raw=raw)
    assert response.status_code == 200, response.content
    assert Event.objects.get(session_id=session_id).payload["content"][0]["text"] == "hi \U0001f600"


def test_a_nul_in_a_message_a_name_metadata_or_a_sandbox_id_is_refused_and_names_the_field(api):
    session_id = new_session(api)
    assert_error(
        send(api, session_id, body={"events": [user_message("a\x00b")]}),
        400,
        "invalid_request_error",
        mentions="'events[0].content[0].text' holds a NUL character (U+0000) at index 1",
    )
    assert_error(
        api.post("/v1/agents", {"name": "a\x00", "model": "claude-sonnet-5-5"}),
        400,
        "invalid_request_error",
        mentions="'name' holds a NUL",
    )
    assert_error(
        api.post("/v1/environments", {"name": "e\x00", "config": {"type": "cloud"}}),
        400,
        "invalid_request_error",
        mentions="'name' holds a NUL",
    )
    assert_error(
        api.post("/v1/agents", {"name": "a", "model": "m", "metadata": {"team": "x\x00"}}),
        400,
        "invalid_request_error",
        mentions="'metadata.team' holds a NUL",
    )
    assert_error(
        api.post(f"/v1/sessions/{session_id}", {"metadata": {"my key\x00": "v"}}),
        400,
        "invalid_request_error",
        mentions="A key of 'metadata' (\"my key\\u0000\") holds a NUL",
    )
    assert_error(
        api.post(f"/v1/sessions/{session_id}/sandboxes", {"sandbox_id": "sbx_\x00"}),
        400,
        "invalid_request_error",
        mentions="'sandbox_id' holds a NUL",
    )
    assert not Event.objects.filter(session_id=session_id).exists()


@pytest.mark.parametrize("path", ["/v1/agents", "/v1/sessions/{session}/events"])
def test_a_body_nested_200000_deep_is_a_400_in_the_envelope(api, path):
    session_id = new_session(api)
    assert_error(
        api.post(path.format(session=session_id), raw=DEEP),
        400,
        "invalid_request_error",
        mentions="nests too deeply to read; at most 64 levels",
    )
    wrapped = b'{"events": ' + DEEP + b"}"
    assert_error(
        api.post(path.format(session=session_id), raw=wrapped),
        400,
        "invalid_request_error",
        mentions="nests too deeply",
    )


def test_a_body_deeper_than_64_levels_is_refused_where_it_goes_too_deep(api):
    nested: object = "x"
    for _ in range(64):
        nested = [nested]
    body = {"name": "a", "model": "m", "metadata": {"k": nested}}  # levels: body, metadata, then 64 arrays
    assert_error(
        api.post("/v1/agents", body),
        400,
        "invalid_request_error",
        mentions="nests more than 64 levels deep (at 'metadata.k" + "[0]" * 62 + "')",
    )
    body["metadata"] = {
        "k": nested[0][0]
    }  # 64 levels in all: the edge lets it through to the field's own check
    assert_error(
        api.post("/v1/agents", body), 400, "invalid_request_error", mentions="'metadata.k' must be a string"
    )


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/agents", "/v1/sessions/{session}/events"])
@pytest.mark.parametrize(
    "value, reason",
    [
        ("2026-13-45T00:00:00Z", "month must be in 1..12"),
        ("2026-02-30T00:00:00Z", "day is out of range for month"),
        ("9999-12-31T23:59:59-23:59", "outside the years 1 to 9999 once in UTC"),
        ("0001-01-01T00:00:00+23:59", "outside the years 1 to 9999 once in UTC"),
    ],
)
def test_a_datetime_filter_that_is_no_real_time_is_a_400_naming_the_parameter(api, path, value, reason):
    session_id = new_session(api)
    for op in ("gt", "lte"):
        response = api.get(path.format(session=session_id), **{f"created_at[{op}]": value})
        body = assert_error(response, 400, "invalid_request_error", mentions=f"'created_at[{op}]'")
        assert reason in body["error"]["message"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/sessions/%00",
        "/v1/sessions/%00/events",
        "/v1/sessions/%00/events/stream",
        "/v1/sessions/%00/archive",
        "/v1/sessions/%00/sandboxes",
        "/v1/agents/%00",
        "/v1/agents/%00/versions",
        "/v1/environments/%00",
    ],
)
def test_a_nul_in_a_path_parameter_is_a_400_naming_it(api, path):
    response = api.get(path) if not path.endswith("archive") else api.post(path)
    assert_error(response, 400, "invalid_request_error", mentions="path parameter '")
    assert "holds a NUL character (U+0000)" in response.json()["error"]["message"]


def test_a_nul_in_a_sandbox_id_in_the_path_is_a_400(api):
    session_id = new_session(api)
    for suffix in ("", "/detach"):
        path = f"/v1/sessions/{session_id}/sandboxes/sbx_%00{suffix}"
        response = api.delete(path) if not suffix else api.post(path)
        assert_error(
            response, 400, "invalid_request_error", mentions="path parameter 'sandbox_id' holds a NUL"
        )


@pytest.mark.parametrize(
    "path, query",
    [
        ("/v1/sessions", {"agent_id": "\x00"}),
        ("/v1/sessions", {"statuses[]": "idle\x00"}),
        ("/v1/sessions", {"page": "\x00"}),
        ("/v1/agents", {"limit": "1\x00"}),
        ("/v1/sandboxes", {"free": "true\x00"}),
        ("/v1/sessions/{session}/events", {"types[]": "user.message\x00"}),
        ("/v1/sessions/{session}/events/stream", {"event_deltas[]": "agent.message\x00"}),
    ],
)
def test_a_nul_in_a_query_parameter_is_a_400_naming_it(api, path, query):
    session_id = new_session(api)
    [name] = query
    response = api.get(path.format(session=session_id), **query)
    assert_error(response, 400, "invalid_request_error", mentions=f"Query parameter '{name}' holds a NUL")


def test_a_nul_in_a_query_parameter_name_is_a_400(api):
    assert_error(
        api.get("/v1/sessions", **{"agent\x00id": "x"}),
        400,
        "invalid_request_error",
        mentions='query parameter name "agent\\u0000id" holds a NUL',
    )


@pytest.fixture
def operator(client):
    client.force_login(operator_of(User.objects.create_user("op", password="x", is_staff=True)))
    return client


@pytest.mark.parametrize(
    "path",
    [
        "/sessions/%00/",
        "/sessions/%00/panel",
        "/sessions/%00/replay",
        "/agents/%00/",
        "/environments/%00/",
    ],
)
def test_a_nul_in_a_ui_path_is_a_404_page(operator, path):
    response = operator.get(path)
    assert response.status_code == 404, response.content[:500]


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_the_path_of_an_async_ui_view_is_a_404(operator):
    """The timeline's fragment view is async: its operator check reads the user on a thread of its own."""
    assert operator.get("/sessions/%00/events").status_code == 404


def test_a_nul_in_a_ui_sandbox_id_is_a_404_and_a_nul_in_a_ui_filter_is_a_400(operator):
    session_id = make_session()
    assert operator.post(f"/sessions/{session_id}/sandboxes/%00/detach").status_code == 404
    assert operator.post("/sessions/%00/sandboxes/sbx_1/terminate").status_code == 404
    response = operator.get("/", {"agent": "\x00"})
    assert response.status_code == 400, response.content[:500]
    assert operator.get("/", {"agent": "agent_x"}).status_code == 200


def test_the_error_names_the_exact_block_of_a_message_with_many(api):
    session_id = new_session(api)
    message = {
        "type": "user.message",
        "content": [{"type": "text", "text": "fine"}] * 3 + [{"type": "text", "text": "bad \x00"}],
    }
    response = send(api, session_id, body={"events": [user_message(), message]})
    assert_error(response, 400, "invalid_request_error", mentions="'events[1].content[3].text' holds a NUL")
    assert not Event.objects.filter(session_id=session_id).exists()


@pytest.mark.server
def test_the_real_server_answers_the_same_400s_in_the_envelope(live_server_url, api_key):
    """Through Daphne, as an attacker's client sends them: a JSON error envelope, never an HTML error page."""

    def status_and_body(path: str, data: bytes | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{live_server_url}{path}",
            data=data,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    cases = [
        ("/v1/agents", DEEP),
        ("/v1/sessions/%00", None),
        ("/v1/sessions?agent_id=%00", None),
        ("/v1/sessions?created_at[gt]=9999-12-31T23:59:59-23:59", None),
        ("/v1/agents", b'{"name": "hi \\ud800", "model": "m"}'),
    ]
    for path, data in cases:
        status, body = status_and_body(path, data)
        assert status == 400 and body["error"]["type"] == "invalid_request_error", (path, body)


@pytest.mark.parametrize(
    "path", ["/admin/agent_sessions/session/%00/change/", "/admin/sandboxes/environment/%00/change/"]
)
def test_a_nul_in_an_admin_path_is_a_404_not_a_database_error(client, path):
    client.force_login(User.objects.create_superuser("root", password="x"))
    assert client.get(path).status_code == 404
    assert client.get("/admin/agent_sessions/session/", {"q": "\x00"}).status_code == 400


@pytest.mark.parametrize("config", ['{"type": "cloud", "note": "a\\u0000b"}', "[" * 100_000 + "]" * 100_000])
def test_a_form_field_of_json_that_is_not_text_or_nests_too_deeply_is_a_form_error(operator, config):
    from sandboxes.models import Environment

    response = operator.post("/environments/new", {"name": "hostile", "config": config})
    assert response.status_code == 400 and b"has-error" in response.content  # the form, with its error
    assert not Environment.objects.filter(name="hostile").exists()
