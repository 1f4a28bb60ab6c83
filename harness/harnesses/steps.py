"""The steps a harness can ask a brain to take. Each writes its outcome to the log before it returns."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings

from harness.context import context_events, messages_from_events
from harness.fold import RELISTED, ToolCall, result_key
from harness.mcp import Interrupted, McpFailure, call_tool, mcp_tool_result, mcp_tool_use, model_tools
from harness.model import Cancelled, ModelError, stream_response
from harness.tools import SAFE_TO_REPEAT, McpTarget, Tool, input_problem
from kernel.errors import DomainError
from kernel.ids import new_id
from sandboxes.hands import execute, held, sandbox_provision, sandbox_terminate, sandbox_transfer
from sandboxes.providers import SandboxError
from sandboxes.work import work_ensure
from sessions import events
from sessions.broadcast import publish_preview

if TYPE_CHECKING:
    from harness.brain import Brain


def _running(brain: Brain) -> None:
    if brain.state.status != "running":
        brain.emit(events.status_running())


def _ensure_hand(brain: Brain) -> None:
    """Coupled ("eager") mode: the session's sandbox, with its repositories, exists before a model call. A
    self-hosted session has none: its worker's machine is its hands."""
    if brain.provisioning == "eager" and not brain.self_hosted and not held(brain.session_id):
        _running(brain)
        # A failure is recorded as sandbox.failed; the turn goes on and a tool call will say so.
        with contextlib.suppress(SandboxError):
            sandbox_provision(brain.session_id, emit=brain.emit, by_brain=True)


@dataclass
class CallModel:
    """One model request built from the log by the agent's context strategy, retried when it may be."""

    agent: dict[str, Any]
    tools: dict[str, Tool]
    system: str | None
    mcp: bool = False  # offer the agent's MCP tools too (listed now, or from the session's recent listing)

    def run(self, brain: Brain) -> None:
        _ensure_hand(brain)
        for attempt in range(settings.MODEL_RETRIES + 1):
            try:
                return self._attempt(brain)
            except ModelError as error:
                last = attempt == settings.MODEL_RETRIES or not error.retryable
                retry: events.Retry = ("exhausted" if error.retryable else "terminal") if last else "retrying"
                brain.emit(events.session_error(error.kind, error.message, retry=retry))
                if last:
                    reason = "retries_exhausted" if error.retryable else "end_turn"
                    brain.emit(events.status_idle(reason, through_seq=brain.state.last_seq))
                    return None
                delay = min(settings.MODEL_RETRY_BASE_SECONDS * 2**attempt, 30.0)
                if brain.interrupted.wait(delay):
                    raise Cancelled() from None
        return None

    def _attempt(self, brain: Brain) -> None:
        shown, prefix = context_events(self.agent.get("context") or {"type": "full"}, brain.events)
        request: dict[str, Any] = {
            "model": self.agent["model"]["id"],
            "max_tokens": settings.MODEL_MAX_TOKENS,
            "messages": messages_from_events(shown, prefix=prefix),
        }
        tools = self.tools
        if self.mcp and self.agent.get("mcp_servers"):
            _running(brain)  # a server that cannot be listed is a session.error of this turn
            tools = {
                **tools,
                **model_tools(brain.session_id, self.agent, on_failure=lambda f: brain.emit(f.event())),
            }
        system = self.system
        if any(tool.kind == "hands" for tool in tools.values()):
            note = hands_note(brain.session_id, logged=brain.state.hands_seen)
            system = f"{system}\n\n{note}" if system else note
        if system:
            request["system"] = system
        if tools:
            request["tools"] = [tool.definition for tool in tools.values()]
        opening: list[tuple[dict[str, Any], str | None]] = []
        if brain.state.status != "running":
            opening.append((events.status_running(), None))
        opening.append((events.model_request_start(through_seq=brain.state.last_seq), None))
        start: Any = None

        def open_request() -> None:
            """While the request goes out: its start in the log, the hands started ahead, and the call made
            cancellable (an interrupt from now on stops it)."""
            nonlocal start
            start = brain.emit_many(opening)[-1]
            brain.provision_ahead(toolset=any(tool.kind == "toolset" for tool in tools.values()))
            brain.begin_cancellable()

        message_id = new_id("sevt")
        started: set[int] = set()

        def on_text(index: int, fragment: str) -> None:
            if not started:
                publish_preview(
                    brain.session_id,
                    start.seq,
                    {"type": "event_start", "event": {"type": "agent.message", "id": message_id}},
                    event_type="agent.message",
                )
            started.add(index)
            publish_preview(
                brain.session_id,
                start.seq,
                {
                    "type": "event_delta",
                    "event_id": message_id,
                    "delta": {
                        "type": "content_delta",
                        "index": len(started) - 1,
                        "content": {"type": "text", "text": fragment},
                    },
                },
                event_type="agent.message",
            )

        try:
            response = stream_response(
                request,
                on_text=on_text,
                cancelled=brain.interrupted,
                register_cancel=brain.set_cancel_hook,
                on_answered=brain.model_answered,
                meanwhile=open_request,
            )
        except (ModelError, Cancelled) as failure:
            brain.emit(
                events.model_request_end(start.uid, error=getattr(failure, "message", "interrupted")),
                key=f"{start.uid}:end",
            )
            raise
        self._record(brain, start, message_id, response, tools)

    def _record(
        self, brain: Brain, start: Any, message_id: str, response: Any, tools: dict[str, Tool]
    ) -> None:
        """The whole response in one transaction, before any tool runs."""
        items: list[tuple[dict[str, Any], str | None]] = []
        texts = [b for b in response.blocks if b["type"] == "text"]
        for i, block in enumerate(b for b in response.blocks if b["type"] == "thinking"):
            items.append(
                (
                    {
                        "type": "agent.thinking",
                        "thinking": block["thinking"],
                        "signature": block["signature"],
                    },
                    f"{start.uid}:thinking:{i}",
                )
            )
        if texts:
            items.append(
                ({"type": "agent.message", "id": message_id, "content": texts}, f"{start.uid}:message")
            )
        for i, block in enumerate(b for b in response.blocks if b["type"] == "tool_use"):
            tool = tools.get(block["name"])
            if tool is not None and tool.mcp is not None:
                items.append(
                    (mcp_tool_use(tool.mcp, block["input"], tool.permission), f"{start.uid}:tool:{i}")
                )
            elif tool is not None and tool.kind == "custom":
                items.append(
                    (
                        {"type": "agent.custom_tool_use", "name": block["name"], "input": block["input"]},
                        f"{start.uid}:tool:{i}",
                    )
                )
            else:
                items.append((_tool_use(brain, block, tool), f"{start.uid}:tool:{i}"))
        items.append(
            (
                events.model_request_end(start.uid, stop_reason=response.stop_reason, usage=response.usage),
                f"{start.uid}:end",
            )
        )
        brain.emit_many(items)


def _tool_use(brain: Brain, block: dict[str, Any], tool: Tool | None) -> dict[str, Any]:
    """The `agent.tool_use` of a toolset (or unknown) call, with the permission its policy gives it.

    In a self-hosted session the worker runs every call the log shows as allowed (or confirmed), so one the
    platform answers itself (a tool the agent has not, an input the tool's schema refuses) is recorded as
    refused before any policy applied: `evaluated_permission` deny without an `evaluation`, which the SDK's
    runner never runs."""
    use = {"type": "agent.tool_use", "name": block["name"], "input": block["input"]}
    if brain.self_hosted and (
        tool is None or input_problem(tool.definition["input_schema"], block["input"]) is not None
    ):
        return {**use, "evaluated_permission": "deny"}
    permission = tool.permission if tool else "allow"
    return {
        **use,
        "evaluated_permission": permission,
        "evaluation": {"type": "always_ask" if permission == "ask" else "always_allow"},
    }


@dataclass
class RunTool:
    call: ToolCall
    tool: Tool | None
    recovering: bool = False

    def run(self, brain: Brain) -> None:
        _running(brain)
        name, value = self.call.use.payload["name"], dict(self.call.use.payload.get("input") or {})
        if self.tool is None:
            return _finish(brain, self.call, f"Unknown tool {name!r}: this agent has no such tool.", True)
        if self.tool.mcp is not None:
            return run_mcp_tool(brain, self.call, self.tool.mcp, value)
        # The host's one check: only here are hands tools and `sandbox` seen, and no sandbox is provisioned yet.
        problem = input_problem(self.tool.definition["input_schema"], value)
        if problem:
            return _finish(brain, self.call, f"Invalid input for {name}: {problem}.", True)
        brain.wait_for_hands()  # a sandbox provisioned ahead is taken once it is ready, never provisioned twice
        if self.tool.kind == "hands":
            text, is_error = run_hand_tool(brain, name, value)
            return _finish(brain, self.call, text, is_error)
        if self.tool.kind == "worker":
            # The harness waits for the worker's result (a refused input was answered above); never run here.
            return _finish(brain, self.call, f"{name} runs on the environment's worker, not here.", True)
        brain.begin_cancellable()
        text, is_error = execute(brain.session_id, name, value, emit=brain.emit, cancelled=brain.cancelled)
        if brain.interrupted.is_set():
            text, is_error = f"Interrupted by the user. {text}".strip(), True
        if self.recovering:
            text = f"[re-run after the previous worker stopped during this call]\n{text}"
        return _finish(brain, self.call, text, is_error)


def run_mcp_tool(brain: Brain, call: ToolCall, target: McpTarget, value: dict[str, Any]) -> None:
    """Call an MCP tool; a server that cannot be reached is a session.error, and the model is told the call
    failed (the turn goes on)."""
    brain.begin_cancellable()
    try:
        content, is_error = call_tool(brain.session_id, target, value, cancelled=brain.cancelled)
    except Interrupted:
        content = events.text_content(
            "Interrupted by the user. The call's effect on the server is unverified."
        )
        is_error = True
    except McpFailure as failure:
        brain.emit(failure.event())
        content, is_error = events.text_content(f"The MCP tool call failed: {failure.message}"), True
    brain.emit(mcp_tool_result(call.id, content, is_error=is_error), key=result_key(call.id))


def run_hand_tool(brain: Brain, name: str, value: dict[str, Any]) -> tuple[str, bool]:
    """The model's own hands tools: provision, release and pass sandboxes."""
    hands = {hand.name: hand for hand in held(brain.session_id)}
    try:
        if name == "provision_sandbox":
            sandbox = sandbox_provision(brain.session_id, name=value["name"], emit=brain.emit, by_brain=True)
            return f"Provisioned sandbox {sandbox.name!r} ({sandbox.id}).", False
        hand = hands.get(value["name"])
        if hand is None:
            return (
                f"You hold no sandbox named {value['name']!r}; you hold: {', '.join(hands) or 'none'}.",
                True,
            )
        if name == "release_sandbox":
            sandbox_terminate(hand.id, emit=brain.emit)
            return f"Released sandbox {hand.name!r}.", False
        sandbox = sandbox_transfer(
            hand.id, value["to_session"], emit=brain.emit, actor=f"the agent of session {brain.session_id}"
        )
        return (
            f"Passed sandbox {hand.name!r} to session {value['to_session']} (named {sandbox.name!r} there).",
            False,
        )
    except (DomainError, SandboxError) as error:
        return str(getattr(error, "message", error)), True


def hands_note(session_id: str, *, logged: bool = True) -> str:
    """What the model is told of its sandboxes. `logged`: the session's log has a sandbox event (without
    one the session holds none, and the first model call of a session skips the query)."""
    hands = held(session_id) if logged else []
    if not hands:
        return "You hold no sandbox yet; your first tool call provisions one named 'main'."
    names = ", ".join(f"{hand.name!r}" for hand in hands)
    return (
        f"Sandboxes you hold: {names}. Toolset calls run in {hands[0].name!r} unless you pass sandbox=<name>."
    )


def _finish(brain: Brain, call: ToolCall, text: str, is_error: bool) -> None:
    if call.use.type == "agent.mcp_tool_use":
        event = mcp_tool_result(call.id, events.text_content(text), is_error=is_error)
    else:
        event = events.tool_result(call.id, text, is_error=is_error)
    brain.emit(event, key=result_key(call.id))


def _close_request(brain: Brain, start: Any) -> None:
    """End a model request a dead brain started and never finished, as failed."""
    brain.emit(
        events.model_request_end(start.uid, error="the worker stopped during this request"),
        key=f"{start.uid}:end",
    )


@dataclass
class CloseCall:
    """Answer a call without running it: denied, unverified after a crash, or cut by an interrupt."""

    call: ToolCall
    text: str

    def run(self, brain: Brain) -> None:
        _finish(brain, self.call, self.text, True)


@dataclass
class CloseOrphanRequest:
    """A model request a dead brain started and never finished: close it, then ask again."""

    start: Any

    def run(self, brain: Brain) -> None:
        _close_request(brain, self.start)
        brain.emit(
            events.brain_recovered(closed_model_request=self.start.uid, previous_epoch=self.start.lease_epoch)
        )


@dataclass
class AwaitAction:
    """Idle until the client answers the calls (or confirms them), or the worker runs them.

    `on_worker`: some are a self-hosted worker's to run, so the session's work item is made sure of first (a
    worker is asked for only when a call needs one; one whose runner exited left no live item). `relisted`:
    calls a worker that left may have run, safe to run again, which wait for the next worker."""

    event_ids: list[str]
    on_worker: bool = False
    relisted: list[ToolCall] = field(default_factory=list)

    def run(self, brain: Brain) -> None:
        if self.on_worker:
            work_ensure(brain.session_id)
        notes: list[tuple[dict[str, Any], str | None]] = [
            (
                events.brain_recovered(tool_use_id=call.id, tool=call.use.payload["name"], action=RELISTED),
                None,
            )
            for call in self.relisted
        ]
        idle = events.status_idle(
            "requires_action", event_ids=self.event_ids, through_seq=brain.state.last_seq
        )
        brain.emit_many([*notes, (idle, None)])


@dataclass
class EndTurn:
    reason: str = "end_turn"
    close: list[ToolCall] = field(default_factory=list)

    def run(self, brain: Brain) -> None:
        for call in self.close:
            _finish(brain, call, _interrupted(brain, call), True)
        brain.emit(events.session_usage(brain.state.usage))
        brain.emit(events.status_idle(self.reason, through_seq=brain.state.last_seq))


def _interrupted(brain: Brain, call: ToolCall) -> str:
    """What the model is told of a call an interrupt cut. A self-hosted worker may have begun one it could
    run; seeing this result, the SDK's runner stops it."""
    if brain.self_hosted and call.use.type == "agent.tool_use" and call.runnable_seq is not None:
        return "Interrupted by the user. The worker may have begun this call, and stops it; its effect is unverified."
    return "Interrupted by the user before this call ran."


@dataclass
class Recover:
    """A call a dead brain (or a gone worker) may have started: re-run it if that is safe, else say its effect
    is unverified. `workers`: that many self-hosted workers in a row left it unanswered; it is given up, and
    the session told."""

    call: ToolCall
    tool: Tool | None
    workers: int = 0

    def run(self, brain: Brain) -> None:
        name = self.call.use.payload["name"]
        if self.workers:
            message = (
                f"{self.workers} workers in a row took this session's {name} call and left without answering it; "
                "it is closed as failed (see the workers' logs)."
            )
            brain.emit(events.session_error("unknown_error", message, retry="exhausted"))
            brain.emit(events.brain_recovered(tool_use_id=self.call.id, tool=name, action="closed"))
            return CloseCall(self.call, f"{message} Its effect is unverified.").run(brain)
        # An MCP tool is never re-run: its server's effects are not the toolbox's, whatever its name.
        repeat = name in SAFE_TO_REPEAT and self.call.use.type == "agent.tool_use"
        brain.emit(
            events.brain_recovered(
                tool_use_id=self.call.id, tool=name, action="re-run" if repeat else "closed"
            )
        )
        if repeat and self.tool is not None:
            return RunTool(self.call, self.tool, recovering=True).run(brain)
        return CloseCall(
            self.call,
            (
                f"The worker running this {name} call stopped before it finished. Its effect is unverified: it may "
                "or may not have happened. Check the state before repeating it."
            ),
        ).run(brain)


def crash_backoff(attempts: int) -> float:
    """How long the `attempts`-th wake in a row on one step waits before it tries the step again: nothing for
    the first retry, then WAKE_CRASH_BACKOFF_SECONDS, doubling."""
    if attempts < 3:
        return 0.0
    return float(settings.WAKE_CRASH_BACKOFF_SECONDS * 2 ** (attempts - 3))


@dataclass
class RecordRecovery:
    """The first step of a wake that follows wakes which died: wait out the backoff if the same step killed
    more than one (an interrupt or a lost lease cuts it short), then say so, and what woke this one."""

    def run(self, brain: Brain) -> None:
        pause = crash_backoff(brain.lease.step_attempts)
        if pause:
            woken = threading.Event()
            brain.begin_cancellable(woken.set)
            woken.wait(pause)  # an interrupt or the lease's loss sets it; a lost lease then refuses the emit
            brain.set_cancel_hook(None)
        brain.emit(
            events.brain_recovered(
                woken_by=brain.woken_by, epoch=brain.epoch, unfinished_wakes=brain.lease.attempts - 1
            )
        )


@dataclass
class Park:
    """Too many wakes in a row died: close what the log holds open, tell the user, and leave the session idle
    (a new message tries again)."""

    def run(self, brain: Brain) -> None:
        if brain.state.open_request is not None:
            _close_request(brain, brain.state.open_request)
        for call in brain.state.unanswered:
            if not call.custom:
                _finish(
                    brain,
                    call,
                    "The session was parked after repeated worker crashes; this call's effect is unverified.",
                    True,
                )
        for event in parked_notice(unfinished_wakes=brain.lease.attempts - 1):
            brain.emit(event)
        brain.emit(events.status_idle("retries_exhausted", through_seq=brain.state.last_seq))


def parked_notice(*, unfinished_wakes: int) -> list[dict[str, Any]]:
    """What a parked session's log says before its idle: the user's error, and the parking."""
    limit = settings.WAKE_CRASH_LIMIT
    message = (
        f"The brain working this session stopped unexpectedly {limit} times in a row at the same step; the "
        "session is parked. "
        "Send a new message to try again."
    )
    return [
        events.session_error("unknown_error", message, retry="terminal"),
        events.brain_parked(attempts=unfinished_wakes),
    ]


@dataclass
class Compact:
    """Summarise the log through `through_seq` with the model into a context prefix; the events stay."""

    agent: dict[str, Any]
    through_seq: int

    def run(self, brain: Brain) -> None:
        _running(brain)
        older = [e for e in brain.events if e.seq <= self.through_seq]
        messages = messages_from_events(older) + [
            {
                "role": "user",
                "content": events.text_content(
                    "Summarise the conversation so far for your own later use: the task, what was done, what was "
                    "found, and what is left. Be complete but brief."
                ),
            }
        ]
        request = {
            "model": self.agent["model"]["id"],
            "max_tokens": settings.MODEL_MAX_TOKENS,
            "messages": _alternating(messages),
        }
        brain.begin_cancellable()
        response = stream_response(
            request,
            on_text=lambda i, t: None,
            cancelled=brain.interrupted,
            register_cancel=brain.set_cancel_hook,
        )
        summary = "\n".join(b["text"] for b in response.blocks if b["type"] == "text")
        brain.emit(
            {
                "type": "agent.thread_context_compacted",
                "summary": summary,
                "through_seq": self.through_seq,
                "model_usage": response.usage,
            },
            key=f"compact:{self.through_seq}",
        )


def _alternating(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1]["content"].extend(message["content"])
        else:
            merged.append({"role": message["role"], "content": list(message["content"])})
    return merged
