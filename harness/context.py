"""Context strategies: how a brain turns the log into the model's context, never changing the log."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.mcp import exposed_name_of
from kernel.errors import Invalid

CONTEXT_TYPES = ("full", "window", "compaction")


def validate_context(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") not in CONTEXT_TYPES:
        raise Invalid(
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
        raise Invalid(f"'context.{key}' must be a positive integer, not {number!r}.")
    return number


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [block for block in content or [] if block.get("type") != "redacted"]


def _result_block(event: Any, key: str) -> dict[str, Any]:
    content = [
        b
        for b in _blocks(event.payload.get("content"))
        if b.get("type") in ("text", "image", "document", "search_result")
    ]
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": event.payload[key],
        "content": content or [{"type": "text", "text": "(no output)"}],
    }
    if event.payload.get("is_error"):
        block["is_error"] = True
    return block


class _WorkerHands:
    """Which self-hosted worker holds the session's hands, as the log tells it (`sandbox.attached` with a
    `work_id`). When another worker takes over, the first result it sends tells the model so, since that worker
    may run on another machine, without what the calls before left on the first one."""

    def __init__(self) -> None:
        self.worker: tuple[str, str] | None = None
        self.moved: str | None = None

    def see(self, event: Any) -> None:
        if event.type != "sandbox.attached" or "work_id" not in event.payload:
            return
        worker = (event.payload.get("worker_id") or "", event.payload["work_id"])
        before = self.worker
        self.worker = worker
        if before is None or (worker[0] and worker[0] == before[0]):
            return
        now = f"worker {worker[0]}" if worker[0] else f"a new worker (work item {worker[1]})"
        was = f"worker {before[0]}" if before[0] else f"the worker of work item {before[1]}"
        self.moved = (
            f"[system] This result, and the tool calls after it, come from {now}: {was} was lost or stopped. "
            "It may be another machine: files, processes and installed packages that earlier calls left on "
            "the first one may not be there, so check before relying on them."
        )

    def noted(self, block: dict[str, Any]) -> dict[str, Any]:
        """A result block, with the takeover's note if it is the first result since another worker took over."""
        if self.moved is None:
            return block
        block["content"] = [*block["content"], {"type": "text", "text": self.moved}]
        self.moved = None
        return block


def messages_from_events(events: Iterable[Any], *, prefix: str | None = None) -> list[dict[str, Any]]:
    """The Messages API conversation the log describes: user turns, assistant turns, tool results.

    Tool call ids are the ids of their `agent.tool_use` events. Consecutive blocks of one role merge.
    """
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})

    if prefix:
        add("user", [{"type": "text", "text": prefix}])
    hands = _WorkerHands()
    for event in events:
        kind, payload = event.type, event.payload
        hands.see(event)
        if kind == "user.message":
            add("user", _blocks(payload.get("content")))
        elif kind == "system.message":
            add(
                "user",
                [
                    {"type": "text", "text": "[system] " + b.get("text", "")}
                    for b in _blocks(payload.get("content"))
                ],
            )
        elif kind == "user.define_outcome":
            add("user", [{"type": "text", "text": f"Outcome to reach: {payload.get('description', '')}"}])
        elif kind == "agent.message":
            add("assistant", _blocks(payload.get("content")))
        elif kind in ("agent.tool_use", "agent.custom_tool_use", "agent.mcp_tool_use"):
            add(
                "assistant",
                [
                    {
                        "type": "tool_use",
                        "id": event.uid,
                        "name": exposed_name_of(event),
                        "input": payload.get("input", {}),
                    }
                ],
            )
        elif kind == "agent.tool_result":
            add("user", [_result_block(event, "tool_use_id")])
        elif kind == "user.tool_result":
            add("user", [hands.noted(_result_block(event, "tool_use_id"))])
        elif kind == "user.custom_tool_result":
            add("user", [_result_block(event, "custom_tool_use_id")])
        elif kind == "agent.mcp_tool_result":
            add("user", [_result_block(event, "mcp_tool_use_id")])
    return _well_formed(messages)


def _well_formed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop what a window cut in half: results whose call fell outside it, and calls left unanswered."""
    called = {
        b["id"] for m in messages if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"
    }
    answered = {
        b["tool_use_id"]
        for m in messages
        if m["role"] == "user"
        for b in m["content"]
        if b["type"] == "tool_result"
    }
    cleaned: list[dict[str, Any]] = []
    for message in messages:
        blocks = [
            b
            for b in message["content"]
            if not (b["type"] == "tool_result" and b["tool_use_id"] not in called)
            and not (b["type"] == "tool_use" and b["id"] not in answered and message is not messages[-1])
        ]
        if blocks:
            if cleaned and cleaned[-1]["role"] == message["role"]:
                cleaned[-1]["content"].extend(blocks)
            else:
                cleaned.append({"role": message["role"], "content": blocks})
    while cleaned and cleaned[0]["role"] != "user":
        cleaned.pop(0)
    return cleaned


def context_events(strategy: dict[str, Any], events: list[Any]) -> tuple[list[Any], str | None]:
    """The slice of the log a strategy shows the model, and any summary prefix. The log is not changed.

    `events` is the whole log as the brain knows it, from seq 0 (harness/cache.py): a window is its tail,
    the very events the request's `through_seq` names (a read of the database here cost a query and a model
    instance for each of the window's events on every call, and could show an event the brain had not read)."""
    if strategy["type"] == "window":
        return events[-strategy["last_events"] :], None
    if strategy["type"] == "compaction":
        compacted = [
            e for e in events if e.type == "agent.thread_context_compacted" and e.payload.get("summary")
        ]
        if compacted:
            last = compacted[-1]
            through = last.payload["through_seq"]
            return [
                e for e in events if e.seq > through
            ], "Summary of the conversation so far:\n" + last.payload["summary"]
    return events, None


def needs_compaction(strategy: dict[str, Any], events: list[Any]) -> int | None:
    """The seq to compact through when the uncompacted tail has grown past the trigger, else None."""
    if strategy["type"] != "compaction":
        return None
    compacted = [e for e in events if e.type == "agent.thread_context_compacted" and e.payload.get("summary")]
    start = compacted[-1].payload["through_seq"] if compacted else -1
    tail = [e for e in events if e.seq > start]
    if len(tail) <= strategy["trigger_events"]:
        return None
    # Cut just before a user message so no tool call is split from its result.
    kept = tail[len(tail) - strategy["keep_events"] :]
    first_user = next((e for e in kept if e.type == "user.message"), None)
    return None if first_user is None else first_user.seq - 1
