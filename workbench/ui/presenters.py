"""Events as the timeline shows them: one `EventView` per event, whatever its type.

Django templates cannot call functions, so everything a template shows is worked out here once: the
kind that picks the event's look, its text, the pretty-printed input of a tool call, whether an output
is long enough to fold. The same views feed the page, the live fragments and the replay player.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sessions.models import Event

CALL_TYPES = frozenset({"agent.tool_use", "agent.mcp_tool_use", "agent.custom_tool_use"})
# Result type -> the payload field naming the call it answers.
RESULT_TYPES = {
    "agent.tool_result": "tool_use_id",
    "agent.mcp_tool_result": "mcp_tool_use_id",
    "user.tool_result": "tool_use_id",
    "user.custom_tool_result": "custom_tool_use_id",
}
# An output longer than this (in lines or characters) is shown folded in a <details>.
LONG_LINES, LONG_CHARS = 12, 1500
PREVIEW_LINES = 4

_KINDS = {
    "user.message": "user",
    "user.interrupt": "user",
    "user.tool_confirmation": "user",
    "user.define_outcome": "user",
    "system.message": "system",
    "agent.message": "agent",
    "agent.thinking": "thinking",
    "agent.thread_context_compacted": "brain",
    "session.error": "error",
    "span.model_request_start": "span",
    "span.model_request_end": "span",
    "session.usage": "span",
    "fork.created": "fork",
}
_LABELS = {
    "user.message": "You",
    "user.interrupt": "Interrupt",
    "user.tool_confirmation": "Confirmation",
    "user.custom_tool_result": "Custom tool result",
    "user.tool_result": "Tool result",
    "system.message": "System",
    "agent.message": "Agent",
    "agent.thinking": "Thinking",
    "agent.tool_use": "Tool call",
    "agent.mcp_tool_use": "MCP tool call",
    "agent.custom_tool_use": "Custom tool call",
    "agent.tool_result": "Tool result",
    "agent.mcp_tool_result": "MCP tool result",
    "agent.thread_context_compacted": "Context compacted",
    "session.status_running": "Running",
    "session.status_idle": "Idle",
    "session.status_rescheduled": "Rescheduled",
    "session.status_terminated": "Terminated",
    "session.error": "Error",
    "session.usage": "Usage",
    "session.updated": "Session updated",
    "session.deleted": "Session deleted",
    "span.model_request_start": "Model request",
    "span.model_request_end": "Model response",
    "brain.lease_acquired": "Lease acquired",
    "brain.lease_released": "Lease released",
    "brain.harness_switched": "Harness switched",
    "brain.recovered": "Brain recovered",
    "brain.parked": "Brain parked",
    "sandbox.provisioned": "Sandbox provisioned",
    "sandbox.attached": "Sandbox attached",
    "sandbox.detached": "Sandbox detached",
    "sandbox.failed": "Sandbox failed",
    "sandbox.terminated": "Sandbox terminated",
    "fork.created": "Forked",
}


@dataclass
class EventView:
    seq: int
    uid: str
    type: str
    kind: str
    label: str
    at: str = ""
    at_ms: int = 0
    epoch: int | None = None
    # The previous lease epoch when this event is the first written under a new one.
    epoch_from: int | None = None
    epoch_changed: bool = False
    actor: str = ""  # who sent it: a person or a key (the platform's own events have none)
    text: str = ""
    detail: str = ""
    is_error: bool = False
    # A tool call: its id (the event's), name, input, and what it still waits for.
    call_id: str = ""
    tool: str = ""
    command: str = ""
    input_json: str = ""
    needs_confirmation: bool = False
    custom: bool = False
    answered: bool = False
    # A result, a confirmation: the call it belongs to.
    result_for: str = ""
    answers: str = ""
    output: str = ""
    output_head: str = ""
    output_long: bool = False
    output_lines: int = 0
    links: list[tuple[str, str]] = field(default_factory=list)
    raw: str = ""
    preview: bool = False
    # One line: head and body side by side (status changes, model spans, usage).
    compact: bool = False


def _text(content: Any) -> str:
    parts = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind:
            parts.append(f"[{kind}]")
    return "\n".join(parts)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _kind(event_type: str) -> str:
    if event_type in CALL_TYPES:
        return "call"
    if event_type in RESULT_TYPES:
        return "result"
    if event_type.startswith("session.status_"):
        return "status"
    if event_type.startswith("brain."):
        return "brain"
    if event_type.startswith("sandbox."):
        return "sandbox"
    return _KINDS.get(event_type, "other")


def _output(view: EventView, text: str) -> None:
    lines = text.splitlines()
    view.output, view.output_lines = text, len(lines)
    view.output_long = len(lines) > LONG_LINES or len(text) > LONG_CHARS
    if view.output_long:
        view.output_head = "\n".join(lines[:PREVIEW_LINES])[:400]


def _session_link(session_id: Any) -> tuple[str, str]:
    return (str(session_id), f"/sessions/{session_id}/")


def present(event: Event, *, answered: bool = False) -> EventView:
    payload = event.payload or {}
    view = EventView(
        seq=event.seq,
        uid=event.uid,
        type=event.type,
        kind=_kind(event.type),
        label=_LABELS.get(event.type, event.type),
        epoch=event.lease_epoch,
        at=event.processed_at.strftime("%H:%M:%S"),
        at_ms=int(event.processed_at.timestamp() * 1000),
        actor=event.actor,
    )
    view.compact = view.kind in ("status", "span")
    if view.kind == "other":
        view.raw = _json(event.as_api())
    kind = event.type
    if kind in ("user.message", "agent.message", "system.message"):
        view.text = _text(payload.get("content"))
    elif kind == "agent.thinking":
        view.text = str(payload.get("thinking") or "")
    elif kind in CALL_TYPES:
        view.call_id, view.tool = event.uid, str(payload.get("name") or "")
        tool_input = payload.get("input") or {}
        view.command = str(tool_input.get("command", "")) if isinstance(tool_input, dict) else ""
        view.input_json = _json(tool_input)
        view.custom = kind == "agent.custom_tool_use"
        view.needs_confirmation = payload.get("evaluated_permission") == "ask"
        view.answered = answered
    elif kind in RESULT_TYPES:
        view.result_for = str(payload.get(RESULT_TYPES[kind]) or "")
        view.is_error = bool(payload.get("is_error"))
        _output(view, _text(payload.get("content")) or "(no output)")
    elif kind == "user.tool_confirmation":
        view.answers = str(payload.get("tool_use_id") or "")
        allowed = payload.get("result") == "allow"
        view.text = "Allowed the call." if allowed else "Denied the call."
        if not allowed and payload.get("deny_message"):
            view.detail = str(payload["deny_message"])
    elif kind == "user.interrupt":
        view.text = "Stop what you are doing."
    elif kind == "session.error":
        error = payload.get("error") or {}
        view.is_error = True
        view.text = str(error.get("message") or error.get("type") or "error")
        retry = (error.get("retry_status") or {}).get("type")
        view.detail = f"{error.get('type', 'error')}" + (f" · retry: {retry}" if retry else "")
    elif kind == "session.status_idle":
        reason = payload.get("stop_reason") or {}
        view.text = str(reason.get("type") or "")
        if reason.get("type") == "requires_action":
            view.detail = "Waiting for you to answer " + ", ".join(reason.get("event_ids") or [])
    elif kind == "span.model_request_end":
        usage = payload.get("model_usage") or {}
        view.is_error = bool(payload.get("is_error"))
        if view.is_error:
            view.text = str(payload.get("error") or "failed")
        else:
            view.text = (
                f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"
                f" · {payload.get('stop_reason') or ''}"
            )
    elif kind == "span.model_request_start":
        view.text = f"through #{payload['through_seq']}" if "through_seq" in payload else ""
    elif kind == "session.usage":
        usage = payload.get("usage") or {}
        view.text = f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens in total"
    elif kind == "brain.harness_switched":
        view.text = f"to {payload.get('harness')}"
    elif kind == "brain.recovered":
        view.text = ", ".join(f"{k}: {v}" for k, v in sorted(payload.items()))
    elif kind == "brain.parked":
        view.is_error = True
        view.text = f"after {payload.get('attempts')} failed wakes"
    elif view.kind == "sandbox":
        name, sandbox_id = payload.get("name"), payload.get("sandbox_id")
        view.text = " ".join(str(x) for x in (f"“{name}”" if name else "", sandbox_id or "") if x)
        view.is_error = kind == "sandbox.failed"
        if payload.get("reason"):
            view.detail = str(payload["reason"])
        if payload.get("pooled"):
            view.detail = "from the warm pool"
        if payload.get("returned"):
            view.detail = (
                "returned unused by an earlier session of the environment"
                if kind == "sandbox.provisioned"
                else "unused: returned to the environment for the next session"
            )
        if payload.get("from_session"):
            view.links.append(("from", _session_link(payload["from_session"])[1]))
            view.detail = f"passed from {payload['from_session']}"
        if payload.get("to_session"):
            view.links.append(("to", _session_link(payload["to_session"])[1]))
            view.detail = f"passed to {payload['to_session']}"
    elif kind == "fork.created":
        view.text = f"from {payload.get('from_session')}, copying events [0:{payload.get('through_seq')}]"
        if payload.get("from_session"):
            view.links.append(
                ("origin", f"/sessions/{payload['from_session']}/#seq-{payload.get('through_seq', 0)}")
            )
    elif kind == "agent.thread_context_compacted":
        view.text = f"through #{payload.get('through_seq')}"
        _output(view, str(payload.get("summary") or ""))
    return view


def preview_view() -> EventView:
    """The shell of an agent message still being streamed (filled in by the browser, token by token)."""
    return EventView(seq=-1, uid="", type="agent.message", kind="agent", label="Agent", preview=True)
