"""Reading what `python -m workbench.supervise` says (its lines are `HH:MM:SS name | text`), for the tests of the
supervisor and of `make run`."""

from __future__ import annotations

import re

from workbench.supervise import group_members


def started(output: str, name: str) -> list[int]:
    """Every pid the supervisor started `name` with, in order."""
    return [int(pid) for pid in re.findall(rf"\| {re.escape(name)} started \(pid (\d+)\)", output)]


def every_group_started(output: str) -> list[int]:
    """The process groups of every process it started (each leads its own)."""
    return [int(pid) for pid in re.findall(r"\| \S+ started \(pid (\d+)\)", output)]


def left_running(output: str) -> dict[int, list[int]]:
    """The groups it started that still have a live process, with those processes."""
    return {group: members for group in every_group_started(output) if (members := group_members(group))}
