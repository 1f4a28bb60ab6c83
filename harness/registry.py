"""The harnesses a session can run, by name."""

from __future__ import annotations

from typing import Any

from kernel.errors import Invalid

# name -> one-line description; the harness classes register themselves in harness.harnesses.
HARNESS_DESCRIPTIONS: dict[str, str] = {
    "claude": "The Claude tool-use loop: every tool the agent has, as many turns as the model wants.",
    "bash-only": "A minimal loop in the spirit of mini-swe-agent: one bash tool, one action per turn.",
}


def validate_harness_name(value: Any) -> str:
    if not isinstance(value, str) or value not in HARNESS_DESCRIPTIONS:
        raise Invalid(f"'harness' must be one of {', '.join(sorted(HARNESS_DESCRIPTIONS))}, not {value!r}.")
    return value
