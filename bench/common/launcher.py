"""The system a benchmark runs against, started in the order it needs and torn down in reverse.

    with Launcher("ttft") as system:
        system.model(ttft_ms=300, tps=50)          # before Django: its settings read the model's URL
        system.start_services(max_connections=600)  # PostgreSQL and Redis, Django set up and migrated
        url = system.processes.daphne()
        system.processes.worker("worker-0", pool="threads", concurrency=25)

On the way out: the child processes stop (newest first), then what the benchmark added with
`system.callback(...)`, then Django's connections, Redis, PostgreSQL and the scratch folder (copied to
`logs` first when given).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from bench.common import ROOT
from bench.common.machine import cpu_seconds_by_part
from bench.common.processes import Failed, Processes, free_port
from bench.common.results import say


@contextlib.contextmanager
def local_postgres(folder: Path, *, max_connections: int = 100, settings: str = "") -> Iterator[str]:
    """A private cluster like scripts/test-services.sh starts, but with PostgreSQL's default durability;
    `settings` adds server options (e.g. "-c shared_buffers=256MB")."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not bins or not (bins[-1] / "initdb").exists():
        raise SystemExit("bench: PostgreSQL server binaries not found (apt-get install postgresql)")
    pgbin = bins[-1]
    runas = []
    if os.getuid() == 0:
        shutil.chown(folder, "postgres")
        runas = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    # --no-sync only skips flushing initdb's own files; the server below runs with fsync on.
    subprocess.run(
        [*runas, pgbin / "initdb", "-D", folder / "pg", "-U", "postgres", "-A", "trust", "--no-sync"],
        check=True,
        capture_output=True,
    )
    options = (
        f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections={max_connections} "
        f"-c fsync=on -c synchronous_commit=on -c full_page_writes=on {settings}"
    ).strip()
    start = [pgbin / "pg_ctl", "-D", folder / "pg", "-l", folder / "pg.log", "-w", "-t", "60", "-o", options]
    subprocess.run([*runas, *start, "start"], check=True, stdout=subprocess.DEVNULL)
    try:
        createdb = [pgbin / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "workbench"]
        subprocess.run([*runas, *createdb], check=True)
        yield f"postgres://postgres@127.0.0.1:{port}/workbench"
    finally:
        subprocess.run(
            [*runas, pgbin / "pg_ctl", "-D", folder / "pg", "-m", "fast", "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


@contextlib.contextmanager
def local_redis(folder: Path) -> Iterator[str]:
    """A private Redis without persistence (as `make run` starts it); its pid is in `folder`/redis.pid."""
    port = free_port()
    start_redis(folder, port)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((folder / "redis.pid").read_text()), signal.SIGTERM)


def start_redis(folder: Path, port: int) -> int:
    """redis-server on 127.0.0.1:`port`, without persistence, once it answers; its pid."""
    pidfile = folder / "redis.pid"
    pidfile.unlink(missing_ok=True)
    options = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    options += ["--daemonize", "yes", "--pidfile", str(pidfile), "--logfile", str(folder / "redis.log")]
    subprocess.run(["redis-server", *options, "--dir", str(folder)], check=True)
    for _ in range(100):
        if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    return int(pidfile.read_text())


def service_arguments(parser: argparse.ArgumentParser) -> None:
    """--database-url and --redis-url: a benchmark's own PostgreSQL and Redis unless given."""
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL"),
        help="use this PostgreSQL database instead of starting one (env BENCH_DATABASE_URL)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("BENCH_REDIS_URL"),
        help="use this Redis instead of starting one (env BENCH_REDIS_URL)",
    )


def setup_django(database_url: str, redis_url: str) -> None:
    """Django in this process (a writer process of bench/log calls it too), against these services."""
    os.environ.update(
        DATABASE_URL=database_url, REDIS_URL=redis_url, DJANGO_SETTINGS_MODULE="workbench.settings"
    )
    import django

    django.setup()


def close_connections() -> None:
    from django.db import connections

    connections.close_all()


class Launcher:
    """The system of one benchmark run (see the module's docstring)."""

    def __init__(
        self,
        name: str,
        *,
        database_url: str | None = None,
        redis_url: str | None = None,
        logs: Path | None = None,
    ) -> None:
        self.name = name
        self.database_url, self.redis_url = database_url, redis_url
        self.logs = logs
        self.stack = contextlib.ExitStack()
        # What every child process gets over this process's environment (which setup_django fills in).
        self.env: dict[str, str] = {
            "DJANGO_SETTINGS_MODULE": "workbench.settings",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            # The servers refuse the public development key outside the test suite (workbench/secret_key.py).
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
        }
        self.model_url = ""
        self.postmaster: int | None = None
        self.redis: int | None = None

    def __enter__(self) -> Self:
        self.stack.__enter__()
        self.folder = Path(tempfile.mkdtemp(prefix=f"workbench-bench-{self.name}."))
        self.folder.chmod(0o755)  # PostgreSQL's own user works in a folder under it
        self.callback(shutil.rmtree, self.folder, True)
        if self.logs is not None:
            ignore = shutil.ignore_patterns("pg", "git")
            self.callback(shutil.copytree, self.folder, self.logs, dirs_exist_ok=True, ignore=ignore)
        self.processes = Processes(self.folder, self.env)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self.processes.stop()
        finally:
            self.stack.__exit__(kind, error, trace)

    def callback(self, function: Any, *args: Any, **kwargs: Any) -> None:
        """Call this on the way out, after the processes have stopped and before the services do."""
        self.stack.callback(function, *args, **kwargs)

    def model(self, *, ttft_ms: float = 0, tps: float = 0, command: list[str] | None = None) -> str:
        """The offline model in its own process (or `command`: a server of the benchmark's that speaks as it
        does and prints its URL); the brains here and in the children are pointed at it."""
        if command is None:
            self.model_url = self.processes.offline_model(ttft_ms=ttft_ms, tps=tps)
        else:
            self.model_url = self.processes.serve("model", command)
        self.env.update(ANTHROPIC_BASE_URL=self.model_url, ANTHROPIC_API_KEY="")
        os.environ.update(ANTHROPIC_BASE_URL=self.model_url, ANTHROPIC_API_KEY="")
        return self.model_url

    def start_services(self, *, max_connections: int = 100, settings: str = "") -> None:
        """PostgreSQL (default durability) and Redis of the benchmark's own unless given; Django set up in
        this process against them, its log quiet below WARNING, and the database migrated."""
        if not self.database_url:
            say(f"starting PostgreSQL (default durability) in {self.folder}")
            (self.folder / "pg").mkdir()
            (self.folder / "pg").chmod(0o755)
            self.database_url = self.stack.enter_context(
                local_postgres(self.folder / "pg", max_connections=max_connections, settings=settings)
            )
            self.postmaster = int((self.folder / "pg" / "pg" / "postmaster.pid").read_text().split()[0])
        if not self.redis_url:
            say("starting Redis")
            self.redis_url = self.stack.enter_context(local_redis(self.folder))
            self.redis = int((self.folder / "redis.pid").read_text())
        self.env.update(DATABASE_URL=self.database_url, REDIS_URL=self.redis_url)
        setup_django(self.database_url, self.redis_url)
        self.callback(close_connections)
        # A line per HTTP request (the SDK's, a health check's) would drown the progress.
        logging.getLogger().setLevel(logging.WARNING)
        from django.core.management import call_command
        from django.db import connection

        if connection.vendor != "postgresql":
            raise Failed(f"bench/{self.name}: needs PostgreSQL, not {connection.vendor}")
        call_command("migrate", verbosity=0)

    def restart_redis(self) -> float:
        """SIGKILL the benchmark's own Redis and start it again on its port: everything it held (queued tasks,
        channel subscriptions) is gone, as after a crash of `make run`'s Redis. The wall-clock time of the kill."""
        if self.redis is None or not self.redis_url:
            raise Failed(f"bench/{self.name}: restarts only a Redis of its own")
        at = time.time()
        os.kill(self.redis, signal.SIGKILL)
        while _alive(self.redis):
            time.sleep(0.01)
        self.redis = start_redis(self.folder, int(self.redis_url.rsplit(":", 1)[1].split("/")[0]))
        return at

    def restart_postgres(self) -> float:
        """SIGKILL the benchmark's own postmaster, then start it again (crash recovery replays the WAL): every
        connection breaks and nothing committed is lost. The wall-clock time of the kill."""
        if self.postmaster is None:
            raise Failed(f"bench/{self.name}: restarts only a PostgreSQL of its own")
        cluster = self.folder / "pg" / "pg"
        options = _server_options((cluster / "postmaster.opts").read_text())
        at = time.time()
        os.kill(self.postmaster, signal.SIGKILL)
        while _alive(self.postmaster):
            time.sleep(0.01)
        # Its backends notice the postmaster is gone and exit; the new one refuses to start while they live.
        pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]
        runas = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        start: list[str | Path] = [
            pgbin / "pg_ctl",
            "-D",
            cluster,
            "-l",
            self.folder / "pg" / "pg.log",
            "-w",
            "-t",
            "60",
        ]
        for _ in range(100):
            started = subprocess.run([*runas, *start, "-o", options, "start"], capture_output=True, text=True)
            if started.returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise Failed(f"bench/{self.name}: PostgreSQL did not start again: {started.stderr[-2000:]}")
        self.postmaster = int((cluster / "postmaster.pid").read_text().split()[0])
        return at

    def cpu_seconds(self, parts: dict[str, str]) -> dict[str, float]:
        """CPU seconds so far of this system by part: `parts` maps a label to the name prefix of the processes
        it counts (with all they forked); PostgreSQL and Redis when they are the benchmark's own."""
        groups = {label: self.processes.pids(prefix) for label, prefix in parts.items()}
        singles = {"redis": self.redis} if self.redis else {}
        return cpu_seconds_by_part(groups, singles, self.postmaster)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # a child of ours (none of these are) would stay a zombie
    return True


def _server_options(opts: str) -> str:
    """The options the postmaster was started with, from its postmaster.opts (the binary, then each argument
    quoted), without its data folder, which pg_ctl gives."""
    import shlex

    words = shlex.split(opts)[1:]
    if "-D" in words:
        at = words.index("-D")
        del words[at : at + 2]
    return " ".join(shlex.quote(w) for w in words)
