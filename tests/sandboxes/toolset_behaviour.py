"""What every provider's sandbox does with the toolset, whichever the provider.

Each provider's test module subclasses ToolsetBehaviour and supplies the fixtures `provider` and
`sandbox` (a fresh sandbox per test) and `new_sandbox` (from conftest).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from typing import Any

import pytest

from sandboxes.providers.base import Provider, SandboxError, ToolFailed, ToolInputError

from .conftest import Sandbox, sandbox_resources


def _rss_mb() -> float:
    with open("/proc/self/status") as file:
        return int(re.search(r"VmRSS:\s+(\d+)", file.read()).group(1)) / 1024  # type: ignore[union-attr]


def _until(call: Any, *, timeout_s: float, interval_s: float = 0.2) -> Any:
    """The first truthy result of call() within timeout_s (exceptions count as falsy)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = call()
            if last:
                return last
        except (ToolFailed, SandboxError) as error:
            last = error
        time.sleep(interval_s)
    raise AssertionError(f"nothing within {timeout_s} s; last: {last!r}")


class ToolsetBehaviour:
    # -- bash

    def test_bash_returns_stdout_and_stderr_interleaved_and_a_nonzero_exit_code(
        self, sandbox: Sandbox
    ) -> None:
        assert sandbox.bash("echo out; echo err >&2; echo out2") == "out\nerr\nout2"
        assert sandbox.bash("echo partial; exit_code() { return 3; }; exit_code") == "partial\n[exit code 3]"
        assert sandbox.bash("true") == ""

    def test_shell_keeps_working_directory_and_exported_variables_between_calls(
        self, sandbox: Sandbox
    ) -> None:
        sandbox.bash("mkdir -p /workspace/project && cd /workspace/project && export GREETING=hello")
        sandbox.bash("LOCAL_ONLY=1; f() { echo from-function; }")
        assert (
            sandbox.bash("pwd; echo $GREETING $LOCAL_ONLY; f") == "/workspace/project\nhello 1\nfrom-function"
        )

    def test_restart_gives_a_fresh_shell_in_the_workspace(self, sandbox: Sandbox) -> None:
        sandbox.bash("cd /tmp && export GREETING=hello")
        assert "restarted" in sandbox.call("bash", restart=True)
        assert sandbox.bash("pwd; echo [$GREETING]") == "/workspace\n[]"

    def test_exit_ends_the_shell_and_the_next_call_gets_a_new_one(self, sandbox: Sandbox) -> None:
        sandbox.bash("cd /tmp")
        result = sandbox.bash("exit 4")
        assert "[exit code 4]" in result and "next command starts a new one" in result
        assert sandbox.bash("pwd") == "/workspace"

    def test_background_process_keeps_running_after_the_call(self, sandbox: Sandbox) -> None:
        started = time.monotonic()
        sandbox.bash("sleep 300 & nohup sh -c 'sleep 1; echo done > /tmp/marker' >/dev/null 2>&1 &")
        assert time.monotonic() - started < 5
        assert sandbox.bash("pgrep -f 'sleep 300' >/dev/null && echo running") == "running"
        assert _until(lambda: sandbox.bash("cat /tmp/marker 2>/dev/null; true"), timeout_s=10) == "done"

    def test_endless_command_times_out_inside_and_the_shell_stays_usable(self, sandbox: Sandbox) -> None:
        sandbox.bash("cd /tmp && export KEPT=yes")
        for endless in ("sleep 1000", "while :; do :; done", "while true; do sleep 1; done"):
            started = time.monotonic()
            with pytest.raises(ToolFailed, match=r"timed out after 1 s") as raised:
                sandbox.bash(f"echo before; {endless}", timeout_ms=1000)
            assert time.monotonic() - started < 5
            assert "the shell is still usable" in str(raised.value)
        kept = sandbox.bash("pwd; echo $KEPT")
        assert kept == "/tmp\nyes", kept

    def test_the_timeout_error_carries_the_output_so_far(self, sandbox: Sandbox) -> None:
        with pytest.raises(ToolFailed) as raised:
            sandbox.bash("echo first line; sleep 100", timeout_ms=500)
        assert str(raised.value).startswith("first line\n[the command timed out after 0.5 s")

    def test_cancelled_stops_a_sleep_within_a_second(self, sandbox: Sandbox) -> None:
        sandbox.bash("true")  # the toolbox is up: measure the cancel only
        asked_at: list[float] = []

        def cancelled() -> bool:
            if time.monotonic() - started > 0.5:
                asked_at.append(time.monotonic())
                return True
            return False

        started = time.monotonic()
        with pytest.raises(ToolFailed, match="interrupted"):
            sandbox.bash("sleep 30", cancelled=cancelled)
        assert time.monotonic() - asked_at[0] < 1.0
        assert sandbox.bash("echo usable") == "usable"

    # -- output

    def test_long_output_keeps_head_and_tail_around_a_marker_naming_the_kept_file(
        self, sandbox: Sandbox
    ) -> None:
        result = sandbox.bash("seq 1 100000")
        assert len(result) <= 31_000
        assert result.startswith("1\n2\n3\n") and result.endswith("\n99999\n100000")
        marker = re.search(
            r"\[\.\.\. ([\d,]+) bytes \(([\d,]+) lines\) cut here; .* is kept in (\S+) \.\.\.\]", result
        )
        assert marker, result[11_000:13_000]
        kept = marker.group(3)
        assert sandbox.bash(f"wc -c < {kept}; tail -n 1 {kept}") == "588895\n100000"
        shown = len(result.encode()) - len(marker.group(0))
        assert int(marker.group(1).replace(",", "")) + shown == pytest.approx(588895, abs=10)

    def test_a_command_printing_200_mb_returns_a_capped_result_in_bounded_memory(
        self, sandbox: Sandbox
    ) -> None:
        before = _rss_mb()
        result = sandbox.bash("head -c 200000000 /dev/zero | tr '\\0' 'x' | fold -w 100", timeout_ms=60_000)
        assert len(result) <= 31_000 and "lines) cut here; the whole output (192.6 MiB)" in result
        assert _rss_mb() - before < 50
        daemon_peak_kb = int(sandbox.bash("grep VmHWM /proc/$PPID/status | tr -dc 0-9"))
        assert daemon_peak_kb < 100_000  # the daemon never held the output either

    def test_binary_output_is_decoded_with_replacement_characters_and_said_so(self, sandbox: Sandbox) -> None:
        result = sandbox.bash("printf 'text \\377\\376\\000 more'")
        assert result.startswith("text \ufffd\ufffd\ufffd more")
        assert result.endswith("[binary output: bytes that are not UTF-8 text are shown as \ufffd]")
        assert sandbox.bash("printf 'caf\\303\\251'") == "café"

    # -- limits and hardening

    def test_fork_bomb_is_contained_by_the_pids_limit_and_the_sandbox_answers_afterwards(
        self, new_sandbox: Any
    ) -> None:
        sandbox = new_sandbox(pids=128)
        with contextlib.suppress(ToolFailed):  # the bomb may take its call down: what follows matters
            sandbox.bash(":(){ :|:& };:", timeout_ms=3000)
        outputs: list[str] = []

        def contained() -> bool:
            outputs.append(sandbox.bash("echo alive; ps -e --no-headers | wc -l", timeout_ms=5000))
            alive, _, processes = outputs[-1].partition("\n")
            return (
                alive == "alive" and processes.split("\n")[0].isdigit() and int(processes.split("\n")[0]) < 20
            )

        _until(contained, timeout_s=30)
        assert any("stayed at its process limit (128)" in output for output in outputs), outputs

    def test_hardening_is_visible_from_inside(self, sandbox: Sandbox) -> None:
        status = sandbox.bash(
            "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; tail -n +3 /proc/net/dev"
        )
        uid, cap_eff, no_new_privs, *interfaces = status.split("\n")
        assert uid == "1000"
        assert cap_eff.split() == ["CapEff:", "0000000000000000"]
        assert no_new_privs.split() == ["NoNewPrivs:", "1"]
        assert [line.split(":")[0].strip() for line in interfaces] == ["lo"]

    # -- file tools

    def test_write_then_read_numbers_lines_like_cat_n_and_honours_view_range(self, sandbox: Sandbox) -> None:
        assert sandbox.call("write", file_path="notes/a.txt", content="one\ntwo\nthree\n") == (
            "Created /workspace/notes/a.txt (14 bytes)"
        )
        assert (
            sandbox.call("read", file_path="/workspace/notes/a.txt")
            == "     1\tone\n     2\ttwo\n     3\tthree"
        )
        assert (
            sandbox.call("read", file_path="notes/a.txt", view_range=[2, 3]) == "     2\ttwo\n     3\tthree"
        )
        assert sandbox.call("read", file_path="notes/a.txt", view_range=[3, -1]) == "     3\tthree"
        assert sandbox.bash("cat notes/a.txt") == "one\ntwo\nthree"
        with pytest.raises(ToolInputError, match="view_range starts at line 9"):
            sandbox.call("read", file_path="notes/a.txt", view_range=[9, 10])

    def test_read_caps_a_long_file_and_says_how_to_read_on(self, sandbox: Sandbox) -> None:
        sandbox.bash("seq 1 50000 > /tmp/long.txt")
        result = sandbox.call("read", file_path="/tmp/long.txt")
        assert len(result) <= 31_000
        assert result.startswith("     1\t1\n") and "of 50000" in result and "view_range" in result

    def test_edit_replaces_a_unique_string_and_refuses_absent_or_ambiguous_ones(
        self, sandbox: Sandbox
    ) -> None:
        sandbox.call("write", file_path="code.py", content="a = 1\nb = 2\nc = 1\n")
        assert sandbox.call("edit", file_path="code.py", old_string="b = 2", new_string="b = 3").startswith(
            "Edited /workspace/code.py: replaced 1 occurrence."
        )
        with pytest.raises(ToolFailed, match="was not found"):
            sandbox.call("edit", file_path="code.py", old_string="z = 9", new_string="z = 0")
        with pytest.raises(ToolFailed, match="occurs 2 times"):
            sandbox.call("edit", file_path="code.py", old_string="= 1", new_string="= 5")
        assert sandbox.bash("cat code.py") == "a = 1\nb = 3\nc = 1"
        sandbox.call("edit", file_path="code.py", old_string="= 1", new_string="= 5", replace_all=True)
        assert sandbox.bash("cat code.py") == "a = 5\nb = 3\nc = 5"

    def test_glob_lists_matching_files_and_grep_finds_lines(self, sandbox: Sandbox) -> None:
        sandbox.bash(
            "mkdir -p src/pkg && echo 'def main(): pass' > src/pkg/app.py && echo 'x' > src/notes.md"
        )
        assert sandbox.call("glob", pattern="**/*.py") == "/workspace/src/pkg/app.py"
        assert sandbox.call("glob", pattern="*.md", path="src") == "/workspace/src/notes.md"
        assert (
            sandbox.call("grep", pattern=r"def \w+", path="src")
            == "/workspace/src/pkg/app.py:1:def main(): pass"
        )
        assert sandbox.call("grep", pattern="absent") == "No matches for absent in /workspace"

    def test_file_tools_refuse_paths_outside_workspace_and_tmp(self, sandbox: Sandbox) -> None:
        sandbox.bash("ln -s /etc /workspace/etc-link")
        for tool, input in [
            ("read", {"file_path": "/etc/passwd"}),
            ("read", {"file_path": "../etc/passwd"}),
            ("read", {"file_path": "etc-link/passwd"}),
            ("write", {"file_path": "/home/sandbox/x", "content": "x"}),
            ("edit", {"file_path": "/etc/hosts", "old_string": "a", "new_string": "b"}),
            ("glob", {"pattern": "*", "path": "/etc"}),
            ("grep", {"pattern": "root", "path": "/etc"}),
        ]:
            with pytest.raises(ToolInputError, match="outside the allowed directories"):
                sandbox.call(tool, **input)
        assert sandbox.call("write", file_path="/tmp/scratch.txt", content="ok").startswith(
            "Created /tmp/scratch.txt"
        )

    def test_invalid_input_raises_tool_input_error(self, sandbox: Sandbox) -> None:
        """The provider sends the input as it is: these are the daemon's own refusals, by the same table and
        in the same words as the brain's check (`toolbox.schema`)."""
        for tool, input, message in [
            ("paint", {}, "unknown tool 'paint'"),
            ("read", {}, "input is missing the required field 'file_path'"),
            ("bash", {"command": 3}, "input.command must be of type string"),
            ("bash", {"command": "true", "timeout_ms": "soon"}, "input.timeout_ms must be of type integer"),
            ("bash", {"command": "true", "timeout_ms": 0}, "input.timeout_ms must be at least 1"),
            (
                "read",
                {"file_path": "a", "view_range": [1, "2"]},
                "input.view_range[1] must be of type integer",
            ),
            ("glob", {"pattern": "*", "path": None}, "input.path must be of type string"),
            ("write", {"file_path": "a", "content": "b", "mode": "x"}, "input has no field 'mode'"),
            ("edit", {"file_path": "a", "old_string": "same", "new_string": "same"}, "the same"),
        ]:
            with pytest.raises(ToolInputError, match=re.escape(message)):
                sandbox.call(tool, **input)

    # -- lifecycle

    def test_list_handles_sees_a_sandbox_with_its_labels_and_terminate_removes_it(
        self, provider: Provider
    ) -> None:
        resources = sandbox_resources()
        handle = provider.provision(resources)
        try:
            assert provider.is_alive(handle)
            labels = provider.list_handles()[handle]
            assert labels["workbench.sandbox"] == resources.labels["workbench.sandbox"]
        finally:
            provider.terminate(handle)
        assert handle not in provider.list_handles()
        assert not provider.is_alive(handle)
        provider.terminate(handle)  # idempotent

    def test_calls_from_several_threads_are_all_answered(self, sandbox: Sandbox) -> None:
        results: dict[int, str] = {}

        def work(n: int) -> None:
            results[n] = sandbox.bash(f"echo {n}") if n % 2 else sandbox.call("glob", pattern="*")

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert {n: results[n] for n in range(1, 8, 2)} == {n: str(n) for n in range(1, 8, 2)}
