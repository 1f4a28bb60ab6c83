"""The registry of harnesses: an agent names one; a live session may switch between turns."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from harness.harnesses.base import Harness, ParkingHarness, ToolUseHarness, pending
from harness.harnesses.bash_only import BashOnlyHarness
from harness.harnesses.claude import ClaudeHarness
from harness.registry import HARNESS_DESCRIPTIONS

if TYPE_CHECKING:
    from harness.brain import Brain

HARNESSES: dict[str, type[ToolUseHarness]] = {cls.name: cls for cls in (ClaudeHarness, BashOnlyHarness)}
assert set(HARNESSES) == set(HARNESS_DESCRIPTIONS), "every harness needs a description in harness.registry"


def harness_for(brain: Brain) -> Harness:
    """The session's harness: the last `brain.harness_switched` in its log, else the agent's own (the agent
    comes with the lease). After too many wakes in a row died on the same step, the one that parks the session."""
    if brain.lease.step_attempts > settings.WAKE_CRASH_LIMIT:
        return ParkingHarness()
    agent = brain.lease.agent
    name = brain.state.harness or agent.get("harness") or "claude"
    return HARNESSES[name](agent)


__all__ = ["HARNESSES", "Harness", "harness_for", "pending"]
