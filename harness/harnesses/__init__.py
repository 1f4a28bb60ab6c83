"""The registry of harnesses: an agent names one; a live session may switch between turns."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.harnesses.base import Harness, ToolUseHarness, pending
from harness.harnesses.bash_only import BashOnlyHarness
from harness.harnesses.claude import ClaudeHarness
from harness.registry import HARNESS_DESCRIPTIONS
from sandboxes.provisioning import provisioning_mode

if TYPE_CHECKING:
    from harness.brain import Brain

HARNESSES: dict[str, type[ToolUseHarness]] = {cls.name: cls for cls in (ClaudeHarness, BashOnlyHarness)}
assert set(HARNESSES) == set(HARNESS_DESCRIPTIONS), "every harness needs a description in harness.registry"


def harness_for(brain: Brain) -> Harness:
    """The session's harness: the last `brain.harness_switched` in its log, else the agent's own.

    The agent and the environment (its provisioning mode, for the brain's eager hand) come with the lease.
    """
    agent = brain.lease.agent
    brain.provisioning = provisioning_mode(brain.lease.environment)
    name = brain.state.harness or agent.get("harness") or "claude"
    return HARNESSES[name](agent)


__all__ = ["HARNESSES", "Harness", "harness_for", "pending"]
