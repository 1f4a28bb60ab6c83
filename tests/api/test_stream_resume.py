"""The SSE stream's resumption: each event's SSE id is its seq, and `Last-Event-ID` reads on from it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import make_agent, make_environment

pytestmark = pytest.mark.server


def _send(url: str, key: str, session_id: str, *texts: str) -> None:
    events = [{"type": "system.message", "content": [{"type": "text", "text": t}]} for t in texts]
    response = httpx.post(
        f"{url}/v1/sessions/{session_id}/events",
        headers={"x-api-key": key},
        json={"events": events},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def _read(
    url: str, key: str, session_id: str, last_event_id: str | None, count: int
) -> list[tuple[int, Any]]:
    """The first `count` log events the stream sends: (SSE id, the event's text)."""
    headers = {"x-api-key": key, **({"Last-Event-ID": last_event_id} if last_event_id is not None else {})}
    received: list[tuple[int, Any]] = []
    with httpx.stream(
        "GET", f"{url}/v1/sessions/{session_id}/events/stream", headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        seq: int | None = None
        for line in response.iter_lines():
            if line.startswith("id: "):
                seq = int(line[4:])
            elif line.startswith("data: ") and seq is not None:
                event = json.loads(line[6:])
                received.append((seq, event["content"][0]["text"]))
                seq = None
                if len(received) == count:
                    return received
    return received


def _new_session(url: str, api_key: str) -> dict:
    return httpx.post(
        f"{url}/v1/sessions",
        headers={"x-api-key": api_key},
        json={"agent": make_agent(), "environment_id": make_environment()},
        timeout=30,
    ).json()


def test_a_stream_reopened_with_last_event_id_gets_every_later_event_once_and_in_order(
    live_server_url, api_key
):
    session = _new_session(live_server_url, api_key)
    _send(live_server_url, api_key, session["id"], "a", "b", "c", "d")

    # From the start of the log, the ids are the seqs.
    first = _read(live_server_url, api_key, session["id"], "-1", 2)
    assert first == [(0, "a"), (1, "b")]
    # Written while no stream was open: a client coming back with its last id gets them, and no repeat.
    _send(live_server_url, api_key, session["id"], "e")
    assert _read(live_server_url, api_key, session["id"], str(first[-1][0]), 3) == [
        (2, "c"),
        (3, "d"),
        (4, "e"),
    ]


@pytest.mark.parametrize("value", ["x", "1.5", "-2", "5"])
def test_a_last_event_id_that_is_no_seq_this_stream_sent_is_a_400_saying_so(live_server_url, api_key, value):
    session = _new_session(live_server_url, api_key)
    _send(live_server_url, api_key, session["id"], "only")
    response = httpx.get(
        f"{live_server_url}/v1/sessions/{session['id']}/events/stream",
        headers={"x-api-key": api_key, "Last-Event-ID": value},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "'Last-Event-ID'" in error["message"], error
    assert "from -1 to 0" in error["message"]
