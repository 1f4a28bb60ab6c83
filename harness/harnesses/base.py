"""What every harness shares: the Protocol, and the decision rules of a tool-use loop over the log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harness.context import needs_compaction
from harness.fold import SessionState, ToolCall
from harness.harnesses.steps import (
    AwaitAction,
    CallModel,
    CloseCall,
    CloseOrphanRequest,
    Compact,
    EndTurn,
    Park,
    RecordRecovery,
    Recover,
    RunTool,
)
from harness.mcp import recorded_tool
from harness.tools import SAFE_TO_REPEAT, Tool, on_worker

if TYPE_CHECKING:
    from harness.brain import Brain

# How many self-hosted workers in a row may leave a call unanswered (one its runner keeps failing on) before
# the call is closed, and the session told, rather than handed to yet another worker.
WORKERS_PER_CALL = 3


class Step(Protocol):
    def run(self, brain: Brain) -> None: ...


class Harness(Protocol):
    """Given the session's state and access to its log, the next step, or None when idle."""

    name: str

    def next_step(self, state: SessionState, brain: Brain) -> Step | None: ...


class ToolUseHarness:
    """The loop: answer inputs with a model call, run the calls it makes, repeat until it ends its turn."""

    name = "base"
    uses_mcp = False  # whether the model is offered the agent's MCP tools

    def __init__(self, agent: dict[str, Any]):
        self.agent = agent

    def tools(self) -> dict[str, Tool]:
        raise NotImplementedError

    def system(self) -> str | None:
        return self.agent.get("system")

    def tool_of(self, call: ToolCall, tools: dict[str, Tool]) -> Tool | None:
        """The tool a logged call names; an MCP call's comes from the agent's toolsets (no listing needed)."""
        if call.use.type == "agent.mcp_tool_use":
            return recorded_tool(self.agent, call.use) if self.uses_mcp else None
        return tools.get(call.use.payload["name"])

    def extra_calls(self, calls: list[ToolCall]) -> list[ToolCall]:
        """Calls of one response this harness will not run (none, unless it limits actions per turn)."""
        return []

    def offered(self, brain: Brain) -> dict[str, Tool]:
        """The harness's tools as this session has them: in a self-hosted environment the toolset's are the
        worker's (`on_worker`)."""
        tools = self.tools()
        return on_worker(tools) if brain.self_hosted else tools

    def next_step(self, state: SessionState, brain: Brain) -> Step | None:
        if brain.lease.attempts > 1 and not state.written_at(brain.epoch):
            return RecordRecovery()
        tools = self.offered(brain)
        if state.open_request is not None and state.open_request.lease_epoch != brain.epoch:
            return CloseOrphanRequest(state.open_request)
        interrupt = state.pending_interrupt
        if interrupt is not None:
            return EndTurn(close=[c for c in state.unanswered if not c.custom])
        unanswered = state.unanswered
        refused = {c.id for c in self.extra_calls(unanswered)}
        waiting: list[str] = []
        relisted: list[ToolCall] = []
        on_worker_calls = False
        for call in unanswered:
            if call.custom:
                waiting.append(call.id)
                continue
            tool = self.tool_of(call, tools)
            if call.id in refused:
                return CloseCall(call, f"{self.name} runs one action per turn; this call was not run.")
            worker = tool is not None and tool.kind == "worker"
            if worker and call.use.payload.get("evaluated_permission") == "deny":
                return RunTool(call, tool)  # refused when recorded (its input): answered here, never run
            if tool is not None and tool.permission == "ask" and call.confirmation is None:
                waiting.append(call.id)
                continue
            if call.confirmation is not None and call.confirmation.payload.get("result") == "deny":
                message = call.confirmation.payload.get("deny_message") or "The user denied this tool call."
                return CloseCall(call, message)
            if worker:
                # The worker runs it; one that held the hands and left may have, so the recovery rule applies.
                if state.worker_may_have_run(call):
                    if call.use.payload["name"] not in SAFE_TO_REPEAT:
                        return Recover(call, tool)
                    if state.relisted.get(call.id, 0) >= WORKERS_PER_CALL:
                        return Recover(call, tool, workers=WORKERS_PER_CALL + 1)
                    relisted.append(call)
                waiting.append(call.id)
                on_worker_calls = True
                continue
            if state.earlier_brain_may_have_run(call, brain.epoch):
                return Recover(call, tool)
            return RunTool(call, tool)
        if waiting:
            last = state.last_idle
            already = (
                last is not None
                and last.payload.get("stop_reason", {}).get("event_ids") == waiting
                and all(state.listed(state.calls[i]) for i in waiting)
            )
            return None if already else AwaitAction(waiting, on_worker=on_worker_calls, relisted=relisted)
        if state.pending_inputs or (state.last_response_calls and not _idle_after_response(state)):
            through = needs_compaction(self.agent.get("context") or {"type": "full"}, brain.events)
            if through is not None:
                return Compact(self.agent, through)
            return CallModel(self.agent, tools, self.system(), mcp=self.uses_mcp)
        if state.last_response_end is not None and not _idle_after_response(state):
            return EndTurn(reason=_stop_reason(state))
        return None


class ParkingHarness:
    """A wake's harness after WAKE_CRASH_LIMIT wakes in a row died: one step parks the session, then none. It
    reads neither the agent nor the environment, since either may be what kills the wakes."""

    name = "parking"

    def next_step(self, state: SessionState, brain: Brain) -> Step | None:
        return None if state.written_at(brain.epoch) else Park()


def pending(state: SessionState) -> bool:
    """Whether the log shows work a brain should pick up (what the sweeper and a releasing brain ask). A call
    the last idle lists waits for the client or the worker, not a brain."""
    runnable = [
        c for c in state.unanswered if not c.custom and c.runnable_seq is not None and not state.listed(c)
    ]
    return bool(
        state.pending_inputs
        or state.pending_interrupt
        or state.open_request
        or runnable
        or (
            state.last_response_end is not None
            and not _idle_after_response(state)
            and not _waits_on_its_listed_calls(state)
        )
    )


def _waits_on_its_listed_calls(state: SessionState) -> bool:
    """Whether the session is idle waiting for others (the client, the user's confirmation, a worker) to
    answer calls its last idle lists: no brain has anything to do until one of them does. (Without this, a
    releasing brain read such a session as pending and went round until its rounds ran out, and an answer
    arriving meanwhile found the lease busy and was left for the sweeper.)"""
    idle = state.last_idle
    unanswered = state.unanswered
    return (
        idle is not None
        and idle.payload.get("stop_reason", {}).get("type") == "requires_action"
        and bool(unanswered)
        and all(state.listed(call) for call in unanswered)
    )


def waits_for_worker(state: SessionState) -> bool:
    """Whether the session waits on calls a worker is to run: listed by its last idle, with no result. In a
    self-hosted session those are its toolset calls (an `agent.tool_use` not refused when recorded)."""
    return any(
        c.use.type == "agent.tool_use"
        and c.use.payload.get("evaluated_permission") != "deny"
        and c.runnable_seq is not None
        and state.listed(c)
        for c in state.unanswered
    )


def _idle_after_response(state: SessionState) -> bool:
    """Whether the turn that response belongs to has ended (an idle that waits for the client has not)."""
    idle = state.last_idle
    return (
        idle is not None
        and state.last_response_end is not None
        and idle.seq > state.last_response_end.seq
        and (idle.payload.get("stop_reason", {}).get("type") != "requires_action")
    )


def _stop_reason(state: SessionState) -> str:
    reason = state.last_response_end.payload.get("stop_reason") if state.last_response_end else None
    return "refusal" if reason == "refusal" else "end_turn"
