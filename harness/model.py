"""The model, through the official `anthropic` SDK: one streamed request, its previews, its errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import anthropic
from django.conf import settings

RETRYABLE_KINDS = frozenset({"model_overloaded_error", "model_rate_limited_error", "model_request_failed_error"})


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
        return ModelError("unknown_error", f"The model refused the request ({error.status_code}): {error.message}")
    return ModelError("model_request_failed_error", f"The model request broke off: {type(error).__name__}: {error}")


def stream_response(
    request: dict[str, Any],
    *,
    on_text: Callable[[int, str], None],
    cancelled: threading.Event,
    register_cancel: Callable[[Callable[[], None] | None], None],
) -> Response:
    """Stream one Messages request. Text deltas go to `on_text(block_index, fragment)` as they arrive.

    `register_cancel` receives a function that aborts the stream from another thread.
    """
    response = Response()
    try:
        with client().messages.stream(**request) as stream:
            register_cancel(stream.close)
            if cancelled.is_set():
                raise Cancelled()
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    on_text(event.index, event.delta.text)
            message = stream.get_final_message()
    except Cancelled:
        raise
    except Exception as error:  # noqa: BLE001 - every failure of the call is classified for the log
        if cancelled.is_set():
            raise Cancelled() from None
        raise _classify(error) from error
    finally:
        register_cancel(None)
    for block in message.content:
        if block.type == "text":
            response.blocks.append({"type": "text", "text": block.text})
        elif block.type == "thinking":
            response.blocks.append({"type": "thinking", "thinking": block.thinking, "signature": block.signature})
        elif block.type == "tool_use":
            response.blocks.append({"type": "tool_use", "name": block.name, "input": block.input})
    response.stop_reason = message.stop_reason
    usage = message.usage
    response.usage = {
        "input_tokens": usage.input_tokens or 0,
        "output_tokens": usage.output_tokens or 0,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens or 0,
        "cache_read_input_tokens": usage.cache_read_input_tokens or 0,
    }
    return response
