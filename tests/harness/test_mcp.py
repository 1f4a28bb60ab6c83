"""MCP tools through a real brain: a local MCP server (the `mcp` SDK, streamable HTTP on 127.0.0.1), the
offline model calling its tools by their exposed names, real PostgreSQL for the log."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anthropic
import anyio
import httpx
import pytest
import uvicorn
from anthropic.types.beta.sessions.beta_managed_agents_agent_mcp_tool_result_event import (
    BetaManagedAgentsAgentMCPToolResultEvent,
)
from anthropic.types.beta.sessions.beta_managed_agents_agent_mcp_tool_use_event import (
    BetaManagedAgentsAgentMCPToolUseEvent,
)
from anthropic.types.beta.sessions.beta_managed_agents_session_error_event import (
    BetaManagedAgentsSessionErrorEvent,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.conf import settings
from django.test import override_settings
from mcp.server.mcpserver import MCPServer

from harness import mcp
from harness.brain import run_brain
from harness.lease import lease_acquire, lease_release
from harness.services.lifecycle import session_create, session_send_events
from sessions import events
from sessions.selectors import get_events
from sessions.services import emit_events
from tests.conftest import free_port, in_thread, make_agent, make_environment

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "mcp-test-bearer-token"


def tool_server() -> MCPServer:
    server = MCPServer("workbench-test")

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo: {text}"

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two whole numbers."""
        return a + b

    @server.tool()
    def shout(times: int) -> str:
        """A long answer."""
        return "la" * times

    @server.tool()
    async def wait(seconds: float) -> str:
        """Answer after a while."""
        await anyio.sleep(seconds)
        return "waited"

    return server


def bearer_guard(app: Any, token: str) -> Any:
    """The app behind a bearer token: a 401 with WWW-Authenticate without it, as MCP servers answer."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"www-authenticate", b'Bearer realm="mcp"'), (b"content-length", b"0")],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return guarded


async def garbage(scope: Any, receive: Any, send: Any) -> None:
    """Not an MCP server: whatever is asked, a web page."""
    if scope["type"] != "http":
        return
    body = b"<html><body>hello</body></html>"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def serving(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """`app` on `host` under uvicorn in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the MCP test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def mcp_url() -> Iterator[str]:
    with serving(tool_server().streamable_http_app()) as base:
        yield f"{base}/mcp"


@pytest.fixture(autouse=True)
def fresh_listings() -> Iterator[None]:
    mcp.listings.clear()
    with override_settings(EGRESS_HARNESS_URL="", MCP_TIMEOUT_SECONDS=10.0):
        yield
    mcp.listings.clear()
    # The process's brain watcher queried the database for these brains; let it give its connection back
    # (its next idle tick does) while this test may still use the database, not during the next test.
    time.sleep(2 * settings.INTERRUPT_POLL_SECONDS)


def mcp_session(url: str, *, policy: str | None = "always_allow", **toolset: Any) -> str:
    default = {} if policy is None else {"permission_policy": {"type": policy}}
    agent = make_agent(
        mcp_servers=[{"type": "url", "name": "tools", "url": url}],
        tools=[{"type": "mcp_toolset", "mcp_server_name": "tools", "default_config": default, **toolset}],
    )
    return session_create(agent=agent, environment_id=make_environment()).id


def say(session_id: str, text: str) -> None:
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
    )


def of(session_id: str, kind: str) -> list[Any]:
    return [e for e in get_events(session_id) if e.type == kind]


def sdk(event: Any, model: Any) -> Any:
    """The event as the official SDK reads it from the API (a shape it rejects fails here)."""
    return model.model_validate(event.as_api())


def texts(event: Any) -> str:
    return "\n".join(block.get("text", "") for block in event.payload.get("content") or [])


def test_an_mcp_tool_is_listed_called_and_its_result_fed_back(model_url, mcp_url):
    """The model calls mcp__tools__echo; the log has the call before its result, and the model reads it."""
    session_id = mcp_session(mcp_url)
    say(session_id, '/tool mcp__tools__echo {"text": "hello there"}')
    assert run_brain(session_id) == "idle"
    [use] = of(session_id, "agent.mcp_tool_use")
    [result] = of(session_id, "agent.mcp_tool_result")
    assert use.payload["name"] == "echo" and use.payload["mcp_server_name"] == "tools"
    assert use.payload["input"] == {"text": "hello there"}
    assert use.payload["evaluated_permission"] == "allow"
    assert use.seq < result.seq and result.payload["mcp_tool_use_id"] == use.uid
    assert result.payload["is_error"] is False
    assert texts(result) == "echo: hello there"
    assert "Result of mcp__tools__echo: echo: hello there" in texts(of(session_id, "agent.message")[-1])
    assert not of(session_id, "agent.tool_use") and not of(session_id, "session.error")
    assert sdk(use, BetaManagedAgentsAgentMCPToolUseEvent).mcp_server_name == "tools"
    assert sdk(result, BetaManagedAgentsAgentMCPToolResultEvent).content[0].text == "echo: hello there"
    assert get_events(session_id)[-1].payload["stop_reason"] == {"type": "end_turn"}


def test_the_listing_is_reused_within_its_ttl_and_a_second_tool_works(model_url, mcp_url):
    session_id = mcp_session(mcp_url)
    say(session_id, '/tool mcp__tools__add {"a": 2, "b": 40}\n/tool mcp__tools__echo {"text": "x"}')
    run_brain(session_id)
    assert [texts(r) for r in of(session_id, "agent.mcp_tool_result")] == ["42", "echo: x"]
    assert list(mcp.listings.entries) == [(session_id, "tools", mcp_url)]


def counted(app: Any, requests: list[tuple[str, str]]) -> Any:
    """`app`, noting each HTTP request's method and JSON-RPC method (or "-")."""

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            method = json.loads(body).get("method", "-") if body else "-"
        except ValueError:
            method = "?"
        requests.append((scope["method"], method))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return serve


def test_a_sessions_calls_share_one_open_mcp_session_and_it_closes_when_idle(model_url):
    """The brain process keeps the session's MCP session open: the second call is one request."""
    requests: list[tuple[str, str]] = []
    with (
        override_settings(MCP_SESSION_IDLE_SECONDS=1.0),
        serving(counted(tool_server().streamable_http_app(), requests)) as base,
    ):
        session_id = mcp_session(f"{base}/mcp")
        say(session_id, '/tool mcp__tools__add {"a": 1, "b": 2}')
        run_brain(session_id)
        first = len(requests)
        say(session_id, '/tool mcp__tools__add {"a": 3, "b": 4}')
        run_brain(session_id)
        assert [texts(r) for r in of(session_id, "agent.mcp_tool_result")] == ["3", "7"]
        assert requests[first:] == [("POST", "tools/call")], requests
        assert ("POST", "initialize") in requests[:first]
        deadline = time.monotonic() + 10
        while ("DELETE", "-") not in requests and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ("DELETE", "-") in requests, "an idle MCP session is ended"
        say(session_id, '/tool mcp__tools__add {"a": 5, "b": 6}')
        run_brain(session_id)
    assert texts(of(session_id, "agent.mcp_tool_result")[-1]) == "11"
    assert requests.count(("POST", "initialize")) == 2, "a new session after the idle one ended"


def test_a_long_result_is_cut_to_the_limit_with_a_note(model_url, mcp_url):
    session_id = mcp_session(mcp_url)
    say(session_id, '/tool mcp__tools__shout {"times": 5000}')
    with override_settings(MCP_RESULT_MAX_CHARS=1000):
        run_brain(session_id)
    [result] = of(session_id, "agent.mcp_tool_result")
    assert texts(result).startswith("la" * 500 + "\n[the rest of this result was cut")


def test_a_disabled_tool_is_not_offered_and_a_call_to_it_is_unknown(model_url, mcp_url):
    session_id = mcp_session(mcp_url, configs=[{"name": "add", "enabled": False}])
    say(session_id, '/tool mcp__tools__add {"a": 1, "b": 1}')
    run_brain(session_id)
    assert not of(session_id, "agent.mcp_tool_use")
    [result] = of(session_id, "agent.tool_result")
    assert result.payload["is_error"] and "Unknown tool" in texts(result)


def test_always_ask_waits_for_confirmation_then_runs(model_url, mcp_url):
    """The toolset's default policy (always_ask): requires_action on the call, then allow runs it."""
    session_id = mcp_session(mcp_url, policy=None)
    say(session_id, '/tool mcp__tools__echo {"text": "may I"}')
    run_brain(session_id)
    [use] = of(session_id, "agent.mcp_tool_use")
    assert use.payload["evaluated_permission"] == "ask"
    assert use.payload["evaluation"] == {"type": "always_ask"}
    idle = get_events(session_id)[-1]
    assert idle.payload["stop_reason"] == {"type": "requires_action", "event_ids": [use.uid]}
    assert not of(session_id, "agent.mcp_tool_result")
    session_send_events(
        session_id, events=[{"type": "user.tool_confirmation", "tool_use_id": use.uid, "result": "allow"}]
    )
    run_brain(session_id)
    [result] = of(session_id, "agent.mcp_tool_result")
    assert texts(result) == "echo: may I" and result.payload["is_error"] is False
    assert get_events(session_id)[-1].payload["stop_reason"] == {"type": "end_turn"}


def test_a_denied_mcp_call_is_answered_with_the_denial(model_url, mcp_url):
    session_id = mcp_session(mcp_url, policy="always_ask")
    say(session_id, '/tool mcp__tools__echo {"text": "no"}')
    run_brain(session_id)
    [use] = of(session_id, "agent.mcp_tool_use")
    session_send_events(
        session_id,
        events=[
            {
                "type": "user.tool_confirmation",
                "tool_use_id": use.uid,
                "result": "deny",
                "deny_message": "Nope.",
            }
        ],
    )
    run_brain(session_id)
    [result] = of(session_id, "agent.mcp_tool_result")
    assert result.payload["is_error"] and texts(result) == "Nope."


def test_an_interrupt_stops_a_running_mcp_call_and_ends_the_turn(model_url, mcp_url):
    session_id = mcp_session(mcp_url)
    say(session_id, '/tool mcp__tools__wait {"seconds": 30}')
    started = time.monotonic()
    brain = threading.Thread(target=in_thread, args=(lambda: run_brain(session_id),))
    brain.start()
    deadline = time.monotonic() + 20
    while not of(session_id, "agent.mcp_tool_use"):
        assert time.monotonic() < deadline, "the call was never made"
        time.sleep(0.05)
    session_send_events(session_id, events=[{"type": "user.interrupt"}])
    brain.join(20)
    assert not brain.is_alive() and time.monotonic() - started < 20
    [result] = of(session_id, "agent.mcp_tool_result")
    assert result.payload["is_error"] and "Interrupted by the user" in texts(result)
    assert get_events(session_id)[-1].type == "session.status_idle"


def test_a_server_that_is_down_is_an_mcp_connection_failed_error_and_the_turn_goes_on(model_url):
    session_id = mcp_session(f"http://127.0.0.1:{free_port()}/mcp")
    say(session_id, "hello")
    assert run_brain(session_id) == "idle"
    [error] = of(session_id, "session.error")
    assert error.payload["error"]["type"] == "mcp_connection_failed_error"
    assert error.payload["error"]["mcp_server_name"] == "tools"
    assert error.payload["error"]["retry_status"] == {"type": "retrying"}
    assert sdk(error, BetaManagedAgentsSessionErrorEvent).error.type == "mcp_connection_failed_error"
    assert texts(of(session_id, "agent.message")[-1]) == "You said: hello"
    assert get_events(session_id)[-1].payload["stop_reason"] == {"type": "end_turn"}


def test_a_server_that_goes_down_after_listing_fails_the_call_and_the_model_is_told(model_url):
    with serving(tool_server().streamable_http_app()) as base:
        url = f"{base}/mcp"
        session_id = mcp_session(url)
        say(session_id, "list the tools")
        run_brain(session_id)
    assert list(mcp.listings.entries) == [(session_id, "tools", url)]  # the listing outlives the server
    say(session_id, '/tool mcp__tools__echo {"text": "anyone?"}')
    run_brain(session_id)
    [use] = of(session_id, "agent.mcp_tool_use")
    [error] = of(session_id, "session.error")
    [result] = of(session_id, "agent.mcp_tool_result")
    assert use.seq < error.seq < result.seq
    assert error.payload["error"]["type"] == "mcp_connection_failed_error"
    assert result.payload["is_error"] and "The MCP tool call failed" in texts(result)
    assert "Error from mcp__tools__echo" in texts(of(session_id, "agent.message")[-1])


def test_a_server_that_answers_garbage_is_an_mcp_connection_failed_error(model_url):
    with serving(garbage) as base:
        session_id = mcp_session(f"{base}/mcp")
        say(session_id, "hello")
        run_brain(session_id)
    [error] = of(session_id, "session.error")
    assert error.payload["error"]["type"] == "mcp_connection_failed_error"


def test_a_server_that_times_out_is_an_mcp_connection_failed_error(model_url):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    port = listener.getsockname()[1]
    try:
        session_id = mcp_session(f"http://127.0.0.1:{port}/mcp")
        say(session_id, "hello")
        started = time.monotonic()
        with override_settings(MCP_TIMEOUT_SECONDS=1.0):
            run_brain(session_id)
        assert time.monotonic() - started < 8
    finally:
        listener.close()
    [error] = of(session_id, "session.error")
    assert error.payload["error"]["type"] == "mcp_connection_failed_error"
    assert "did not answer within 1 s" in error.payload["error"]["message"]


def test_a_server_demanding_a_token_without_the_proxy_is_an_authentication_error(model_url):
    with serving(bearer_guard(tool_server().streamable_http_app(), TOKEN)) as base:
        session_id = mcp_session(f"{base}/mcp")
        say(session_id, "hello")
        run_brain(session_id)
    [error] = of(session_id, "session.error")
    assert error.payload["error"]["type"] == "mcp_authentication_failed_error"
    assert error.payload["error"]["mcp_server_name"] == "tools"
    assert "egress proxy is not configured" in error.payload["error"]["message"]
    parsed = sdk(error, BetaManagedAgentsSessionErrorEvent).error
    assert (parsed.type, parsed.mcp_server_name, parsed.retry_status.type) == (
        "mcp_authentication_failed_error",
        "tools",
        "retrying",
    )
    assert get_events(session_id)[-1].payload["stop_reason"] == {"type": "end_turn"}


def test_an_mcp_call_a_dead_brain_left_open_is_closed_as_unverified(model_url, mcp_url):
    """Tool calls are recorded before they run: on wake, an MCP call without a result is never re-run."""
    session_id = mcp_session(mcp_url)
    say(session_id, "hi")
    dead = lease_acquire(session_id, owner="dead-worker", seconds=60)
    assert dead is not None
    last = get_events(session_id)[-1].seq
    start = emit_events(
        session_id,
        [(events.status_running(), None), (events.model_request_start(through_seq=last), None)],
        epoch=dead.epoch,
    )[-1]
    target = mcp.McpTarget("tools", mcp_url, "echo")
    emit_events(
        session_id,
        [
            (mcp.mcp_tool_use(target, {"text": "twice?"}, "allow"), None),
            (events.model_request_end(start.uid, stop_reason="tool_use", usage={}), None),
        ],
        epoch=dead.epoch,
    )
    lease_release(dead, clean=False)  # the worker died holding it
    run_brain(session_id)
    [result] = of(session_id, "agent.mcp_tool_result")
    assert result.payload["is_error"] and "unverified" in texts(result)
    assert any(e.payload.get("action") == "closed" for e in of(session_id, "brain.recovered"))


def test_the_proxy_gets_the_harness_identity_and_attaches_the_credential(model_url):
    """Through EGRESS_HARNESS_URL: every request carries the session's Proxy-Authorization and no Authorization;
    a stand-in for the egress proxy checks the identity and adds the bearer token, so the call succeeds."""
    seen: list[dict[str, str]] = []
    with (
        serving(bearer_guard(tool_server().streamable_http_app(), TOKEN)) as upstream,
        serving(stand_in_proxy(seen)) as proxy,
    ):
        session_id = mcp_session(f"{upstream}/mcp")
        say(session_id, '/tool mcp__tools__echo {"text": "via proxy"}')
        with override_settings(EGRESS_HARNESS_URL=proxy, EGRESS_HARNESS_TOKEN="harness-secret"):
            run_brain(session_id)
    [result] = of(session_id, "agent.mcp_tool_result")
    assert texts(result) == "echo: via proxy", texts(result)
    assert seen and all("authorization" not in headers for headers in seen)
    expected = "Basic " + base64.b64encode(f"session:{session_id}:harness-secret".encode()).decode()
    assert {headers.get("proxy-authorization") for headers in seen} == {expected}


@pytest.mark.parametrize(
    ("harness_token", "attach", "kind", "says"),
    [
        ("wrong", True, "mcp_connection_failed_error", "refused the harness's identity"),
        ("harness-secret", False, "mcp_authentication_failed_error", "vaults hold no valid credential"),
    ],
)
def test_through_the_proxy_a_refused_identity_or_a_missing_credential_is_a_clear_error(
    model_url, harness_token, attach, kind, says
):
    with (
        serving(bearer_guard(tool_server().streamable_http_app(), TOKEN)) as upstream,
        serving(stand_in_proxy([], attach=attach)) as proxy,
    ):
        session_id = mcp_session(f"{upstream}/mcp")
        say(session_id, "hello")
        with override_settings(EGRESS_HARNESS_URL=proxy, EGRESS_HARNESS_TOKEN=harness_token):
            run_brain(session_id)
    [error] = of(session_id, "session.error")
    assert error.payload["error"]["type"] == kind and says in error.payload["error"]["message"]
    assert (
        TOKEN not in error.payload["error"]["message"]
        and harness_token not in error.payload["error"]["message"]
    )


def stand_in_proxy(seen: list[dict[str, str]], *, attach: bool = True) -> Any:
    """A forward proxy for plain http in the egress proxy's place: records what the harness sent, refuses a
    wrong identity (407), attaches the bearer token and passes the answer back (streamed: SSE included)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        seen.append(headers)
        identity = base64.b64decode(headers.get("proxy-authorization", "Basic ")[6:]).decode()
        if not identity.startswith("session:") or not identity.endswith(":harness-secret"):
            await send({"type": "http.response.start", "status": 407, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        target = scope["raw_path"].decode()  # absolute-form: the whole upstream URL
        upstream_headers = {k: v for k, v in headers.items() if k not in ("proxy-authorization", "host")}
        if attach:
            upstream_headers["authorization"] = f"Bearer {TOKEN}"
        async with httpx.AsyncClient(timeout=10) as client:
            request = client.build_request(scope["method"], target, headers=upstream_headers, content=body)
            response = await client.send(request, stream=True)
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k.encode(), v.encode())
                        for k, v in response.headers.items()
                        if k.lower() not in ("content-length", "transfer-encoding", "connection")
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            await response.aclose()

    return app


def test_exposed_names_are_valid_unique_and_map_back():
    assert mcp.exposed_name("tools", "echo") == "mcp__tools__echo"
    odd = mcp.exposed_name("my server.v2", "do/thing")
    long = mcp.exposed_name("s" * 80, "t" * 80)
    for name in (odd, long):
        assert len(name) <= 64 and all(c.isalnum() or c in "_-" for c in name)
    # Pairs that would meet under one plain name are told apart.
    assert mcp.exposed_name("a__b", "c") != mcp.exposed_name("a", "b__c")
    assert mcp.exposed_name("a_", "t") != mcp.exposed_name("a", "_t")
    assert mcp.exposed_name("a.b", "c") != mcp.exposed_name("a_b", "c")


@pytest.mark.server
def test_the_sdk_sees_an_mcp_turn_with_confirmation_through_a_real_worker(
    live_server_url, api_key, brain_worker, mcp_url
):
    """The official SDK against the live server and a Celery worker: the two events as the SDK parses them."""
    client = anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=60)
    environment = client.beta.environments.create(
        name=f"mcp-{uuid.uuid4().hex[:8]}", config={"type": "cloud"}
    )
    agent = client.beta.agents.create(
        name="mcp",
        model="claude-sonnet-5-5",
        mcp_servers=[{"type": "url", "name": "tools", "url": mcp_url}],
        tools=[{"type": "mcp_toolset", "mcp_server_name": "tools"}],
    )
    session_id = client.beta.sessions.create(agent=agent.id, environment_id=environment.id).id

    def turn(events: list[Any]) -> list[Any]:
        collected: list[Any] = []
        with client.beta.sessions.events.stream(session_id) as stream:
            client.beta.sessions.events.send(session_id, events=events)
            for event in stream:
                collected.append(event)
                if event.type == "session.status_idle":
                    return collected
        raise AssertionError("the stream ended before the session went idle")

    first = turn(
        [
            {
                "type": "user.message",
                "content": [{"type": "text", "text": '/tool mcp__tools__add {"a": 2, "b": 3}'}],
            }
        ]
    )
    [use] = [e for e in first if e.type == "agent.mcp_tool_use"]
    assert (use.name, use.mcp_server_name, use.input, use.evaluated_permission) == (
        "add",
        "tools",
        {"a": 2, "b": 3},
        "ask",
    )
    assert first[-1].stop_reason.type == "requires_action" and first[-1].stop_reason.event_ids == [use.id]
    second = turn([{"type": "user.tool_confirmation", "tool_use_id": use.id, "result": "allow"}])
    [result] = [e for e in second if e.type == "agent.mcp_tool_result"]
    assert result.mcp_tool_use_id == use.id and not result.is_error and result.content[0].text == "5"
    assert second[-1].stop_reason.type == "end_turn"
    assert (
        "Result of mcp__tools__add: 5" in [e for e in second if e.type == "agent.message"][-1].content[0].text
    )


def self_signed(tmp_path: Any) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_file), str(key_file)


@contextmanager
def tunnel_proxy(seen: list[str]) -> Iterator[str]:
    """A CONNECT-only proxy (no interception) that records each CONNECT's head: HTTPS through the proxy."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        seen.append(head)
        target = head.split("\r\n", 1)[0].split(" ")[1]
        host, port = target.rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        state["port"] = server.sockets[0].getsockname()[1]
        state["stop"] = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        ready.set()
        async with server:
            await state["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)


def test_https_through_the_proxy_identifies_on_connect_and_trusts_the_proxy_ca(model_url, tmp_path):
    """An https server through the proxy: the identity rides on the CONNECT, TLS is checked against
    EGRESS_CA_FILE (the egress proxy's CA; here the server's own, as no proxy intercepts)."""
    cert, key = self_signed(tmp_path)
    port = free_port()
    app = tool_server().streamable_http_app()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", ssl_certfile=cert, ssl_keyfile=key
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the https MCP server did not start"
        time.sleep(0.02)
    heads: list[str] = []
    try:
        with tunnel_proxy(heads) as proxy:
            session_id = mcp_session(f"https://127.0.0.1:{port}/mcp")
            say(session_id, '/tool mcp__tools__echo {"text": "tls"}')
            with override_settings(
                EGRESS_HARNESS_URL=proxy, EGRESS_HARNESS_TOKEN="t0ken", EGRESS_CA_FILE=cert
            ):
                run_brain(session_id)
    finally:
        server.should_exit = True
        thread.join(10)
    [result] = of(session_id, "agent.mcp_tool_result")
    assert texts(result) == "echo: tls" and not result.payload["is_error"]
    expected = "Basic " + base64.b64encode(f"session:{session_id}:t0ken".encode()).decode()
    assert heads
    for head in heads:
        request_line, *lines = [line for line in head.split("\r\n") if line]
        assert request_line.startswith(f"CONNECT 127.0.0.1:{port} ")
        fields = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        assert fields.get("proxy-authorization") == expected and "authorization" not in fields
