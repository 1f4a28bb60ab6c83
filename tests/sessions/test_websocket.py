"""The UI's WebSocket: every seq after `after` exactly once and in order, even while appends race it."""

from __future__ import annotations

import asyncio
import sys

import pytest
from channels.testing import WebsocketCommunicator

from sessions.services import emit_event
from tests.conftest import ROOT, child_env, in_thread, make_session
from workbench.asgi import application


def message(text: str) -> dict:
    return {"type": "system.message", "content": [{"type": "text", "text": text}]}


def communicator(
    session_id: str, api_key: str | None, after: int | str | None = None
) -> WebsocketCommunicator:
    query = "" if after is None else f"?after={after}"
    headers = [(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1")]
    if api_key:
        headers.append((b"authorization", f"Bearer {api_key}".encode()))
    return WebsocketCommunicator(application, f"/ws/sessions/{session_id}/{query}", headers=headers)


async def receive_events(ws: WebsocketCommunicator, count: int, timeout: float = 60) -> list[int]:
    seqs: list[int] = []
    while len(seqs) < count:
        frame = await ws.receive_json_from(timeout=timeout)
        if frame["type"] == "event":
            seqs.append(frame["seq"])
    return seqs


@pytest.mark.django_db(transaction=True)
def test_a_client_connecting_mid_append_gets_every_seq_once_in_order(redis_url, api_key):
    session_id = make_session()
    for i in range(50):
        emit_event(session_id, message(f"before-{i}"))
    writers, each = 4, 150
    total = 50 + writers * each

    async def scenario() -> list[int]:
        processes = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.sessions.emitter",
                session_id,
                str(w),
                str(each),
                cwd=ROOT,
                env=child_env(),
            )
            for w in range(writers)
        ]
        await asyncio.sleep(0.3)
        ws = communicator(session_id, api_key, after=9)
        connected, _ = await ws.connect(timeout=30)
        assert connected
        seqs = await receive_events(ws, total - 10)
        assert [await p.wait() for p in processes] == [0] * writers
        assert await ws.receive_nothing(timeout=1.5)
        await ws.disconnect()
        return seqs

    seqs = asyncio.run(scenario())
    assert seqs == list(range(10, total))


@pytest.mark.django_db(transaction=True)
def test_without_after_the_socket_sends_only_new_events(redis_url, api_key):
    session_id = make_session()
    emit_event(session_id, message("old"))

    async def scenario() -> list[int]:
        ws = communicator(session_id, api_key)
        connected, _ = await ws.connect(timeout=10)
        assert connected
        await asyncio.to_thread(in_thread, lambda: emit_event(session_id, message("new")))
        seqs = await receive_events(ws, 1)
        await ws.disconnect()
        return seqs

    assert asyncio.run(scenario()) == [1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("key", "session", "after", "code", "says"),
    [
        (False, "real", None, 4401, "Log in"),
        (True, "missing", None, 4404, "No session"),
        (True, "real", "abc", 4400, "'after' must be an integer"),
        (True, "sesn_%00x", None, 4400, "NUL"),
    ],
)
def test_the_socket_refuses_with_a_reason(redis_url, api_key, key, session, after, code, says):
    session_id = make_session() if session == "real" else "sesn_missing" if session == "missing" else session

    async def scenario() -> tuple[dict, dict]:
        ws = communicator(session_id, api_key if key else None, after=after)
        await ws.connect(timeout=10)
        error = await ws.receive_json_from(timeout=10)
        closed = await ws.receive_output(timeout=10)
        return error, closed

    error, closed = asyncio.run(scenario())
    assert error["type"] == "error" and says in error["message"]
    assert closed == {"type": "websocket.close", "code": code}
