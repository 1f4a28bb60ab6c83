"""A benchmark's child processes: each in its own process group, with its output in a log of its own, and
stopped in reverse order of starting."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from bench.common import ROOT


class Failed(SystemExit):
    """The run cannot go on (a process exited, a wait ran out): ends the benchmark with this message, after
    its teardown, unless a caller expects it and catches it."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    processes: Processes | None = None,
    *,
    every: float = 0.1,
) -> Any:
    """The first true value of `condition`, polled every `every` seconds; checks that `processes` still run."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if processes is not None:
            processes.check()
        if time.monotonic() > deadline:
            raise Failed(f"bench: timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return value


class Processes:
    """Started with this process's environment, `env` over it, and the command's own `env` over that."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.env = env if env is not None else {}
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(
        self,
        name: str,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        path = log or self.folder / f"{name}.log"
        with open(path, "ab") as out:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env={**os.environ, **self.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started[name], self.logs[name] = process, path
        return process

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def check(self) -> None:
        for name, process in self.started.items():
            if process.poll() is not None:
                raise Failed(f"bench: {name} exited with {process.returncode}:\n{self.log(name)[-3000:]}")

    def pids(self, prefix: str) -> list[int]:
        """The running processes whose names start with `prefix` (each the leader of its process group)."""
        return [p.pid for name, p in self.started.items() if name.startswith(prefix) and p.poll() is None]

    def ready(self, name: str) -> bool:
        """A Celery worker has said it consumes tasks (its log level INFO or lower)."""
        self.check()
        return " ready." in self.log(name)

    def kill(self, name: str) -> float:
        """SIGKILL the process and all it forked, so nothing of it acks or requeues; the wall-clock time of it."""
        process = self.started.pop(name)
        at = time.time()
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return at

    def stop(self) -> None:
        """SIGTERM every process group, newest first; SIGKILL what is left after ten seconds."""
        running = list(reversed(self.started.values()))
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.started.clear()

    # -- what the benchmarks start

    def daphne(
        self,
        name: str = "daphne",
        *,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        log: Path | None = None,
        timeout: float = 60,
        port: int | None = None,
    ) -> str:
        """Daphne serving `workbench.asgi` of the checkout `cwd` (Daphne imports from its cwd first) on a free
        loopback port (or `port`: one an earlier Daphne let go); its URL once /healthz answers."""
        import httpx

        url = f"http://127.0.0.1:{port or free_port()}"
        command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", url.rsplit(":", 1)[1]]
        self.start(name, [*command, "workbench.asgi:application"], env=env, cwd=cwd, log=log)

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            return False

        wait_until(healthy, timeout, name, self)
        return url

    def worker(
        self,
        name: str,
        *,
        pool: str,
        concurrency: int,
        loglevel: str = "WARNING",
        hostname: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        ready_within: float | None = None,
    ) -> subprocess.Popen[bytes]:
        """A Celery worker of the checkout `cwd`; with `ready_within`, returned once it consumes tasks."""
        command = [sys.executable, "-m", "celery", "-A", "workbench", "worker", "--pool", pool]
        command += ["--concurrency", str(concurrency), *(["--hostname", hostname] if hostname else [])]
        command += ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", loglevel]
        process = self.start(name, command, env=env, cwd=cwd)
        if ready_within is not None:
            wait_until(lambda: self.ready(name), ready_within, f"the Celery worker {name}")
        return process

    def beat(
        self, name: str = "beat", *, loglevel: str = "WARNING", max_interval: float | None = None
    ) -> subprocess.Popen[bytes]:
        """Celery beat: the sweeper, the reaper and pool maintenance, on the schedules the settings give."""
        command = [sys.executable, "-m", "celery", "-A", "workbench", "beat", "-s", str(self.folder / name)]
        if max_interval is not None:
            command += ["--max-interval", f"{max_interval:g}"]
        return self.start(name, [*command, "-l", loglevel])

    def serve(self, name: str, command: list[str], *, timeout: float = 30) -> str:
        """Start a server that prints the URL it listens on; that URL."""
        self.start(name, command)
        found = wait_until(lambda: re.search(r"(http://\S+)\n", self.log(name)), timeout, name, self)
        return found.group(1)

    def offline_model(self, *, ttft_ms: float = 0, tps: float = 0, name: str = "model") -> str:
        """The offline model (`python -m offline_model`) with a fixed time to first token and streaming rate."""
        command = [sys.executable, "-m", "offline_model", "--port", "0"]
        return self.serve(name, [*command, "--ttft-ms", f"{ttft_ms:g}", "--tps", f"{tps:g}"])


@contextlib.contextmanager
def daphne(
    env: dict[str, str], log_path: Path, *, append_log: bool = False, timeout: float = 60, cwd: Path = ROOT
) -> Iterator[str]:
    """Daphne alone with `env` (a test's live server): its URL, until the block ends."""
    if not append_log:
        log_path.unlink(missing_ok=True)
    with Processes(log_path.parent) as processes:
        yield processes.daphne(env=env, cwd=cwd, log=log_path, timeout=timeout)
