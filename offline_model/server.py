"""The HTTP server: ``POST /v1/messages``, ``GET /healthz`` and the loopback-only ``/_control`` endpoints.

One daemon thread per connection (HTTP/1.1 keep-alive, chunked SSE). Timing: response headers,
message_start and ping go out at once; the first content block waits until TTFT (plus any
``/sleep``) after the request arrived, and token deltas are then paced at the configured rate.
A client that hangs up is noticed both while waiting (the socket turns readable with EOF) and
while writing (broken pipe), and the request thread ends there.
"""

import json
import logging
import secrets
import select
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice
from typing import Any
from urllib.parse import urlsplit

from offline_model.render import Event, error_body, message_body, stream_events
from offline_model.script import Turn, count_input_tokens, plan_turn
from offline_model.state import FAULT_KINDS, Latency, ServerState

log = logging.getLogger(__name__)

BROKEN_STREAM_EVENTS = 4
"""message_start, ping, content_block_start and one delta, then the connection drops."""

_POLL_SECONDS = 0.1
_WRITE_BATCH_BYTES = 64 * 1024
_CLIENT_CLOSED_REQUEST = 499
_LOOPBACK = {"127.0.0.1", "::1"}
_FAULT_ERRORS = {
    "429": (
        429,
        "rate_limit_error",
        "Number of request tokens has exceeded your rate limit (injected fault).",
    ),
    "529": (529, "overloaded_error", "Overloaded (injected fault)."),
    "500": (500, "api_error", "Internal server error (injected fault)."),
}
# The SDK prefers retry-after-ms; both are small so retries in tests cost milliseconds.
_STREAM_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "transfer-encoding": "chunked",
}
_RETRY_HEADERS = {"retry-after": "0", "retry-after-ms": "20", "x-should-retry": "true"}


class ClientGone(Exception):
    """The client hung up (an interrupt) or the server is stopping: stop answering this request."""


class BadRequest(Exception):
    pass


class OfflineModelServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # benchmarks open 50 connections at once

    def __init__(self, address: tuple[str, int], *, latency: Latency | None = None) -> None:
        super().__init__(address, _Handler)
        self.state = ServerState(latency or Latency())
        self.stopping = threading.Event()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        """Stop accepting; requests in flight end at their next wait or write."""
        self.stopping.set()
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client hanging up between requests is routine, not a server error
        super().handle_error(request, client_address)


def request_problem(body: Any) -> str | None:
    """Why the Messages API would reject this body, in its words; None when it is acceptable."""
    if not isinstance(body, dict):
        return "Request body must be a JSON object."
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            return f"{field}: Field required"
    if not isinstance(body["model"], str) or not body["model"]:
        return "model: Input should be a non-empty string"
    max_tokens = body["max_tokens"]
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return "max_tokens: Input should be an integer greater than or equal to 1"
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        return "messages: Input should be a non-empty list"
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("user", "assistant")
            or not isinstance(message.get("content"), str | list)
        ):
            return f"messages.{index}: needs a role of 'user' or 'assistant' and a string or list content"
    if not isinstance(body.get("stream", False), bool):
        return "stream: Input should be a valid boolean"
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm the body would wait for the
    # client's delayed ACK of the headers (~40 ms on Linux) whenever both are small.
    disable_nagle_algorithm = True
    server: OfflineModelServer
    _sent_status = _CLIENT_CLOSED_REQUEST

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            self._send_json(200, {"status": "ok"})
        elif path == "/_control/stats" and self._is_loopback():
            self._send_json(200, self.server.state.stats())
        else:
            self._send_error(404, "not_found_error", f"Not found: GET {path}")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        # Read the whole body first, even when refusing, so a keep-alive connection stays in step.
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if path == "/v1/messages":
            self._messages(raw)
        elif path.startswith("/_control/") and self._is_loopback():
            try:
                self._control(path, _parse_json(raw))
            except BadRequest as error:
                self._send_error(400, "invalid_request_error", str(error))
        else:
            self._send_error(404, "not_found_error", f"Not found: POST {path}")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _control(self, path: str, body: Any) -> None:
        state = self.server.state
        if not isinstance(body, dict):
            raise BadRequest("Control bodies are JSON objects.")
        if path == "/_control/faults":
            kind, count = body.get("kind"), body.get("count", 1)
            if kind not in FAULT_KINDS or not _is_number(count) or not isinstance(count, int):
                raise BadRequest(f"Expected kind in {list(FAULT_KINDS)} and a whole count >= 0.")
            state.set_fault(kind, count)
            self._send_json(200, state.stats()["fault"])
        elif path == "/_control/latency":
            ttft_ms = body.get("ttft_ms")
            tps = (body["tps"] or 0) if "tps" in body else None  # null, like 0, means unlimited
            if any(value is not None and not _is_number(value) for value in (ttft_ms, tps)):
                raise BadRequest("Expected ttft_ms and tps as numbers >= 0 (tps 0 or null: unlimited).")
            latency = state.set_latency(ttft_ms=ttft_ms, tps=tps)
            self._send_json(200, {"ttft_ms": latency.ttft_ms, "tps": latency.tps})
        elif path == "/_control/reset":
            state.reset()
            self._send_json(200, state.stats())
        else:
            self._send_error(404, "not_found_error", f"Not found: POST {path}")

    def _messages(self, raw: bytes) -> None:
        arrived = time.monotonic()
        self._sent_status = _CLIENT_CLOSED_REQUEST
        disconnected = False
        with self.server.state.tracking_request():
            try:
                self._answer(raw, arrived=arrived, request_id=f"req_{secrets.token_hex(12)}")
            except (ClientGone, ConnectionError):
                disconnected = True
                self.close_connection = True
        self.server.state.record(self._sent_status, disconnected=disconnected)

    def _answer(self, raw: bytes, *, arrived: float, request_id: str) -> None:
        """Refuse the request as the real API would (or as a fault says), else reply to it."""
        if not (self.headers.get("x-api-key") or self.headers.get("authorization", "").startswith("Bearer ")):
            self._send_error(
                401, "authentication_error", "x-api-key header is required", request_id=request_id
            )
            return
        try:
            body = _parse_json(raw)
            problem = request_problem(body)
        except BadRequest as error:
            problem = str(error)
        if problem:
            self._send_error(400, "invalid_request_error", problem, request_id=request_id)
            return
        fault = self.server.state.take_fault()
        if fault in _FAULT_ERRORS:
            status, error_type, message = _FAULT_ERRORS[fault]
            self._send_error(status, error_type, message, request_id=request_id, headers=_RETRY_HEADERS)
            return
        self._reply(body, arrived=arrived, request_id=request_id, broken=fault == "broken_stream")

    def _reply(self, body: dict[str, Any], *, arrived: float, request_id: str, broken: bool) -> None:
        turn = plan_turn(body["messages"], max_tokens=body["max_tokens"])
        rendering = {
            "message_id": f"msg_{secrets.token_hex(12)}",
            "model": body["model"],
            "input_tokens": count_input_tokens(body),
        }
        latency = self.server.state.latency
        content_at = arrived + latency.ttft_ms / 1000 + turn.delay_seconds
        if body.get("stream"):
            self._start(200, {**_STREAM_HEADERS, "request-id": request_id})
            events = stream_events(turn, **rendering)
            if broken:
                self._stream(islice(events, BROKEN_STREAM_EVENTS), content_at, latency.tps, last_chunk=b"")
            else:
                self._stream(events, content_at, latency.tps)
        else:
            self._wait_until(content_at + _generation_seconds(turn, latency.tps))
            data = json.dumps(message_body(turn, **rendering)).encode()
            headers = {
                "content-type": "application/json",
                "content-length": str(len(data)),
                "request-id": request_id,
            }
            self._start(200, headers)
            self.wfile.write(data[: len(data) // 2] if broken else data)
        if broken:
            self.close_connection = True  # without the last chunk (or bytes), the client sees a cut body

    def _stream(
        self, events: Iterable[Event], content_at: float, tps: float, *, last_chunk: bytes = b"0\r\n\r\n"
    ) -> None:
        """Write the events, each no earlier than its deadline.

        Events that are already due go out together as one HTTP chunk, as a real server's buffered
        writes do: at unlimited speed a long answer costs a few system calls and chunks instead of one
        per word, and the client's SSE parser sees the same events.
        """
        pending = bytearray()

        def flush(end: bytes = b"") -> None:
            data = (b"%x\r\n%s\r\n" % (len(pending), pending) if pending else b"") + end
            if data:
                self.wfile.write(data)
            pending.clear()

        tokens = 0
        for event in events:
            deadline = content_at if event.name not in ("message_start", "ping") else 0.0
            if event.carries_token:
                deadline += tokens / tps if tps else 0.0
                tokens += 1
            if deadline > time.monotonic():
                flush()
                self._wait_until(deadline)
            pending += event.encode()
            if len(pending) >= _WRITE_BATCH_BYTES:
                flush()
        flush(last_chunk)

    def _wait_until(self, deadline: float) -> None:
        """Sleep until the deadline, but give up as soon as the client hangs up or the server stops."""
        while (remaining := deadline - time.monotonic()) > 0:
            if self.server.stopping.is_set():
                raise ClientGone
            readable, _, _ = select.select([self.connection], [], [], min(remaining, _POLL_SECONDS))
            if readable:
                if not self.connection.recv(1, socket.MSG_PEEK):
                    raise ClientGone
                time.sleep(min(remaining, _POLL_SECONDS))  # a pipelined request waits its turn

    def _is_loopback(self) -> bool:
        return self.client_address[0] in _LOOPBACK

    def _start(self, status: int, headers: Mapping[str, str]) -> None:
        self._sent_status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self._start(
            status, {"content-type": "application/json", "content-length": str(len(data)), **(headers or {})}
        )
        self.wfile.write(data)

    def _send_error(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        request_id = request_id or f"req_{secrets.token_hex(12)}"
        body = error_body(error_type, message, request_id=request_id)
        self._send_json(status, body, {"request-id": request_id, **(headers or {})})


def _parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadRequest(f"Request body is not valid JSON: {error}") from error


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _generation_seconds(turn: Turn, tps: float) -> float:
    return max(turn.output_tokens - 1, 0) / tps if tps else 0.0
