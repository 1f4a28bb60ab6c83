"""The session WebSocket as an attacker meets it, on the real server (Daphne) with a real WebSocket client:
which pages may open it (scheme, host and port of the Origin), which workspace's sessions a key or a person
may watch (another workspace's session closes exactly as a missing one), and a socket that closes once its
key is revoked, its operator logs out or loses the workspace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from bench.common.processes import daphne
from harness.agents import agent_create
from harness.services.lifecycle import session_create
from kernel.keys import api_key_create, api_key_revoke
from kernel.models import DEFAULT_WORKSPACE_ID, Membership, Workspace
from sandboxes.environments import environment_create
from sessions.services import emit_event
from tests.conftest import ROOT, child_env, in_thread, operator_of, require
from tests.wsclient import WebSocket

pytestmark = [pytest.mark.server, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

TRUSTED = "https://app.example.test:8443"
RECHECK = "0.5"


def _server(**extra: str) -> Iterator[str]:
    import redis
    from django.conf import settings

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as error:
        require(False, f"no Redis at {settings.REDIS_URL} ({error}); run `make test`, which starts one")
    env = child_env(
        STREAM_CATCHUP_SECONDS="0.5",
        STREAM_PING_SECONDS="1",
        STREAM_RECHECK_SECONDS=RECHECK,
        CSRF_TRUSTED_ORIGINS=TRUSTED,
        **extra,
    )
    with daphne(env, ROOT / ".pytest-daphne.log", append_log=True, timeout=90) as url:
        yield url


@pytest.fixture(scope="module")
def server(django_db_setup: Any, django_db_blocker: Any) -> Iterator[str]:
    """One Daphne for the module (each test's rows are committed, so it sees them), trusting TRUSTED."""
    yield from _server()


def message(text: str) -> dict[str, Any]:
    return {"type": "system.message", "content": [{"type": "text", "text": text}]}


def session_in(workspace_id: str = DEFAULT_WORKSPACE_ID) -> str:
    agent = agent_create(workspace_id=workspace_id, name="watched", model="claude-sonnet-5-5").agent_id
    environment = environment_create(name=f"env-{workspace_id}", workspace_id=workspace_id).id
    return session_create(agent=agent, environment_id=environment, workspace_id=workspace_id).id


def other_workspace() -> str:
    return Workspace.objects.create(slug="other", name="Other").id


def logged_in_client(user: User) -> tuple[Client, str]:
    """A login session for `user` in the test database, and the Cookie header a browser sends with it."""
    client = Client()
    client.force_login(user)
    return client, f"sessionid={client.cookies['sessionid'].value}"


def cookie_of(user: User) -> str:
    return logged_in_client(user)[1]


async def in_db_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a synchronous database function from a scenario (in a thread, its connection closed after)."""
    return await asyncio.to_thread(in_thread, lambda: function(*args, **kwargs))


def staff(name: str, **fields: Any) -> User:
    return User.objects.create_user(name, password="a-long-operator-password", is_staff=True, **fields)


def socket_url(server: str, session_id: str, after: int | None = -1) -> str:
    query = "" if after is None else f"?after={after}"
    return f"ws://{urlsplit(server).netloc}/ws/sessions/{session_id}/{query}"


def origin_of(server: str) -> str:
    return server  # http://127.0.0.1:<port>: the page this server serves


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def first_and_close(url: str, headers: dict[str, str]) -> tuple[list[dict[str, Any]], int | None]:
    """What the server sends until it closes (a refused socket says why, then closes)."""
    ws = await WebSocket.connect(url, headers)
    return await ws.until_closed(timeout=15)


async def events_then_close(url: str, headers: dict[str, str], count: int) -> WebSocket:
    ws = await WebSocket.connect(url, headers)
    seen = [await ws.receive(timeout=15) for _ in range(count)]
    assert [frame["type"] for frame in seen] == ["event"] * count, seen
    return ws


# -- the Origin: scheme, host and port -------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:9999",  # the right host on another port: another page (and another program)
        "https://127.0.0.1:{port}",  # the right host and port, the other scheme
        "http://localhost:{port}",  # a host ALLOWED_HOSTS has, but not the one this socket was opened to
        "http://evil.example",
        "null",  # a sandboxed frame or a file: page
        "https://app.example.test",  # the trusted origin's host on another port
    ],
)
def test_a_socket_from_another_origin_is_closed_with_the_reason(server, origin):
    session_id = session_in()
    _, key = api_key_create(name="k")
    origin = origin.format(port=urlsplit(server).port)
    messages, code = run(
        first_and_close(socket_url(server, session_id), {"Origin": origin, "Authorization": f"Bearer {key}"})
    )
    assert code == 4403
    assert messages[0]["type"] == "error"
    assert repr(origin) in messages[0]["message"] and "CSRF_TRUSTED_ORIGINS" in messages[0]["message"]


@pytest.mark.parametrize("origin", ["own", TRUSTED, None])
def test_the_servers_own_page_a_trusted_origin_and_an_api_client_without_origin_open_the_socket(
    server, origin
):
    session_id = session_in()
    emit_event(session_id, message("hello"))
    _, key = api_key_create(name="k")
    headers = {"Authorization": f"Bearer {key}"}
    if origin is not None:
        headers["Origin"] = origin_of(server) if origin == "own" else origin

    async def scenario() -> dict[str, Any]:
        ws = await WebSocket.connect(socket_url(server, session_id), headers)
        frame = await ws.receive(timeout=15)
        await ws.close()
        return frame

    frame = run(scenario())
    assert frame["type"] == "event" and frame["seq"] == 0


def test_a_wildcard_in_allowed_hosts_does_not_let_every_origin_in(transactional_db):
    session_id = session_in()
    _, key = api_key_create(name="k")
    for url in _server(ALLOWED_HOSTS="*"):
        messages, code = run(
            first_and_close(
                socket_url(url, session_id),
                {"Origin": "http://evil.example", "Authorization": f"Bearer {key}"},
            )
        )
        assert code == 4403 and "'http://evil.example'" in messages[0]["message"]


# -- the credential, asked again while the socket is open ---------------------------------------------


def test_a_socket_closes_when_its_api_key_is_revoked(server):
    session_id = session_in()
    emit_event(session_id, message("hello"))
    key, raw = api_key_create(name="k")

    async def scenario() -> tuple[list[dict[str, Any]], int | None]:
        ws = await events_then_close(socket_url(server, session_id), {"Authorization": f"Bearer {raw}"}, 1)
        await in_db_thread(api_key_revoke, key.pk, workspace_id=DEFAULT_WORKSPACE_ID)
        return await ws.until_closed(timeout=15)

    messages, code = run(scenario())
    assert code == 4401
    assert messages[-1]["type"] == "error" and "API key was revoked" in messages[-1]["message"]


@pytest.mark.parametrize("change", ["log out", "no longer staff", "deactivated"])
def test_a_socket_closes_when_its_operator_logs_out_or_is_no_longer_an_operator(server, change):
    session_id = session_in()
    emit_event(session_id, message("hello"))
    user = operator_of(staff("watcher"))
    client, cookie = logged_in_client(user)

    def apply() -> None:
        if change == "log out":
            client.logout()
        else:
            field = "is_staff" if change == "no longer staff" else "is_active"
            User.objects.filter(pk=user.pk).update(**{field: False})

    async def scenario() -> tuple[list[dict[str, Any]], int | None]:
        headers = {"Origin": origin_of(server), "Cookie": cookie}
        ws = await events_then_close(socket_url(server, session_id), headers, 1)
        await in_db_thread(apply)
        return await ws.until_closed(timeout=15)

    messages, code = run(scenario())
    assert code == 4401
    assert messages[-1]["type"] == "error" and "logged out" in messages[-1]["message"]


def test_a_socket_stays_open_while_its_credentials_hold(server):
    """The re-check closes only what it should: a key and an operator that still hold keep their sockets
    through several re-checks, and see new events."""
    session_id = session_in()
    _, raw = api_key_create(name="k")
    cookie = cookie_of(operator_of(staff("watcher")))

    async def scenario() -> list[list[int]]:
        sockets = [
            await WebSocket.connect(socket_url(server, session_id), {"Authorization": f"Bearer {raw}"}),
            await WebSocket.connect(
                socket_url(server, session_id), {"Origin": origin_of(server), "Cookie": cookie}
            ),
        ]
        await asyncio.sleep(4 * float(RECHECK))
        await in_db_thread(emit_event, session_id, message("later"))
        seqs = [[(await ws.receive(timeout=15))["seq"]] for ws in sockets]
        for ws in sockets:
            await ws.close()
        return seqs

    assert run(scenario()) == [[0], [0]]


# -- workspaces: another workspace's session is a missing one -----------------------------------------


def _refusal(server: str, session_id: str, headers: dict[str, str]) -> tuple[str, int | None]:
    messages, code = run(first_and_close(socket_url(server, session_id), headers))
    assert messages and messages[0]["type"] == "error", messages
    return messages[0]["message"], code


def test_a_key_of_another_workspace_is_told_the_session_does_not_exist(server):
    theirs = session_in(other_workspace())
    _, mine = api_key_create(name="mine")
    headers = {"Authorization": f"Bearer {mine}"}
    missing = _refusal(server, "sesn_doesnotexist", headers)
    other = _refusal(server, theirs, headers)
    assert other[1] == missing[1] == 4404
    assert other[0] == missing[0].replace("sesn_doesnotexist", theirs)


def test_an_operator_who_is_no_member_is_told_the_session_does_not_exist(server):
    theirs = session_in(other_workspace())
    cookie = cookie_of(operator_of(staff("outsider")))  # a member of the default workspace only
    headers = {"Origin": origin_of(server), "Cookie": cookie}
    missing = _refusal(server, "sesn_doesnotexist", headers)
    other = _refusal(server, theirs, headers)
    assert other[1] == missing[1] == 4404
    assert other[0] == missing[0].replace("sesn_doesnotexist", theirs)


@pytest.mark.parametrize("who", ["viewer", "operator", "admin", "superuser", "key"])
def test_every_member_and_the_workspaces_key_may_watch(server, who):
    workspace = other_workspace()
    session_id = session_in(workspace)
    emit_event(session_id, message("hello"))
    if who == "key":
        headers = {"Authorization": f"Bearer {api_key_create(name='k', workspace_id=workspace)[1]}"}
    elif who == "superuser":
        root = User.objects.create_superuser("root", password="a-long-operator-password")
        headers = {"Origin": origin_of(server), "Cookie": cookie_of(root)}
    else:
        headers = {"Origin": origin_of(server), "Cookie": cookie_of(operator_of(staff(who), who, workspace))}

    async def scenario() -> dict[str, Any]:
        ws = await WebSocket.connect(socket_url(server, session_id), headers)
        frame = await ws.receive(timeout=15)
        await ws.close()
        return frame

    frame = run(scenario())
    assert frame["type"] == "event" and frame["session"] == session_id


def test_a_socket_closes_when_its_operator_leaves_the_workspace(server):
    workspace = other_workspace()
    session_id = session_in(workspace)
    emit_event(session_id, message("hello"))
    user = operator_of(staff("member"), "viewer", workspace)
    cookie = cookie_of(user)

    async def scenario() -> tuple[list[dict[str, Any]], int | None]:
        headers = {"Origin": origin_of(server), "Cookie": cookie}
        ws = await events_then_close(socket_url(server, session_id), headers, 1)
        await in_db_thread(Membership.objects.filter(user=user, workspace_id=workspace).delete)
        return await ws.until_closed(timeout=15)

    messages, code = run(scenario())
    assert code == 4401
    assert messages[-1]["type"] == "error" and "no longer a member" in messages[-1]["message"]
