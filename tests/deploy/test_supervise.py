"""The supervisor `make run` runs (workbench/supervise.py), over Procfiles of tiny shell commands: a process that
dies is restarted after a backoff that doubles up to a maximum and starts over once the process stayed up; one
that keeps dying stops everything (exit 1, naming it); what a dead process leaves in its group is killed; Ctrl-C
stops every group, with SIGKILL for what ignores SIGTERM; `--then` runs a command before the rest start."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.deploy.supervised import left_running, started
from tests.faults.conftest import children_of, process_state, wait_for


class Supervised:
    """`python -m workbench.supervise` over a Procfile, each line of its output kept with when it arrived."""

    def __init__(self, folder: Path, procfile: str, *args: str) -> None:
        path = folder / "Procfile"
        path.write_text(procfile)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "workbench.supervise", "-f", str(path), *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def when(self, pattern: str, count: int = 1, timeout: float = 10) -> list[tuple[float, re.Match[str]]]:
        """The first `count` lines matching `pattern`, with when each arrived (waiting for them)."""

        def found() -> list[tuple[float, re.Match[str]]] | None:
            hits = [(at, match) for at, line in list(self.lines) if (match := re.search(pattern, line))]
            return hits[:count] if len(hits) >= count else None

        return wait_for(
            found, timeout=timeout, what=f"{count} lines like {pattern!r}", on_timeout=self.output
        )

    def exit_code(self, timeout: float = 15) -> int:
        return self.process.wait(timeout)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the supervisor only: it leads no other group
        self.process.wait(10)
        for group in left_running(self.output()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


@pytest.fixture
def supervise(tmp_path):
    started_here: list[Supervised] = []

    def start(procfile: str, *args: str) -> Supervised:
        started_here.append(Supervised(tmp_path, procfile, *args))
        return started_here[-1]

    yield start
    for supervised in started_here:
        supervised.close()


def test_a_dying_process_is_restarted_after_a_doubling_backoff_and_a_crash_loop_stops_everything(supervise):
    run = supervise(
        "flaky: sh -c 'echo up; exit 3'\nsteady: sleep 60\n",
        *("--backoff", "0.2", "--max-backoff", "0.8", "--crash-limit", "4", "--crash-window", "60"),
    )
    deaths = run.when(r"flaky \(pid \d+\) exited with code 3 after [\d.]+ s(.*)", count=5)
    assert [match[1] for _, match in deaths] == [
        "; restarting it in 0.2 s",
        "; restarting it in 0.4 s",
        "; restarting it in 0.8 s",
        "; restarting it in 0.8 s",
        ": a crash loop (4 restarts within 60 s); stopping everything",
    ], run.output()
    starts = run.when(r"flaky started", count=5)
    for (died, _), (restarted, _), delay in zip(deaths[:4], starts[1:], (0.2, 0.4, 0.8, 0.8), strict=True):
        assert delay - 0.05 <= restarted - died < delay + 1.0, run.output()  # as read here, not as written
    assert run.exit_code() == 1
    output = run.output()
    assert re.search(r"steady \(pid \d+\) was killed by SIGTERM", output), output
    assert output.count("flaky     | up") == 5 and len(started(output, "flaky")) == 5
    assert not left_running(output)


def test_a_process_that_stayed_up_long_enough_is_restarted_after_the_first_backoff_again(supervise):
    run = supervise("slow: sh -c 'sleep 0.6; exit 1'\n", "--backoff", "0.2", "--stable", "0.5")
    deaths = run.when(
        r"slow \(pid \d+\) exited with code 1 after [\d.]+ s; restarting it in ([\d.]+) s", count=3
    )
    assert [match[1] for _, match in deaths] == ["0.2", "0.2", "0.2"], run.output()
    run.process.send_signal(signal.SIGINT)
    assert run.exit_code() == 0
    assert not left_running(run.output())


def test_what_a_dead_process_leaves_in_its_group_is_killed_before_it_is_restarted(supervise):
    """As a SIGKILLed Celery worker's pool processes would be, were they not to die with it."""
    run = supervise("tree: sh -c 'sleep 300 & sleep 300 & wait'\n", "--backoff", "0.2")
    [(_, match)] = run.when(r"tree started \(pid (\d+)\)")
    leader = int(match[1])
    orphans = wait_for(
        lambda: children_of(leader) if len(children_of(leader)) == 2 else None, timeout=5, what="2 sleeps"
    )
    os.kill(leader, signal.SIGKILL)
    run.when(
        rf"tree \(pid {leader}\) was killed by SIGKILL after [\d.]+ s; killed the 2 processes left in its group"
    )
    assert all(process_state(pid) in (None, "Z") for pid in orphans)
    [_, (_, restarted)] = run.when(r"tree started \(pid (\d+)\)", count=2)
    assert int(restarted[1]) != leader
    run.process.send_signal(signal.SIGINT)
    assert run.exit_code() == 0
    assert not left_running(run.output())


def test_ctrl_c_stops_every_group_and_kills_what_ignores_sigterm_after_the_grace_period(supervise):
    run = supervise(
        "polite: sleep 60\nstubborn: bash -c 'trap \"\" TERM; while true; do sleep 0.1; done'\n",
        "--grace",
        "1",
    )
    run.when(r"stubborn started")
    run.when(r"polite started")
    time.sleep(0.3)  # bash has set its trap
    asked = time.monotonic()
    run.process.send_signal(signal.SIGINT)
    assert run.exit_code() == 0
    stopped = time.monotonic() - asked
    output = run.output()
    assert "SIGINT: stopping every process (SIGTERM; SIGKILL after 1 s)" in output
    assert re.search(r"polite \(pid \d+\) was killed by SIGTERM", output), output
    assert re.search(r"killed \d+ process(es)? of group \d+ \(SIGKILL\)", output), output
    assert re.search(r"stubborn \(pid \d+\) was killed by SIGKILL", output), output
    assert 1.0 <= stopped < 4.0, output
    assert not left_running(output)


def test_then_runs_once_the_first_ones_started_and_the_rest_start_when_it_succeeds(supervise):
    run = supervise("db: sleep 60\napp: sleep 60\n", "--first", "db", "--then", "sleep 0.5; echo set up")
    [(db_at, _)] = run.when(r"db started")
    run.when(r"^set up$")
    [(app_at, _)] = run.when(r"app started")
    assert app_at - db_at >= 0.5
    lines = [line for _, line in run.lines]
    assert lines.index("set up") < next(i for i, line in enumerate(lines) if "app started" in line)
    run.process.send_signal(signal.SIGTERM)
    assert run.exit_code() == 0
    assert not left_running(run.output())


def test_a_failing_then_stops_everything_with_its_exit_code(supervise):
    run = supervise("db: sleep 60\napp: sleep 60\n", "--first", "db", "--then", "exit 4")
    assert run.exit_code() == 4
    output = run.output()
    assert "| exit 4 exited with code 4: stopping everything" in output
    assert re.search(r"db \(pid \d+\) was killed by SIGTERM", output), output
    assert not started(output, "app")
    assert not left_running(output)
