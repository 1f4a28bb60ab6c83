"""A planned turn as the Anthropic Messages API puts it on the wire: one JSON body or SSE events.

The event order is the real API's, which the SDK's stream accumulator relies on:
message_start, ping, then per block content_block_start / *_delta... / content_block_stop,
then message_delta (stop_reason and cumulative usage) and message_stop.
"""

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from offline_model.script import Block, Turn


@dataclass(frozen=True)
class Event:
    name: str
    data: dict[str, Any]
    carries_token: bool = False
    """True for the deltas that the tokens-per-second rate paces."""

    def encode(self) -> bytes:
        return f"event: {self.name}\ndata: {json.dumps(self.data)}\n\n".encode()


def message_body(turn: Turn, *, message_id: str, model: str, input_tokens: int) -> dict[str, Any]:
    return {
        **_message_head(message_id=message_id, model=model),
        "content": [
            _final_block(block, _tool_use_id(message_id, index)) for index, block in enumerate(turn.blocks)
        ],
        "stop_reason": turn.stop_reason,
        "usage": _usage(input_tokens=input_tokens, output_tokens=turn.output_tokens),
    }


def stream_events(turn: Turn, *, message_id: str, model: str, input_tokens: int) -> Iterator[Event]:
    start = {
        **_message_head(message_id=message_id, model=model),
        "content": [],
        "stop_reason": None,
        # The real API reports one output token before anything is generated.
        "usage": _usage(input_tokens=input_tokens, output_tokens=1),
    }
    yield Event("message_start", {"type": "message_start", "message": start})
    yield Event("ping", {"type": "ping"})
    for index, block in enumerate(turn.blocks):
        yield from _block_events(index, block, _tool_use_id(message_id, index))
    yield Event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": turn.stop_reason, "stop_sequence": None},
            "usage": _usage(input_tokens=input_tokens, output_tokens=turn.output_tokens),
        },
    )
    yield Event("message_stop", {"type": "message_stop"})


def error_body(error_type: str, message: str, *, request_id: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}


def _block_events(index: int, block: Block, tool_use_id: str) -> Iterator[Event]:
    if block.type == "text":
        empty: dict[str, Any] = {"type": "text", "text": ""}
        delta_type, delta_field = "text_delta", "text"
    elif block.type == "thinking":
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        delta_type, delta_field = "thinking_delta", "thinking"
    else:
        empty = {"type": "tool_use", "id": tool_use_id, "name": block.name, "input": {}}
        delta_type, delta_field = "input_json_delta", "partial_json"
    yield Event(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}
    )
    for piece in block.pieces:
        delta = {"type": delta_type, delta_field: piece}
        yield Event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}, True
        )
    if block.type == "thinking":
        delta = {"type": "signature_delta", "signature": _signature(block.content)}
        yield Event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
    yield Event("content_block_stop", {"type": "content_block_stop", "index": index})


def _final_block(block: Block, tool_use_id: str) -> dict[str, Any]:
    if block.type == "text":
        return {"type": "text", "text": block.content}
    if block.type == "thinking":
        return {"type": "thinking", "thinking": block.content, "signature": _signature(block.content)}
    return {"type": "tool_use", "id": tool_use_id, "name": block.name, "input": dict(block.input)}


def _message_head(*, message_id: str, model: str) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "stop_sequence": None}


def _usage(*, input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
    }


def _tool_use_id(message_id: str, index: int) -> str:
    """Unique per message, so two sessions running the same script never share an id."""
    return f"toolu_{message_id.removeprefix('msg_')}{index:02d}"


def _signature(thinking: str) -> str:
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()
