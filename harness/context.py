"""Context strategies: how a brain turns the log into the model's context, never changing the log."""

from __future__ import annotations

from typing import Any

from workbench.api.errors import InvalidRequest

CONTEXT_TYPES = ("full", "window", "compaction")


def validate_context(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") not in CONTEXT_TYPES:
        raise InvalidRequest(
            "'context' must be an object with 'type' one of full, window (with 'last_events'), "
            "or compaction (with 'trigger_events' and 'keep_events')."
        )
    kind = value["type"]
    if kind == "full":
        return {"type": "full"}
    if kind == "window":
        return {"type": "window", "last_events": _positive(value, "last_events", 200)}
    return {
        "type": "compaction",
        "trigger_events": _positive(value, "trigger_events", 400),
        "keep_events": _positive(value, "keep_events", 100),
    }


def _positive(value: dict[str, Any], key: str, default: int) -> int:
    number = value.get(key, default)
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise InvalidRequest(f"'context.{key}' must be a positive integer, not {number!r}.")
    return number
