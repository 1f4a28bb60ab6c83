"""One streamed model request, as harness/model.py folds the SDK's stream of plain events."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import override_settings

from harness import model
from harness.model import ModelError, stream_response


def call(text: str) -> tuple[model.Response, list[tuple[int, str]]]:
    fragments: list[tuple[int, str]] = []
    response = stream_response(
        {"model": "claude-sonnet-5-5", "max_tokens": 1024, "messages": [{"role": "user", "content": text}]},
        on_text=lambda index, fragment: fragments.append((index, fragment)),
        cancelled=threading.Event(),
        register_cancel=lambda hook: None,
    )
    return response, fragments


def test_text_comes_out_as_its_fragments_arrive_and_usage_is_the_last_count(model_url):
    response, fragments = call("hello there")
    assert response.stop_reason == "end_turn"
    assert response.blocks == [{"type": "text", "text": "You said: hello there"}]
    assert len(fragments) > 1 and {index for index, _ in fragments} == {0}
    assert "".join(fragment for _, fragment in fragments) == "You said: hello there"
    # message_start says 1 output token; message_delta's cumulative count replaces it.
    assert response.usage["input_tokens"] > 0 and response.usage["output_tokens"] > 1
    assert set(response.usage) == set(model.USAGE_KEYS)


def test_thinking_keeps_its_signature_and_a_tool_call_its_parsed_input(model_url):
    response, fragments = call("/think first the plan\n/bash echo hi")
    assert response.stop_reason == "tool_use"
    thinking, *said, call_block = response.blocks
    assert thinking == {
        "type": "thinking",
        "thinking": "first the plan",
        "signature": base64.b64encode(hashlib.sha256(b"first the plan").digest()).decode(),
    }
    assert call_block == {"type": "tool_use", "name": "bash", "input": {"command": "echo hi"}}
    # Only text is previewed, under its own block's index.
    assert [block["type"] for block in said] == ["text"] * len(said)
    assert "".join(fragment for _, fragment in fragments) == "".join(block["text"] for block in said)


class _Server(http.server.ThreadingHTTPServer):
    events: list[tuple[str, dict[str, Any]]] = []


class _Streams(http.server.BaseHTTPRequestHandler):
    """Answers any POST with the server's events as server-sent events."""

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for name, data in self.server.events:  # type: ignore[attr-defined]
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _Streams)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with override_settings(ANTHROPIC_BASE_URL=f"http://127.0.0.1:{server.server_address[1]}"):
        model.client.cache_clear()
        yield server
    model.client.cache_clear()
    server.shutdown()


START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 7, "output_tokens": 1},
    },
}


def test_an_error_event_midway_is_the_model_error_it_names(scripted):
    scripted.events = [
        ("message_start", START),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        ),
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]
    with pytest.raises(ModelError) as raised:
        call("hello")
    assert raised.value.kind == "model_overloaded_error" and "Overloaded" in raised.value.message


def test_redacted_thinking_is_left_out_and_a_tool_input_in_pieces_is_joined(scripted):
    scripted.events = [
        ("message_start", START),
        ("ping", {"type": "ping"}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "redacted_thinking", "data": "x"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}},
            },
        ),
        *[
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": part},
                },
            )
            for part in ('{"comm', 'and": "l', 's"}')
        ],
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    response, _ = call("hello")
    assert response.blocks == [{"type": "tool_use", "name": "bash", "input": {"command": "ls"}}]
    assert response.stop_reason == "tool_use"
    assert response.usage == {
        "input_tokens": 7,
        "output_tokens": 12,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


REQUEST = {"model": "claude-sonnet-5-5", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}]}


def test_meanwhile_runs_while_the_request_is_out_and_before_any_text(model_url, streams):
    """The brain writes the request's start while the model reads the request: the request is sent from
    another thread before `meanwhile` ends, and no text reaches `on_text` until it has."""
    order: list[str] = []

    def meanwhile() -> None:
        # A brain that wrote first and sent after would wait here in vain.
        order.append("sent" if streams.sent.wait(10) else "not sent")
        order.append("meanwhile done")

    response = stream_response(
        REQUEST,
        on_text=lambda index, fragment: order.append("text"),
        cancelled=threading.Event(),
        register_cancel=lambda hook: None,
        meanwhile=meanwhile,
    )
    assert response.stop_reason == "end_turn"
    assert order[:3] == ["sent", "meanwhile done", "text"]


def test_what_meanwhile_raises_is_raised_as_it_is_and_the_stream_is_closed_unread(model_url, streams):
    class LeaseGone(Exception):
        pass

    def meanwhile() -> None:
        raise LeaseGone("another brain took the session")

    texts: list[str] = []
    with pytest.raises(LeaseGone):  # not a ModelError: the model did nothing wrong
        stream_response(
            REQUEST,
            on_text=lambda index, fragment: texts.append(fragment),
            cancelled=threading.Event(),
            register_cancel=lambda hook: None,
            meanwhile=meanwhile,
        )
    assert streams.closed.wait(10) and len(streams.opened) == 1 and texts == []


def test_a_request_that_fails_while_meanwhile_runs_is_the_model_error_after_it(scripted, monkeypatch):
    def create(request: dict[str, Any]) -> Any:
        raise model.anthropic.APIConnectionError(
            request=httpx.Request("POST", "http://127.0.0.1:9/v1/messages")
        )

    monkeypatch.setattr(model, "_create_stream", create)
    ran: list[str] = []
    with pytest.raises(ModelError) as raised:
        stream_response(
            REQUEST,
            on_text=lambda index, fragment: None,
            cancelled=threading.Event(),
            register_cancel=lambda hook: None,
            meanwhile=lambda: ran.append("meanwhile"),
        )
    assert ran == ["meanwhile"] and raised.value.kind == "model_request_failed_error"
