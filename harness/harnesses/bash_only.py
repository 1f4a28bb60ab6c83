"""A minimal harness in the spirit of mini-swe-agent: one bash tool, one action per model turn.

The model sees only `bash` (whatever else the agent has), gets a short system prompt that says so, and
when it asks for several commands at once only the first runs; the others come back as errors, so the
next turn sees the first one's output before it acts again.
"""

from __future__ import annotations

from harness.fold import ToolCall
from harness.harnesses.base import ToolUseHarness
from harness.tools import TOOLSET_SCHEMAS, Tool

SYSTEM = (
    "You work in a Linux sandbox through one tool, bash. Run exactly one command per turn, read its output, "
    "then decide the next. When the task is done, answer without calling a tool."
)


class BashOnlyHarness(ToolUseHarness):
    name = "bash-only"

    def tools(self) -> dict[str, Tool]:
        return {"bash": Tool("bash", "toolset", {"name": "bash", **TOOLSET_SCHEMAS["bash"]}, "allow")}

    def system(self) -> str | None:
        own = self.agent.get("system")
        return f"{SYSTEM}\n\n{own}" if own else SYSTEM

    def extra_calls(self, calls: list[ToolCall]) -> list[ToolCall]:
        return calls[1:]
