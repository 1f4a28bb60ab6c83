"""The sandbox's processes, read from /proc (the sandbox has its own pid namespace)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

PIDS_LIMIT_ENV = "WORKBENCH_PIDS_LIMIT"


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, process group, session) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2]), int(fields[3])


def session_groups(session: int) -> set[int]:
    """The process groups of the live (not zombie) processes of a session."""
    groups = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            stat = _stat(pid)
            if stat and stat[2] == session and stat[0] != "Z":
                groups.add(stat[1])
    return groups


def kill_session(session: int, *, timeout_s: float = 3.0) -> None:
    """SIGKILL every process of a session, including what its processes fork meanwhile.

    Killing a whole group is atomic against fork in the kernel, so a fork bomb in the session is
    stopped within a few rounds.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        groups = session_groups(session)
        if not groups:
            return
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        time.sleep(0.01)


def tasks_in_use() -> int:
    """Threads and processes of the sandbox: what a pids limit counts."""
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                count += len(os.listdir(f"/proc/{pid}/task"))
    return count


def pids_limit() -> int | None:
    value = os.environ.get(PIDS_LIMIT_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


class PidsWatchdog(threading.Thread):
    """Calls `on_exhausted` when the sandbox has stayed at its process limit for a second.

    The limit itself is enforced outside (the container's pids cgroup, or the local provider's
    cgroup or rlimit); this only makes the sandbox usable again afterwards. At the limit nothing new
    can start, not even the call that would clean up, so this thread, started beforehand, does it.
    """

    def __init__(self, limit: int, on_exhausted: Callable[[], None], *, interval_s: float = 0.25):
        super().__init__(name="pids-watchdog", daemon=True)
        self.limit = limit
        self.on_exhausted = on_exhausted
        self.interval_s = interval_s

    def run(self) -> None:
        threshold = max(1, self.limit - 4)
        strikes = 0
        while True:
            time.sleep(self.interval_s)
            strikes = strikes + 1 if tasks_in_use() >= threshold else 0
            if strikes * self.interval_s >= 1.0:
                strikes = 0
                self.on_exhausted()
