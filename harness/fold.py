"""Folding the log into what a brain needs to decide its next step. Pure: events in, state out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sessions.models import Event

INPUT_TYPES = frozenset({"user.message", "system.message", "user.define_outcome"})
RESULT_TYPES = {
    "agent.tool_result": "tool_use_id",
    "user.tool_result": "tool_use_id",
    "user.custom_tool_result": "custom_tool_use_id",
    "agent.mcp_tool_result": "mcp_tool_use_id",
}
# A self-hosted worker's hands (a sandbox event with its `work_id`) end as sandbox.failed when the worker is
# lost, as sandbox.terminated when its work item stops (sandboxes/work_queue.py).
WORKER_GONE_TYPES = frozenset({"sandbox.failed", "sandbox.terminated"})


# A brain.recovered note's action for a call a gone worker may have run, safe to run again, listed for the next.
RELISTED = "left for the next worker"


def result_key(tool_use_id: str) -> str:
    """The idempotency key every result of a call is written with, by a brain or a user: one per call."""
    return f"{tool_use_id}:result"


STATUS_TYPES = {
    "session.status_running": "running",
    "session.status_idle": "idle",
    "session.status_rescheduled": "rescheduling",
    "session.status_terminated": "terminated",
}


@dataclass
class ToolCall:
    use: Event
    result: Event | None = None
    confirmation: Event | None = None

    @property
    def id(self) -> str:
        return self.use.uid

    @property
    def custom(self) -> bool:
        return self.use.type == "agent.custom_tool_use"

    @property
    def runnable_seq(self) -> int | None:
        """The seq from which the call may run: its use, or its confirmation when it asked for one; None
        while it waits for the confirmation."""
        if self.confirmation is not None:
            return self.confirmation.seq
        if self.custom or self.use.payload.get("evaluated_permission") != "ask":
            return self.use.seq
        return None


@dataclass
class SessionState:
    """Where the session stands, as far as the log says."""

    status: str = "idle"
    last_seq: int = -1
    # Inputs are consumed by a model request or an idle that saw them (their `through_seq`).
    consumed_through: int = -1
    # What was consumed before the open model request: a request that fails gives its inputs back.
    consumed_before_request: int = -1
    idle_through: int = -1
    last_idle: Event | None = None
    inputs: list[Event] = field(default_factory=list)
    interrupt: Event | None = None
    open_request: Event | None = None
    last_response_end: Event | None = None
    calls: dict[str, ToolCall] = field(default_factory=dict)
    last_response_calls: list[str] = field(default_factory=list)
    response_calls: list[str] = field(default_factory=list)
    harness: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    # The epochs that wrote each seq, to tell whether an earlier brain may have started a tool.
    writers: list[tuple[int, int]] = field(default_factory=list)
    # A sandbox event is in the log. Every hand a session gets (provisioned, from the pool, attached, passed
    # to it) is logged there, so until one is, the session holds none and nobody needs to ask the database.
    hands_seen: bool = False
    # The last time a self-hosted worker's hands left the session (its work item was lost or stopped): a call
    # it could run and did not answer may have run on its machine, or not.
    worker_gone_seq: int = -1
    # How often each call was listed again for the next worker after one left it unanswered.
    relisted: dict[str, int] = field(default_factory=dict)

    @property
    def pending_inputs(self) -> list[Event]:
        return [event for event in self.inputs if event.seq > self.consumed_through]

    @property
    def pending_interrupt(self) -> Event | None:
        if self.interrupt is not None and self.interrupt.seq > self.idle_through:
            return self.interrupt
        return None

    @property
    def unanswered(self) -> list[ToolCall]:
        return [self.calls[i] for i in self.last_response_calls if self.calls[i].result is None]

    def waits_since(self, call: ToolCall) -> int:
        """The seq after which an idle listing the call means it waits for the client (or the worker): since
        its use, its confirmation, or the loss of a worker that may have been running it."""
        runnable = call.runnable_seq
        if runnable is None or call.custom:
            return call.use.seq
        return max(runnable, self.worker_gone_seq)

    def listed(self, call: ToolCall) -> bool:
        """Whether the session's last idle waits on the call: it lists it, and came after `waits_since`."""
        idle = self.last_idle
        return (
            idle is not None
            and idle.seq > self.waits_since(call)
            and call.id in (idle.payload.get("stop_reason", {}).get("event_ids") or [])
        )

    def worker_may_have_run(self, call: ToolCall) -> bool:
        """A worker that could run the call has gone without answering it, and it was not listed since (for
        the next worker)."""
        runnable = call.runnable_seq
        return runnable is not None and self.worker_gone_seq > runnable and not self.listed(call)

    def written_at(self, epoch: int) -> bool:
        """Whether the brain of `epoch` has written yet (epochs only grow, so its events come last)."""
        return bool(self.writers) and self.writers[-1][1] == epoch

    def earlier_brain_may_have_run(self, call: ToolCall, epoch: int) -> bool:
        """True when a brain other than `epoch` was responsible for the call once it could run."""
        since = call.confirmation.seq if call.confirmation is not None else call.use.seq
        if call.confirmation is None and call.use.lease_epoch not in (None, epoch):
            return True
        return any(seq > since and writer not in (epoch,) for seq, writer in self.writers)


def fold(events: Iterable[Event], state: SessionState | None = None) -> SessionState:
    """Apply `events` (in seq order) to `state`; folding more events later continues where it stopped."""
    state = state or SessionState()
    for event in events:
        state.last_seq = event.seq
        payload: dict[str, Any] = event.payload
        kind = event.type
        if event.lease_epoch is not None:
            state.writers.append((event.seq, event.lease_epoch))
        if kind in STATUS_TYPES:
            state.status = STATUS_TYPES[kind]
            if kind == "session.status_idle":
                state.last_idle = event
                through = payload.get("through_seq", event.seq)
                state.idle_through = max(state.idle_through, through)
                state.consumed_through = max(state.consumed_through, through)
        elif kind in INPUT_TYPES:
            state.inputs.append(event)
        elif kind == "user.interrupt":
            state.interrupt = event
        elif kind == "span.model_request_start":
            state.open_request = event
            state.response_calls = []
            state.consumed_before_request = state.consumed_through
            state.consumed_through = max(state.consumed_through, payload.get("through_seq", event.seq))
        elif kind == "span.model_request_end":
            state.open_request = None
            if payload.get("is_error"):
                state.consumed_through = max(state.consumed_before_request, state.idle_through)
            else:
                state.last_response_end = event
                state.last_response_calls = state.response_calls
            for key, value in (payload.get("model_usage") or {}).items():
                if isinstance(value, int):
                    state.usage[key] = state.usage.get(key, 0) + value
        elif kind in ("agent.tool_use", "agent.custom_tool_use", "agent.mcp_tool_use"):
            state.calls[event.uid] = ToolCall(event)
            state.response_calls.append(event.uid)
        elif kind in RESULT_TYPES:
            call = state.calls.get(payload.get(RESULT_TYPES[kind], ""))
            if call is not None and call.result is None:
                call.result = event
        elif kind == "user.tool_confirmation":
            call = state.calls.get(payload.get("tool_use_id", ""))
            if call is not None:
                call.confirmation = event
        elif kind == "brain.recovered" and payload.get("action") == RELISTED:
            use_id = payload.get("tool_use_id", "")
            state.relisted[use_id] = state.relisted.get(use_id, 0) + 1
        elif kind == "brain.harness_switched":
            state.harness = payload.get("harness")
        elif kind.startswith("sandbox."):
            state.hands_seen = True
            if kind in WORKER_GONE_TYPES and "work_id" in payload:
                state.worker_gone_seq = event.seq
    return state
