"""The persistent shell of a sandbox: one interactive bash with a pseudo-terminal, kept between calls.

Why a terminal: with one, bash runs each command line as a job in its own process group and tells
the terminal which group is in the foreground. A call that times out or is cancelled is stopped as by
Ctrl-C at a keyboard (SIGINT to the foreground job and to bash, then SIGKILL of the job), and bash
comes back to its prompt with its working directory, variables and background jobs intact.

Bash reads its command lines from a pipe, not from the terminal. Bash has a race: a Ctrl-C that
reaches it while it starts a job can send it back to its prompt after the job has taken the
terminal. Reading a terminal it does not hold gives bash EIO, which it takes for end of input, and it
exits (status 130). This happened in about 2% of stopped `while true; do sleep 0.001; done` loops. A
pipe is readable whoever holds the terminal, and bash takes the terminal back with its next job.

No call's data goes through the terminal: bash sources the command from a file, with stdout and
stderr redirected into the call's output file and stdin from /dev/null. When the sandbox's disk is
too full to hold that file, bash sources it from a pipe it makes itself (a process substitution that
printf feeds from one quoted word), so that the call that frees the disk can run: the same `.` as
from the file, with a fork only then. The command goes down bash's command pipe only so quoted:
as it is, an unmatched quote in it would leave bash waiting for more. The terminal carries only the
prompt, set for each call to a marker holding the call's id and exit status: seeing it means the
call is over. As on a terminal, a background job that ends while a command runs is
announced by bash ("[1]+ Done ...") in that command's output.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field

from .client import RUNTIME_DIR
from .disk import is_full
from .errors import Failed
from .output import MAX_OUTPUT_BYTES
from .procs import kill_session

CALLS_DIR = RUNTIME_DIR + "/calls"
PROMPT = re.compile(rb"\x1eTB([0-9A-Za-z_-]+):(\d+)\x1f")
# Escalation when a call must stop: Ctrl-C twice, then SIGKILL of the foreground job, then a new shell
# if bash is not back at its prompt within this many seconds.
INTERRUPT_GRACE_S = 3.0
# Under memory pressure the kernel should kill a command, not the daemon. Bash sets it for itself and
# what it starts: until exec, the child of a daemon that is not dumpable may not write its own /proc files.
SETUP = (
    "echo 500 > /proc/self/oom_score_adj; "
    "unset HISTFILE PROMPT_COMMAND; set +o history; PS0=; PS2=; "
    "export PAGER=cat GIT_PAGER=cat GIT_EDITOR=true EDITOR=true VISUAL=true TERM=dumb; "
)
RESET_NOTE = "the working directory, variables and background jobs of the old shell are gone"
# Bytes as they go in a $'...' word: printable ASCII as it is, but for the quote, the backslash and
# the ! of history expansion (on in an interactive bash); everything else as \xHH.
_QUOTED = [chr(b) if 0x20 <= b < 0x7F and chr(b) not in "'\\!" else f"\\x{b:02x}" for b in range(256)]


def _prompt(call_id: str) -> str:
    return f"PS1=$'\\036TB'\"{call_id}:\"'$?'$'\\037'"


def _quoted(text: str) -> str:
    """`text` as one bash word on one line."""
    return "$'" + "".join(_QUOTED[b] for b in text.encode("utf-8", "surrogateescape")) + "'"


@dataclass
class Outcome:
    exit_code: int | None
    stopped: str | None = None  # why the call was stopped: "timeout", "cancelled" or "output"
    notes: list[str] = field(default_factory=list)


class _Bash:
    """One bash process, its terminal, the pipe it reads commands from, and a thread reading prompts."""

    def __init__(self, *, cwd: str, env: dict[str, str]):
        self.cond = threading.Condition()
        self.prompts: dict[str, int] = {}
        self.exited = False
        commands, self.commands = os.pipe()
        self.pid, self.master = os.forkpty()
        if self.pid == 0:  # the child: only exec from here
            try:
                os.dup2(commands, 0)
                os.chdir(cwd)
                os.execvpe("bash", ["bash", "--noprofile", "--norc", "--noediting", "-i"], env)
            finally:
                os._exit(127)
        os.close(commands)
        threading.Thread(target=self._read_terminal, name="shell-terminal", daemon=True).start()

    def _read_terminal(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the shell and everything holding the terminal are gone
                chunk = b""
            if not chunk:
                break
            pending += chunk
            end = 0
            with self.cond:
                for match in PROMPT.finditer(pending):
                    self.prompts[match.group(1).decode()] = int(match.group(2))
                    end = match.end()
                if end:
                    self.cond.notify_all()
            pending = pending[end:][-256:]
        with self.cond:
            self.exited = True
            self.cond.notify_all()

    def send(self, line: str) -> None:
        # A shell that has exited is noticed by the caller (`exited`), not here.
        with contextlib.suppress(BrokenPipeError):
            os.write(self.commands, line.encode() + b"\n")

    def wait_prompt(self, call_id: str, timeout_s: float) -> int | None:
        with self.cond:
            self.cond.wait_for(lambda: call_id in self.prompts or self.exited, timeout_s)
            return self.prompts.pop(call_id, None)

    def foreground_group(self) -> int:
        try:
            return os.tcgetpgrp(self.master)
        except OSError:
            return self.pid

    def reap(self, timeout_s: float = 2.0) -> int | None:
        """The shell's exit code once it has exited (waiting up to timeout_s), else None."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                code = os.waitstatus_to_exitcode(status)
                return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    def stop(self, *, keep_jobs: bool = False) -> None:
        """Kill the shell and every process started from it (its session), then close the terminal.

        With `keep_jobs`, only bash is killed: its jobs, each in a process group of its own, get no
        SIGHUP from a shell killed outright, and live on without a terminal.
        """
        if keep_jobs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        else:
            kill_session(self.pid)
        self.reap()
        for fd in (self.commands, self.master):
            with contextlib.suppress(OSError):
                os.close(fd)


class Shell:
    """The sandbox's bash, started on demand and restarted (saying so) when it dies."""

    def __init__(self, *, cwd: str, env: dict[str, str]):
        self.cwd = cwd
        self.env = env
        self._bash: _Bash | None = None
        self._busy = threading.Lock()
        self._announcements: list[str] = []

    def start(self) -> None:
        bash = _Bash(cwd=self.cwd, env=self.env)
        bash.send(SETUP + _prompt("ready"))
        if bash.wait_prompt("ready", 10.0) is None:
            bash.stop()
            raise Failed("the shell did not start")
        self._bash = bash

    def restart(self) -> str:
        with self._busy:
            if self._bash:
                self._bash.stop()
            self._announcements.clear()
            self.start()
        return "[the shell was restarted: " + RESET_NOTE + "]"

    def renew(self, note: str | None, *, timeout_s: float) -> None:
        """Replace bash by a new one once no command runs, keeping what the old one started running,
        and say `note` (if any) with the next command's result."""
        if not self._busy.acquire(timeout=timeout_s):
            raise Failed(f"the shell stayed busy for {timeout_s:g} s, so it could not be replaced")
        try:
            if self._bash:
                self._bash.stop(keep_jobs=True)
                self._bash = None
            self._announcements.clear()
            self.start()
            if note:
                self.announce(note)
        finally:
            self._busy.release()

    def announce(self, note: str) -> None:
        """Say `note` with the next command's result (e.g. why the shell is new)."""
        self._announcements.append(note)

    def contain(self, note: str) -> None:
        """Kill the shell and all it started (used when the sandbox is at its process limit)."""
        bash = self._bash
        if bash:
            self.announce(note)
            kill_session(bash.pid)

    def run(
        self,
        call_id: str,
        command: str,
        *,
        out_path: str,
        timeout_s: float,
        cancel: threading.Event,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> Outcome:
        if not self._busy.acquire(timeout=timeout_s):
            raise Failed(f"the shell stayed busy with another command for {timeout_s:g} s")
        script = f"{CALLS_DIR}/{call_id}.sh"
        try:
            outcome = Outcome(exit_code=None)
            self._ensure_running(outcome.notes)
            outcome.notes += self._announcements
            self._announcements.clear()
            bash = self._bash
            assert bash is not None
            source = self._source(script, command)
            open(out_path, "wb").close()
            # `jobs` first: it takes the news of background jobs that ended since the last call,
            # which bash would otherwise print into this call's output.
            bash.send(
                f"{_prompt(call_id)}; jobs >/dev/null 2>&1; {{ . {source} ; }} > {out_path} 2>&1 < /dev/null"
            )
            deadline = time.monotonic() + timeout_s
            while True:
                status = bash.wait_prompt(call_id, 0.1)
                if status is not None:
                    outcome.exit_code = status
                    return outcome
                if bash.exited:
                    outcome.exit_code = self._ended(bash, outcome.notes)
                    return outcome
                outcome.stopped = self._reason_to_stop(cancel, deadline, out_path, max_output_bytes)
                if outcome.stopped:
                    outcome.exit_code = self._interrupt(bash, call_id, outcome.notes)
                    return outcome
        finally:
            self._busy.release()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(script)

    @staticmethod
    def _source(script: str, command: str) -> str:
        """What bash sources the command from: the file `script`, or a pipe if the disk is too full."""
        try:
            os.makedirs(CALLS_DIR, mode=0o700, exist_ok=True)
            with open(script, "w") as file:
                file.write(command + "\n")
            return script
        except OSError as error:
            if not is_full(error):
                raise
        return f"<(printf '%s\\n' {_quoted(command)})"

    def _ensure_running(self, notes: list[str]) -> None:
        bash = self._bash
        if bash and not bash.exited:
            return
        if bash:
            code = bash.reap(0)
            bash.stop()
            if not self._announcements:  # nothing said yet why the shell ended
                ended = "ended" if code is None else f"ended (exit code {code})"
                notes.append(f"[the shell had {ended} and a new one was started: {RESET_NOTE}]")
        self.start()

    def _ended(self, bash: _Bash, notes: list[str]) -> int | None:
        """The shell exited during the call (`exit`, `kill $$`, or contained): report, start afresh."""
        code = bash.reap()
        bash.stop()
        self._bash = None
        if self._announcements:
            notes += self._announcements
            self._announcements.clear()
        else:
            notes.append(f"[the shell exited; the next command starts a new one: {RESET_NOTE}]")
        return code

    @staticmethod
    def _reason_to_stop(
        cancel: threading.Event, deadline: float, out_path: str, max_output_bytes: int
    ) -> str | None:
        if cancel.is_set():
            return "cancelled"
        if time.monotonic() > deadline:
            return "timeout"
        try:
            if os.stat(out_path).st_size > max_output_bytes:
                return "output"
        except FileNotFoundError:
            pass
        return None

    def _interrupt(self, bash: _Bash, call_id: str, notes: list[str]) -> int | None:
        """Stop the running command, keeping the shell if it comes back to its prompt in time.

        Each round is a Ctrl-C for bash itself as well as for the job in the foreground: a job that
        ends as the signal comes (a loop of short commands) would otherwise miss it, and bash would
        go on with the loop. From the third round the job is killed instead.
        """
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        attempt = 0
        while time.monotonic() < deadline and not bash.exited:
            group = bash.foreground_group()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(bash.pid, signal.SIGINT)
                if group != bash.pid:
                    os.killpg(group, signal.SIGKILL if attempt >= 2 else signal.SIGINT)
            status = bash.wait_prompt(call_id, 0.5)
            if status is not None:
                self._kill_leftover_job(bash)
                return status
            attempt += 1
        if bash.exited:
            return self._ended(bash, notes)
        bash.stop()
        self._bash = None
        notes.append(
            f"[the command did not stop, so the shell was killed; the next command starts a new one: {RESET_NOTE}]"
        )
        return None

    @staticmethod
    def _kill_leftover_job(bash: _Bash) -> None:
        """Kill the job a stopped command started as bash took the Ctrl-C, if one holds the terminal.

        Bash can take a Ctrl-C just as it starts a job, and return to its prompt with that job running
        in the foreground. Bash is at its prompt, so no job of a later command exists yet.
        """
        group = bash.foreground_group()
        if group != bash.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
