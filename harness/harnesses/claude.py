"""The default harness: Claude's tool-use loop with every tool the agent has."""

from __future__ import annotations

from harness.harnesses.base import ToolUseHarness
from harness.tools import Tool, agent_tools


class ClaudeHarness(ToolUseHarness):
    name = "claude"
    uses_mcp = True

    def tools(self) -> dict[str, Tool]:
        return agent_tools(self.agent)
