"""The model, through the official `anthropic` SDK: one streamed request, its previews, its errors."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import anthropic
from django.conf import settings

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
RETRYABLE_KINDS = frozenset(
    {"model_overloaded_error", "model_rate_limited_error", "model_request_failed_error"}
)


class ModelError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS


class Cancelled(Exception):
    """The call was stopped from outside (a user.interrupt, or the lease was lost)."""


@dataclass
class Response:
    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


@cache
def client() -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=settings.ANTHROPIC_API_KEY or "offline-model",
        base_url=settings.ANTHROPIC_BASE_URL or None,
        max_retries=0,  # the harness retries, and records each retry in the log
        timeout=settings.MODEL_TIMEOUT_SECONDS,
    )


def describe_model() -> str:
    if settings.ANTHROPIC_API_KEY:
        return f"Claude via {settings.ANTHROPIC_BASE_URL or 'the Anthropic API'}"
    return f"the offline model at {settings.ANTHROPIC_BASE_URL}"


def _classify(error: Exception) -> ModelError:
    if isinstance(error, anthropic.APIStatusError):
        body = error.body if isinstance(error.body, dict) else {}
        kind = (body.get("error") or {}).get("type") if isinstance(body.get("error"), dict) else None
        if error.status_code == 429 or kind == "rate_limit_error":
            return ModelError("model_rate_limited_error", f"The model is rate limited: {error.message}")
        if error.status_code == 529 or kind == "overloaded_error":
            return ModelError("model_overloaded_error", f"The model is overloaded: {error.message}")
        if error.status_code >= 500:
            return ModelError("model_request_failed_error", f"The model request failed: {error.message}")
        return ModelError(
            "unknown_error", f"The model refused the request ({error.status_code}): {error.message}"
        )
    return ModelError(
        "model_request_failed_error", f"The model request broke off: {type(error).__name__}: {error}"
    )


def stream_response(
    request: dict[str, Any],
    *,
    on_text: Callable[[int, str], None],
    cancelled: threading.Event,
    register_cancel: Callable[[Callable[[], None] | None], None],
    on_answered: Callable[[], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> Response:
    """Stream one Messages request. Text deltas go to `on_text(block_index, fragment)` as they arrive.

    `register_cancel` receives a function that aborts the stream from another thread. The SDK's raw
    event stream is folded here rather than by its `messages.stream()` helper, which rebuilds a snapshot
    of the whole message on every event: the harness needs the blocks only once, at the end. `on_answered`
    is called once the model has answered (the response's headers came), before its events are read.

    `meanwhile` runs in this thread while the request goes out from one of the process's sender threads: the
    brain writes the request's start to the log while the model reads the request, instead of before sending
    it (that append, 2 ms at p50 in bench/ttft's steady phase, came off every model call's first token). What
    `meanwhile` raises is raised as it is, and the stream is closed unread once it opens; no text reaches
    `on_text` before `meanwhile` returned.
    """
    sending = None
    if meanwhile is not None:
        sending = _senders().submit(_create_stream, request)
        try:
            meanwhile()
        except BaseException:
            sending.add_done_callback(_close_unread)
            raise
    try:
        stream = _create_stream(request) if sending is None else sending.result()
        register_cancel(stream.close)
        if on_answered is not None:
            on_answered()
        with stream:
            if cancelled.is_set():
                raise Cancelled()
            response = _fold_stream(stream, on_text)
    except Cancelled:
        raise
    except Exception as error:  # noqa: BLE001 - every failure of the call is classified for the log
        if cancelled.is_set():
            raise Cancelled() from None
        raise _classify(error) from error
    finally:
        register_cancel(None)
    return response


_senders_made: tuple[int, ThreadPoolExecutor] | None = None  # (the process that made them, the pool)
_senders_lock = threading.Lock()
# A worker's brains (its concurrency) each have at most one send out; a thread is made only when every one
# made before is busy sending, and kept.
SENDER_THREADS = 256


def _senders() -> ThreadPoolExecutor:
    """The process's threads that send model requests for `stream_response(meanwhile=...)`; a forked child
    makes its own (it has none of its parent's threads)."""
    global _senders_made
    with _senders_lock:
        if _senders_made is None or _senders_made[0] != os.getpid():
            pool = ThreadPoolExecutor(max_workers=SENDER_THREADS, thread_name_prefix="model-send")
            _senders_made = (os.getpid(), pool)
        return _senders_made[1]


def _close_unread(sending: Future[Any]) -> None:
    """Close the stream a sender opened for a caller that gave up on it (a request that failed has none)."""
    if not sending.cancelled() and sending.exception() is None:
        sending.result().close()


def _create_stream(request: dict[str, Any]) -> anthropic.Stream[Any]:
    """`client().messages.create(**request, stream=True)`, with the body encoded once, here, and the events as
    the JSON they came in.

    `messages.create` copies every block of the request (`prepare_request_data`) and then encodes the copy:
    for a long conversation that is a millisecond or two per call, spent again on every turn. The request
    is plain JSON the harness built itself, so it goes out through the SDK's own `post` as bytes. The
    response is the SDK's stream, with the same errors (an `error` event raises as `messages.create`'s does),
    but of `object`, which the SDK hands over as parsed, instead of building a typed model of every event:
    that cost ~20 µs an event, a text delta each, in the threads that also stream the other sessions' first
    tokens; `_fold_stream` reads the few fields it needs.
    """
    body = json.dumps({**request, "stream": True}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return client().post(
        "/v1/messages",
        content=body.encode(),
        cast_to=object,
        stream=True,
        stream_cls=anthropic.Stream[object],
    )


def _fold_stream(stream: Any, on_text: Callable[[int, str], None]) -> Response:
    """The message the raw stream events describe: its blocks in order, stop reason and usage."""
    blocks: dict[int, dict[str, Any]] = {}
    json_parts: dict[int, list[str]] = {}
    response = Response()
    usage: dict[str, int] = {}
    for event in stream:
        kind = event["type"]
        if kind == "content_block_delta":
            delta, index = event["delta"], event["index"]
            change = delta["type"]
            if change == "text_delta":
                blocks[index]["text"] += delta["text"]
                on_text(index, delta["text"])
            elif change == "input_json_delta":
                json_parts[index].append(delta["partial_json"])
            elif change == "thinking_delta":
                blocks[index]["thinking"] += delta["thinking"]
            elif change == "signature_delta":
                blocks[index]["signature"] += delta["signature"]
        elif kind == "content_block_start":
            block, index = event["content_block"], event["index"]
            if block["type"] == "text":
                blocks[index] = {"type": "text", "text": block.get("text", "")}
            elif block["type"] == "thinking":
                blocks[index] = {
                    "type": "thinking",
                    "thinking": block.get("thinking", ""),
                    "signature": block.get("signature") or "",
                }
            elif block["type"] == "tool_use":
                blocks[index] = {"type": "tool_use", "name": block["name"], "input": block.get("input") or {}}
                json_parts[index] = []
            else:
                blocks[index] = {"type": "other"}  # e.g. redacted thinking: not replayed to the model
        elif kind == "message_start":
            _add_usage(usage, event["message"].get("usage"))
        elif kind == "message_delta":
            response.stop_reason = event["delta"].get("stop_reason") or response.stop_reason
            _add_usage(usage, event.get("usage"))
    if response.stop_reason is None:
        raise ModelError("model_request_failed_error", "The model's stream ended before the message did.")
    for index, parts in json_parts.items():
        if parts and "".join(parts).strip():
            try:
                blocks[index]["input"] = json.loads("".join(parts))
            except ValueError:
                raise ModelError(
                    "model_request_failed_error",
                    "The model's stream carried a tool input that is not valid JSON.",
                ) from None
    response.blocks = [blocks[i] for i in sorted(blocks) if blocks[i]["type"] != "other"]
    response.usage = {key: usage.get(key, 0) for key in USAGE_KEYS}
    return response


def _add_usage(usage: dict[str, int], reported: dict[str, Any] | None) -> None:
    """Usage as the stream reports it: message_delta's counts are cumulative, so a later value replaces."""
    if reported is None:
        return
    for key in USAGE_KEYS:
        value = reported.get(key)
        if value is not None:
            usage[key] = value
