"""The events the platform itself writes, one constructor per shape: the day a shape changes, it changes here.

What users send is checked by `sessions.event_types`; what the model says is recorded as it said it. These
are the rest: statuses, spans, errors, the brain's own notes and the sandboxes' comings and goings. Each
returns the event as `emit_event` takes it (a dict with its `type`).
"""

from __future__ import annotations

from typing import Any, Literal

Retry = Literal["retrying", "exhausted", "terminal"]


def text_content(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


# -- the session's status, errors and usage


def status_running() -> dict[str, Any]:
    return {"type": "session.status_running"}


def status_idle(
    stop_reason: str, *, through_seq: int | None = None, event_ids: list[str] | None = None
) -> dict[str, Any]:
    """The turn ended for `stop_reason`; `through_seq`: the inputs it saw (a brain's idle consumes them);
    `event_ids`: with `requires_action`, the calls that wait for the client."""
    reason: dict[str, Any] = {"type": stop_reason}
    if event_ids is not None:
        reason["event_ids"] = event_ids
    event: dict[str, Any] = {"type": "session.status_idle", "stop_reason": reason}
    if through_seq is not None:
        event["through_seq"] = through_seq
    return event


def status_terminated() -> dict[str, Any]:
    return {"type": "session.status_terminated"}


def session_error(kind: str, message: str, *, retry: Retry, **details: Any) -> dict[str, Any]:
    """An error the session's user should see; `retry` says whether the platform tries again."""
    return {
        "type": "session.error",
        "error": {"type": kind, "message": message, "retry_status": {"type": retry}, **details},
    }


def session_usage(usage: dict[str, int]) -> dict[str, Any]:
    return {"type": "session.usage", "usage": dict(usage)}


def session_updated(**changed: Any) -> dict[str, Any]:
    return {"type": "session.updated", **changed}


def session_deleted() -> dict[str, Any]:
    return {"type": "session.deleted"}


# -- a model request


def model_request_start(*, through_seq: int) -> dict[str, Any]:
    """A model request begins; it consumes the inputs through `through_seq`."""
    return {"type": "span.model_request_start", "through_seq": through_seq}


def model_request_end(
    start_id: str,
    *,
    error: str | None = None,
    stop_reason: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The request `start_id` ended: with the model's `stop_reason` and `usage`, or failed with `error` (its
    inputs then count as not yet answered)."""
    if error is not None:
        return {
            "type": "span.model_request_end",
            "model_request_start_id": start_id,
            "is_error": True,
            "model_usage": {},
            "error": error,
        }
    return {
        "type": "span.model_request_end",
        "model_request_start_id": start_id,
        "is_error": False,
        "stop_reason": stop_reason,
        "model_usage": usage or {},
    }


def tool_result(tool_use_id: str, text: str, *, is_error: bool) -> dict[str, Any]:
    """The platform's answer to the model's call `tool_use_id`."""
    return {
        "type": "agent.tool_result",
        "tool_use_id": tool_use_id,
        "content": text_content(text),
        "is_error": is_error,
    }


# -- the brain's own notes


def brain_recovered(**what: Any) -> dict[str, Any]:
    """A brain took over from one that died: what it found (`woken_by`, `closed_model_request`, `tool_use_id`,
    …) and what it did about it."""
    return {"type": "brain.recovered", **what}


def brain_parked(*, attempts: int) -> dict[str, Any]:
    """`attempts` wakes in a row died, so the session was parked rather than woken again."""
    return {"type": "brain.parked", "attempts": attempts}


def harness_switched(harness: str) -> dict[str, Any]:
    return {"type": "brain.harness_switched", "harness": harness}


# -- sandboxes (a session's hands)


def sandbox_provisioned(
    sandbox_id: str, name: str, *, provider: str, pooled: bool, returned: bool = False
) -> dict[str, Any]:
    """`pooled`: taken from the environment's warm pool; `returned`: taken from those an earlier session of
    the environment provisioned ahead and never used (sandboxes/returns.py)."""
    event = {
        "type": "sandbox.provisioned",
        "sandbox_id": sandbox_id,
        "name": name,
        "provider": provider,
        "pooled": pooled,
    }
    return {**event, "returned": True} if returned else event


def _worker(work_id: str | None, worker_id: str | None) -> dict[str, str]:
    """A self-hosted worker's hands: the work item it serves and the worker (its Anthropic-Worker-ID)."""
    return {} if work_id is None else {"work_id": work_id, "worker_id": worker_id or ""}


def sandbox_failed(
    name: str,
    reason: str,
    *,
    sandbox_id: str | None = None,
    work_id: str | None = None,
    worker_id: str | None = None,
) -> dict[str, Any]:
    """A sandbox could not be provisioned (no `sandbox_id` yet), or died or failed a check (with one); a
    self-hosted worker's hands (`work_id`, `worker_id`) fail when the worker is lost."""
    event: dict[str, Any] = {"type": "sandbox.failed"}
    if sandbox_id is not None:
        event["sandbox_id"] = sandbox_id
    return {**event, "name": name, "reason": reason, **_worker(work_id, worker_id)}


def sandbox_attached(
    sandbox_id: str,
    name: str,
    *,
    from_session: str | None = None,
    provider: str | None = None,
    work_id: str | None = None,
    worker_id: str | None = None,
) -> dict[str, Any]:
    """Hands joined the session: passed from another session, or a self-hosted worker's (`provider`,
    `work_id`, `worker_id`) claiming the session's work item."""
    event: dict[str, Any] = {"type": "sandbox.attached", "sandbox_id": sandbox_id, "name": name}
    if from_session is not None:
        event["from_session"] = from_session
    if provider is not None:
        event["provider"] = provider
    return {**event, **_worker(work_id, worker_id)}


def sandbox_detached(
    sandbox_id: str, name: str, *, to_session: str | None = None, returned: bool = False
) -> dict[str, Any]:
    """`returned`: the session ended without using it, and it went back to its environment, for the next
    session (sandboxes/returns.py)."""
    event: dict[str, Any] = {"type": "sandbox.detached", "sandbox_id": sandbox_id, "name": name}
    if to_session is not None:
        event["to_session"] = to_session
    if returned:
        event["returned"] = True
    return event


def sandbox_terminated(
    sandbox_id: str,
    name: str,
    *,
    reason: str | None = None,
    work_id: str | None = None,
    worker_id: str | None = None,
) -> dict[str, Any]:
    """The sandbox ended; a self-hosted worker's hands (`work_id`, `worker_id`) end when its item stops."""
    event: dict[str, Any] = {"type": "sandbox.terminated", "sandbox_id": sandbox_id, "name": name}
    if reason is not None:
        event["reason"] = reason
    return {**event, **_worker(work_id, worker_id)}


def fork_created(from_session: str, *, through_seq: int) -> dict[str, Any]:
    return {"type": "fork.created", "from_session": from_session, "through_seq": through_seq}
