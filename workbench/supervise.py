"""`python -m workbench.supervise`: run the Procfile's processes and keep them running (what `make run` runs).

Each process runs in a process group of its own, its output prefixed with its name. When one dies, this says
which and how, kills what is left of its group (a Celery worker's pool processes, PostgreSQL's backends: orphans
that would go on holding session leases or the server's shared memory), and starts it again after a backoff that
doubles from 0.5 s to 10 s and starts over once the process has stayed up 30 s. Everything stops on SIGINT,
SIGTERM or SIGHUP (SIGTERM to every group, SIGKILL to what is left after a grace period; a second Ctrl-C kills
at once), or when a process crash-loops (restarted 5 times within 60 s and dead again), which exits 1 naming it.

`--first NAME --then COMMAND` starts the processes named first, runs COMMAND (e.g. one that waits for the
database and migrates it) and starts the others only once it succeeds; if it fails, everything stops.

A Procfile line is `name: command`, run by bash, which expands its variables and, for a simple command, execs
it: the process watched is then the command itself, not a shell.

It imports no Django: it has to start, and stop, the rest whatever state the project is in.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

SELF = "supervise"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LINE_MAX = 65536  # a longer stretch without a newline is printed as a line of its own


@dataclass(frozen=True)
class Policy:
    backoff: float = 0.5  # the first restart's delay, doubled for each quick death after it
    max_backoff: float = 10.0
    stable: float = 30.0  # up this long, a process's next restart waits `backoff` again
    crash_limit: int = 5  # restarts within `crash_window` after which the next death stops everything
    crash_window: float = 60.0
    grace: float = 10.0  # between SIGTERM and SIGKILL when stopping


@dataclass
class Process:
    name: str
    command: str
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    delay: float = 0.0  # the backoff its last restart waited
    restart_at: float | None = None
    restarts: list[float] = field(default_factory=list)  # when it was restarted, within the crash window


def read_procfile(path: Path) -> dict[str, str]:
    """The Procfile's `name: command` lines, in order (blank lines and # comments skipped)."""
    commands: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r"\s*([\w-]+)\s*:\s*(\S.*)", line)
        if match is None:
            raise ValueError(f"{path}:{number}: not a `name: command` line: {line!r}")
        commands[match[1]] = match[2].strip()
    return commands


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies are dead) of process group `pgid`, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry.name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                    members.append(int(entry.name))
    return members


def kill_group(pgid: int, signum: int = signal.SIGKILL) -> int:
    """Send `signum` to what is alive of the group; how many that was."""
    members = group_members(pgid)
    if members:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signum)
    return len(members)


def just_ended(popen: subprocess.Popen[bytes]) -> bool:
    """Whether the process has ended and this is the first look that sees it (which reaps it)."""
    return popen.returncode is None and popen.poll() is not None


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


class Supervisor:
    def __init__(
        self,
        commands: dict[str, str],
        *,
        first: Sequence[str] = (),
        then: str | None = None,
        policy: Policy | None = None,
        out: BinaryIO | None = None,
    ) -> None:
        self.processes = {name: Process(name, command) for name, command in commands.items()}
        self.first = [self.processes[name] for name in first]
        self.then = then
        self.policy = policy or Policy()
        self.out = out or sys.stdout.buffer
        # Python writes its output in blocks to a pipe: line by line, as it would to a terminal.
        self.env = {"PYTHONUNBUFFERED": "1", **os.environ}
        self.width = max(len(name) for name in [SELF, *commands])
        self.selector = selectors.DefaultSelector()
        self.pending: dict[int, bytes] = {}  # output pipe -> its unfinished line
        self.names: dict[int, str] = {}  # output pipe -> whose it is
        self.setup: subprocess.Popen[bytes] | None = None
        self.signals: list[int] = []
        self.stopping = False
        self.kill_at = 0.0
        self.exit_code = 0

    # -- the loop

    def run(self) -> int:
        wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(wakeup_read, False)
        os.set_blocking(wakeup_write, False)
        self.selector.register(wakeup_read, selectors.EVENT_READ)
        previous_wakeup = signal.set_wakeup_fd(wakeup_write)
        previous = {
            signum: signal.signal(signum, self._on_signal) for signum in (*STOP_SIGNALS, signal.SIGCHLD)
        }
        try:
            if self.then is None:
                self._start_all(self.processes.values())
            else:
                self._start_all(self.first)
                self._start_setup(self.then)
            while not self._done():
                self._wait(wakeup_read)
                self._handle_signals()
                self._notice_deaths()
                self._restart_due()
                if self.stopping and time.monotonic() >= self.kill_at:
                    self._kill_everything()
            self._say(f"stopped: every process has exited (exit code {self.exit_code})")
            return self.exit_code
        finally:
            # Nothing outlives the supervisor, whatever ended it (an exception included).
            self._kill_everything(quiet=True)
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for fd in [*self.names, wakeup_read]:
                self.selector.unregister(fd)
                os.close(fd)
            os.close(wakeup_write)
            self.selector.close()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)  # handled in the loop; the wakeup fd ends its wait

    def _wait(self, wakeup: int) -> None:
        timeout = 1.0
        due = [p.restart_at for p in self.processes.values() if p.restart_at is not None]
        if self.stopping:
            due.append(self.kill_at)
        if due:
            timeout = max(0.0, min(timeout, min(due) - time.monotonic()))
        for key, _ in self.selector.select(timeout):
            if key.fd == wakeup:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wakeup, 512):
                        pass
            else:
                self._read(key.fd)

    def _done(self) -> bool:
        if not self.stopping:
            return False
        return not self._groups()  # every leader seen dead by _notice_deaths, which killed its group

    # -- starting

    def _start_all(self, processes: Iterable[Process]) -> None:
        for process in processes:
            self._start(process)

    def _start(self, process: Process) -> None:
        # A pipe of its own rather than the Popen's: it is read until its end, which may come after a restart
        # (a process that left the group, e.g. a sandbox's keeper, may hold it).
        read, write = os.pipe()
        try:
            process.popen = subprocess.Popen(
                ["bash", "-c", process.command],
                stdin=subprocess.DEVNULL,
                stdout=write,
                stderr=write,
                start_new_session=True,  # a group of its own, and no Ctrl-C from the terminal: this stops it
                env=self.env,
            )
        finally:
            os.close(write)
        process.started = time.monotonic()
        os.set_blocking(read, False)
        self.names[read] = process.name
        self.selector.register(read, selectors.EVENT_READ)
        self._say(f"{process.name} started (pid {process.popen.pid})")

    def _start_setup(self, command: str) -> None:
        self._say(f"running {command} first; the rest start once it succeeds")
        self.setup = subprocess.Popen(
            ["bash", "-c", command], stdin=subprocess.DEVNULL, start_new_session=True
        )

    # -- deaths and restarts

    def _notice_deaths(self) -> None:
        if self.setup is not None and just_ended(self.setup):
            self._setup_ended(self.setup)
        for process in self.processes.values():
            if process.popen is not None and just_ended(process.popen):
                self._died(process)

    def _setup_ended(self, setup: subprocess.Popen[bytes]) -> None:
        kill_group(setup.pid)
        if self.stopping:
            return
        if setup.returncode != 0:
            self._say(f"{self.then} {how_it_ended(setup.returncode)}: stopping everything")
            self.exit_code = max(setup.returncode, 1)
            self._stop()
            return
        self._start_all([p for p in self.processes.values() if p.popen is None])

    def _died(self, process: Process) -> None:
        assert process.popen is not None and process.popen.returncode is not None
        now = time.monotonic()
        up = now - process.started
        orphans = kill_group(process.popen.pid)
        what = f"{process.name} (pid {process.popen.pid}) {how_it_ended(process.popen.returncode)} after {up:.1f} s"
        if orphans:
            what += f"; killed the {orphans} process{'es' if orphans > 1 else ''} left in its group"
        if self.stopping:
            self._say(what)
            return
        process.restarts = [at for at in process.restarts if now - at < self.policy.crash_window]
        if len(process.restarts) >= self.policy.crash_limit:
            self._say(
                f"{what}: a crash loop ({len(process.restarts)} restarts within "
                f"{self.policy.crash_window:g} s); stopping everything"
            )
            self.exit_code = 1
            self._stop()
            return
        if up >= self.policy.stable or not process.delay:
            process.delay = self.policy.backoff
        else:
            process.delay = min(process.delay * 2, self.policy.max_backoff)
        process.restart_at = now + process.delay
        self._say(f"{what}; restarting it in {process.delay:g} s")

    def _restart_due(self) -> None:
        now = time.monotonic()
        for process in self.processes.values():
            if process.restart_at is not None and now >= process.restart_at and not self.stopping:
                process.restart_at = None
                process.restarts.append(now)
                self._start(process)

    # -- stopping

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if signum == signal.SIGCHLD:
                continue
            name = signal.Signals(signum).name
            if self.stopping:
                self._say(f"{name} again: killing everything now")
                self.kill_at = time.monotonic()
            else:
                self._say(f"{name}: stopping every process (SIGTERM; SIGKILL after {self.policy.grace:g} s)")
                self._stop()

    def _stop(self) -> None:
        self.stopping = True
        self.kill_at = time.monotonic() + self.policy.grace
        for process in self.processes.values():
            process.restart_at = None
        for pgid in self._groups():
            kill_group(pgid, signal.SIGTERM)

    def _kill_everything(self, *, quiet: bool = False) -> None:
        for pgid in self._groups():
            killed = kill_group(pgid)
            if killed and not quiet:
                self._say(f"killed {killed} process{'es' if killed > 1 else ''} of group {pgid} (SIGKILL)")
        self.kill_at = float("inf")

    def _groups(self) -> list[int]:
        """The process groups started whose leader may still run (those of the dead are killed as they die)."""
        started = [p.popen for p in self.processes.values() if p.popen is not None]
        return [
            popen.pid
            for popen in [*started, *([self.setup] if self.setup is not None else [])]
            if popen.returncode is None
        ]

    # -- output

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, LINE_MAX)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buffered = self.pending.pop(fd, b"") + data
        *lines, rest = buffered.split(b"\n")
        if not data or len(rest) >= LINE_MAX:
            lines.append(rest)
            rest = b""
        for line in lines:
            if line or data:
                self._print(self.names[fd], line)
        if not data:
            self.selector.unregister(fd)
            os.close(fd)
            del self.names[fd]
        elif rest:
            self.pending[fd] = rest

    def _say(self, text: str) -> None:
        self._print(SELF, text.encode())

    def _print(self, name: str, line: bytes) -> None:
        prefix = f"{time.strftime('%H:%M:%S')} {name:<{self.width}} | ".encode()
        with contextlib.suppress(
            OSError
        ):  # a closed pipe or a hung-up terminal: the line is lost, not the stop
            self.out.write(prefix + line.rstrip(b"\r") + b"\n")
            self.out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.supervise", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="the processes to run (default: every one in the Procfile)")
    parser.add_argument("-f", "--procfile", type=Path, default=Path("Procfile"))
    parser.add_argument("--first", action="append", default=[], help="start this one first (repeatable)")
    parser.add_argument(
        "--then", help="run this once the first ones are started; start the rest if it succeeds"
    )
    defaults = Policy()
    parser.add_argument("--backoff", type=float, default=defaults.backoff)
    parser.add_argument("--max-backoff", type=float, default=defaults.max_backoff)
    parser.add_argument("--stable", type=float, default=defaults.stable)
    parser.add_argument("--crash-limit", type=int, default=defaults.crash_limit)
    parser.add_argument("--crash-window", type=float, default=defaults.crash_window)
    parser.add_argument("--grace", type=float, default=defaults.grace)
    args = parser.parse_args(argv)
    commands = read_procfile(args.procfile)
    names = args.names or list(commands)
    unknown = sorted({*names, *args.first} - set(commands))
    if unknown:
        parser.error(f"not in {args.procfile}: {', '.join(unknown)}")
    if not set(args.first) <= set(names):
        parser.error("--first names a process that is not run")
    if args.first and args.then is None:
        parser.error("--first goes with --then")
    policy = Policy(
        backoff=args.backoff,
        max_backoff=args.max_backoff,
        stable=args.stable,
        crash_limit=args.crash_limit,
        crash_window=args.crash_window,
        grace=args.grace,
    )
    supervisor = Supervisor(
        {name: commands[name] for name in names}, first=args.first, then=args.then, policy=policy
    )
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
