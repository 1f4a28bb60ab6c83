"""The event catalogue (reference §7.1) plus Workbench's own types, and checks for what users may send."""

from __future__ import annotations

from typing import Any

from kernel.api.validation import expect, no_unknown_fields, text
from kernel.errors import Invalid

MANAGED_AGENTS_TYPES = frozenset(
    [
        "user.message",
        "user.interrupt",
        "user.tool_confirmation",
        "user.custom_tool_result",
        "user.tool_result",
        "user.define_outcome",
        "system.message",
        "agent.message",
        "agent.thinking",
        "agent.tool_use",
        "agent.tool_result",
        "agent.mcp_tool_use",
        "agent.mcp_tool_result",
        "agent.custom_tool_use",
        "agent.thread_message_received",
        "agent.thread_message_sent",
        "agent.thread_context_compacted",
        "session.status_running",
        "session.status_idle",
        "session.status_rescheduled",
        "session.status_terminated",
        "session.error",
        "session.thread_created",
        "session.thread_status_running",
        "session.thread_status_idle",
        "session.thread_status_rescheduled",
        "session.thread_status_terminated",
        "session.updated",
        "session.usage",
        "session.deleted",
        "span.model_request_start",
        "span.model_request_end",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_ongoing",
        "span.outcome_evaluation_end",
        "workflow_run.created",
        "workflow_run.status_running",
        "workflow_run.status_idle",
        "workflow_run.status_ended",
        "workflow_run.error",
        "workflow_run.phase_started",
        "workflow_run.phase_ended",
    ]
)

# What a brain writes only once a step has done something (the model answered, a call was made or settled): a
# wake that died after writing one of these made progress, so the next crash is not the same step's. What a
# wake writes before its step (brain.recovered, a request's start, its error closing) is not progress.
PROGRESS_TYPES = (
    "agent.message",
    "agent.thinking",
    "agent.tool_use",
    "agent.tool_result",
    "agent.mcp_tool_use",
    "agent.mcp_tool_result",
    "agent.custom_tool_use",
    "agent.thread_context_compacted",
)
# Workbench's own event types, each under a prefix of its own (listed in the README's event table).
WORKBENCH_TYPES = frozenset(
    [
        "brain.lease_acquired",
        "brain.lease_released",
        "brain.harness_switched",
        "brain.recovered",
        "brain.parked",
        "sandbox.provisioned",
        "sandbox.attached",
        "sandbox.detached",
        "sandbox.failed",
        "sandbox.terminated",
        "fork.created",
    ]
)
KNOWN_TYPES = MANAGED_AGENTS_TYPES | WORKBENCH_TYPES

SENDABLE_TYPES = (
    "user.message",
    "user.interrupt",
    "user.tool_confirmation",
    "user.custom_tool_result",
    "user.tool_result",
    "user.define_outcome",
    "system.message",
)


def _content(value: Any, where: str, *, allowed: tuple[str, ...]) -> list[dict[str, Any]]:
    expect(value, list, f"'{where}'")
    for i, block in enumerate(value):
        bwhere = f"{where}[{i}]"
        expect(block, dict, f"'{bwhere}'")
        kind = block.get("type")
        if kind not in allowed:
            raise Invalid(f"'{bwhere}.type' must be one of {', '.join(allowed)}, not {kind!r}.")
        if kind == "text":
            no_unknown_fields(block, ("type", "text", "citations", "cache_control"), bwhere)
            text(block, "text", bwhere, required=True)
        elif kind in ("image", "document"):
            source = expect(block.get("source"), dict, f"'{bwhere}.source'")
            if source.get("type") not in ("base64", "url", "file", "text"):
                raise Invalid(f"'{bwhere}.source.type' must be base64, url, file or text.")
        elif kind == "search_result":
            for key in ("source", "title"):
                text(block, key, bwhere, required=True)
            expect(block.get("content"), list, f"'{bwhere}.content'")
    return value


def validate_sendable(event: Any, where: str) -> dict[str, Any]:
    """A user or system event as sent to `POST /v1/sessions/{id}/events`, checked field by field."""
    expect(event, dict, f"'{where}'")
    kind = event.get("type")
    if kind not in SENDABLE_TYPES:
        raise Invalid(f"'{where}.type' is {kind!r}; events you can send are {', '.join(SENDABLE_TYPES)}.")
    if kind == "user.message":
        no_unknown_fields(event, ("type", "content"), where)
        if "content" not in event:
            raise Invalid(f"'{where}.content' is required.")
        content = _content(
            event["content"], f"{where}.content", allowed=("text", "image", "document", "redacted")
        )
        if not content:
            raise Invalid(f"'{where}.content' must hold at least one block.")
    elif kind == "system.message":
        no_unknown_fields(event, ("type", "content"), where)
        if "content" not in event:
            raise Invalid(f"'{where}.content' is required.")
        _content(event["content"], f"{where}.content", allowed=("text",))
    elif kind == "user.interrupt":
        no_unknown_fields(event, ("type", "session_thread_id"), where)
        text(event, "session_thread_id", where, nullable=True)
    elif kind == "user.tool_confirmation":
        no_unknown_fields(
            event, ("type", "tool_use_id", "result", "deny_message", "session_thread_id"), where
        )
        text(event, "tool_use_id", where, required=True, min_length=1)
        if event.get("result") not in ("allow", "deny"):
            raise Invalid(f"'{where}.result' must be 'allow' or 'deny', not {event.get('result')!r}.")
        if "deny_message" in event:
            if event["result"] != "deny":
                raise Invalid(f"'{where}.deny_message' is only allowed with result 'deny'.")
            text(event, "deny_message", where, nullable=True)
    elif kind in ("user.custom_tool_result", "user.tool_result"):
        id_field = "custom_tool_use_id" if kind == "user.custom_tool_result" else "tool_use_id"
        no_unknown_fields(event, ("type", id_field, "content", "is_error", "session_thread_id"), where)
        text(event, id_field, where, required=True, min_length=1)
        if "content" in event:
            _content(
                event["content"], f"{where}.content", allowed=("text", "image", "document", "search_result")
            )
        if "is_error" in event:
            expect(event["is_error"], bool, f"'{where}.is_error'", nullable=True)
    elif kind == "user.define_outcome":
        no_unknown_fields(event, ("type", "description", "rubric", "max_iterations"), where)
        text(event, "description", where, required=True, min_length=1)
        rubric = expect(event.get("rubric"), dict, f"'{where}.rubric'")
        if rubric.get("type") not in ("text", "file"):
            raise Invalid(f"'{where}.rubric.type' must be 'text' or 'file'.")
        iterations = event.get("max_iterations", 3)
        if not isinstance(iterations, int) or isinstance(iterations, bool) or not 1 <= iterations <= 20:
            raise Invalid(f"'{where}.max_iterations' must be an integer from 1 to 20.")
    return event


def validate_types_filter(types: list[str], where: str = "types[]") -> list[str]:
    unknown = [t for t in types if t not in KNOWN_TYPES]
    if unknown:
        raise Invalid(
            f"Query parameter '{where}' has unknown event type{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(u) for u in unknown)}."
        )
    return types
