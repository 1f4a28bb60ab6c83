"""The sandbox's shell itself (sandboxes/toolbox/shell.py), run in this process with no sandbox around it.

What a sandbox adds (its own filesystem, user and limits) is tested through the providers in
toolset_behaviour.py; this file is for races inside the shell, which need many rounds to show.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.toolbox import shell as shell_module
from sandboxes.toolbox.shell import Outcome, Shell

_call_ids = itertools.count()


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    monkeypatch.setattr(shell_module, "CALLS_DIR", str(tmp_path / "calls"))
    shell = Shell(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
    yield shell
    if shell._bash:
        shell._bash.stop()


def run(shell: Shell, tmp_path: Path, command: str, *, timeout_s: float = 10.0) -> tuple[Outcome, str]:
    out = tmp_path / "out"
    outcome = shell.run(
        f"call{next(_call_ids)}", command, out_path=str(out), timeout_s=timeout_s, cancel=threading.Event()
    )
    return outcome, out.read_text()


def test_a_loop_of_short_jobs_stopped_again_and_again_keeps_its_shell(shell: Shell, tmp_path: Path) -> None:
    """A Ctrl-C can reach bash as it starts a job, and bash returns to its prompt while the job holds
    the terminal. When bash read its commands from that terminal, it then exited with status 130 in
    about 2 of 100 rounds here, and the next call reported a new shell."""
    run(shell, tmp_path, "cd / && export KEPT=yes")
    for round in range(150):
        outcome, _ = run(shell, tmp_path, "while true; do sleep 0.001; done", timeout_s=0.05)
        assert outcome.stopped == "timeout", (round, outcome)
        assert outcome.exit_code is not None and not outcome.notes, (round, outcome)
    outcome, text = run(shell, tmp_path, "pwd; echo $KEPT")
    assert (text, outcome.notes) == ("/\nyes\n", [])


def test_commands_do_not_read_the_shells_command_pipe(shell: Shell, tmp_path: Path) -> None:
    """A command reading its stdin gets end of input: the next calls' command lines are not its to read."""
    outcome, text = run(shell, tmp_path, "cat; echo read-$?")
    assert (text, outcome.exit_code) == ("read-0\n", 0)
    assert run(shell, tmp_path, "echo still-here")[1] == "still-here\n"
