"""The session log's benchmark: append throughput and slice reads.

Appends: `emit_event` from 1 writer, 8 writers on 8 sessions and 8 writers on one session, each case run
back to back with a raw psycopg loop sending the same SQL per event (the one statement `APPEND` that
`emit_event` sends, in autocommit), alternating sides over a few rounds so machine noise hits both. Writers are separate
processes. The broadcast hint stays on, through Redis, because that is the real path.

Reads: the time of `get_events(session, start, start + 100)` at random starts and of `get_events(session,
-100)` in sessions of 10^3, 10^5 and 10^6 events, bulk-loaded by SQL.

Usage: .venv/bin/python -m bench.log [--quick] [--database-url URL] [--redis-url URL]

Without a database URL (or BENCH_DATABASE_URL) it starts its own PostgreSQL cluster with default durability
(fsync, synchronous_commit and full_page_writes on) and its own Redis, on free loopback ports in a temporary
folder, and removes both at the end. With one, the benchmark's sessions stay in that database (events are
append-only). It prints a table, writes bench/results/log.json and log.png (log-quick.* with --quick), and
exits 0 whether or not the targets are met.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so that `python bench/log.py` works as well as `python -m bench.log`
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"

RATIO_TARGET = 0.60
SLICE_P50_TARGET_MS = 5.0
# "Flat": the p50 at the largest session is within 1.5x, or 1 ms, of the p50 at the smallest.
FLAT_FACTOR, FLAT_SLACK_MS = 1.5, 1.0
SLICE = 100

# What every benchmark append writes: an agent message of a realistic size.
EVENT = {
    "type": "agent.message",
    "content": [
        {
            "type": "text",
            "text": "The tests pass now; the flaky one waited on a socket it never "
            "opened. I changed the fixture to bind before it forks and ran the suite three times.",
        }
    ],
}


@dataclass(frozen=True)
class Plan:
    duration: float  # seconds of appending per run
    rounds: int  # raw/emit pairs per case
    sizes: tuple[int, ...]  # events per session for the slice reads
    reads: int  # timed reads per size and kind
    writers: int = 8


DEFAULT = Plan(duration=6.0, rounds=4, sizes=(10**3, 10**5, 10**6), reads=300)
QUICK = Plan(duration=1.0, rounds=2, sizes=(10**3, 10**4, 10**5), reads=50)


@dataclass
class AppendCase:
    name: str
    writers: int
    sessions: int
    raw_rates: list[float] = field(default_factory=list)
    emit_rates: list[float] = field(default_factory=list)
    emit_drain_s: list[float] = field(default_factory=list)
    # CPU the writer processes spent per event (with the broadcast thread): steadier than rates on a busy host.
    raw_cpu_us: list[float] = field(default_factory=list)
    emit_cpu_us: list[float] = field(default_factory=list)

    @property
    def raw(self) -> float:
        return statistics.median(self.raw_rates)

    @property
    def emit(self) -> float:
        return statistics.median(self.emit_rates)

    @property
    def ratio(self) -> float:
        return self.emit / self.raw

    @property
    def met(self) -> bool:
        return self.ratio >= RATIO_TARGET


@dataclass
class SliceResult:
    size: int
    kind: str  # "random" ([s:s+100] at random s) or "tail" ([-100:])
    reads: int
    p50_ms: float
    p95_ms: float

    @property
    def met(self) -> bool:
        return self.p50_ms <= SLICE_P50_TARGET_MS


def say(*parts: Any) -> None:
    print(*parts, flush=True)


# --- Services -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    subprocess.run(
        [
            *runas,
            pgbin / "pg_ctl",
            "-D",
            folder / "pg",
            "-l",
            folder / "pg.log",
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        subprocess.run(
            [*runas, pgbin / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "workbench"],
            check=True,
        )
        yield f"postgres://postgres@127.0.0.1:{port}/workbench"
    finally:
        subprocess.run(
            [*runas, pgbin / "pg_ctl", "-D", folder / "pg", "-m", "fast", "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


@contextlib.contextmanager
def local_redis(folder: Path) -> Iterator[str]:
    port = free_port()
    pidfile = folder / "redis.pid"
    subprocess.run(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--pidfile",
            pidfile,
            "--logfile",
            folder / "redis.log",
            "--dir",
            folder,
        ],
        check=True,
    )
    try:
        for _ in range(50):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)


@contextlib.contextmanager
def services(database_url: str | None, redis_url: str | None) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        folder: Path | None = None
        if not (database_url and redis_url):
            folder = Path(tempfile.mkdtemp(prefix="workbench-bench-log."))
            folder.chmod(0o755)
            stack.callback(shutil.rmtree, folder, True)
        if not database_url:
            assert folder is not None
            say(f"starting PostgreSQL (default durability) and Redis in {folder}")
            database_url = stack.enter_context(local_postgres(folder))
        if not redis_url:
            assert folder is not None
            redis_url = stack.enter_context(local_redis(folder))
        yield database_url, redis_url


@contextlib.contextmanager
def daphne(
    env: dict[str, str], log_path: Path, *, append_log: bool = False, timeout: float = 60, cwd: Path = ROOT
) -> Iterator[str]:
    """Daphne serving `workbench.asgi` of the checkout `cwd` (Daphne imports from its cwd first) on a free
    loopback port with `env`; its URL once /healthz answers."""
    import httpx

    url = f"http://127.0.0.1:{free_port()}"
    with open(log_path, "ab" if append_log else "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                url.rsplit(":", 1)[1],
                "workbench.asgi:application",
            ],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Daphne did not start; see {log_path}")
                time.sleep(0.1)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


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


def save_figure(figure: Any, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def setup_django(database_url: str, redis_url: str) -> None:
    os.environ.update(
        DATABASE_URL=database_url, REDIS_URL=redis_url, DJANGO_SETTINGS_MODULE="workbench.settings"
    )
    import django

    django.setup()


# --- Appends --------------------------------------------------------------------------------------------


def new_session() -> str:
    from harness.agents import agent_create
    from sandboxes.environments import environment_create
    from sessions.services.lifecycle import session_create

    agent = agent_create({"name": "bench", "model": "claude-sonnet-5-5"}).agent_id
    environment = environment_create({"name": f"bench {agent}"}).id  # names are unique
    return session_create({"agent": agent, "environment_id": environment}).id


def _raw_append(conn: Any, session_id: str) -> None:
    """One append as the SQL alone, on psycopg as it comes (bound server-side, prepared after a few runs)."""
    from psycopg.types.json import Jsonb

    from sessions.services.log import APPEND
    from workbench.ids import new_id

    body = dict(EVENT)
    event_type = body.pop("type")
    conn.execute(
        APPEND,
        {
            "session": session_id,
            "count": 1,
            "now": datetime.now(UTC),
            "epoch": None,
            "open_only": False,
            "status": None,
            "uids": [new_id("sevt")],
            "types": [event_type],
            "payloads": [Jsonb(body)],
            "event_keys": [None],
        },
    ).fetchone()


def _broadcast_drained() -> None:
    from sessions import broadcast

    while broadcast._instance is not None and not broadcast._instance._queue.empty():
        time.sleep(0.001)


def _writer(pipe: Connection, database_url: str, redis_url: str, warmup_session: str) -> None:
    """A writer process: set up once, then run timed append runs on command until told to stop."""
    setup_django(database_url, redis_url)
    import psycopg

    from sessions.services import emit_event

    raw = psycopg.connect(database_url, autocommit=True)
    for _ in range(20):
        _raw_append(raw, warmup_session)
        emit_event(warmup_session, EVENT)
    _broadcast_drained()
    pipe.send("ready")
    while (command := pipe.recv()) is not None:
        mode, session_id, start_at, duration = command
        append = (
            partial(_raw_append, raw, session_id) if mode == "raw" else partial(emit_event, session_id, EVENT)
        )
        time.sleep(max(0.0, start_at - time.monotonic()))
        deadline = start_at + duration
        count = 0
        cpu_began = time.process_time()
        while time.monotonic() < deadline:
            append()
            count += 1
        appended_at = time.monotonic()
        if mode == "emit":
            _broadcast_drained()  # a hint still queued is work this run owes
        pipe.send((count, time.monotonic(), time.monotonic() - appended_at, time.process_time() - cpu_began))
    raw.close()


class Writers:
    """A pool of writer processes, started once and shared by every case."""

    def __init__(self, count: int, database_url: str, redis_url: str, warmup_session: str):
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.processes = []
        for _ in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_writer, args=(theirs, database_url, redis_url, warmup_session), daemon=True
            )
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)
        for pipe in self.pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a writer failed to start")

    def run(self, mode: str, session_ids: list[str], duration: float) -> tuple[float, float, float]:
        """Events per second over all writers (writer i appends to session_ids[i]), the longest broadcast
        drain in seconds, and the writers' CPU per event in microseconds."""
        start_at = time.monotonic() + 0.25
        for pipe, session_id in zip(self.pipes, session_ids, strict=False):
            pipe.send((mode, session_id, start_at, duration))
        results = [pipe.recv() for pipe in self.pipes[: len(session_ids)]]
        total = sum(result[0] for result in results)
        elapsed = max(result[1] for result in results) - start_at
        cpu_us = sum(result[3] for result in results) / total * 1e6
        return total / elapsed, max(result[2] for result in results), cpu_us

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()


def measure_appends(plan: Plan, database_url: str, redis_url: str) -> list[AppendCase]:
    from django.db import connections

    cases = [
        AppendCase("1 writer, 1 session", 1, 1),
        AppendCase(f"{plan.writers} writers, {plan.writers} sessions", plan.writers, plan.writers),
        AppendCase(f"{plan.writers} writers, 1 session", plan.writers, 1),
    ]
    sessions = {case.name: [new_session() for _ in range(case.sessions)] for case in cases}
    warmup = new_session()
    connections.close_all()
    say(f"starting {plan.writers} writer processes")
    writers = Writers(plan.writers, database_url, redis_url, warmup)
    try:
        for case in cases:
            targets = [sessions[case.name][i % case.sessions] for i in range(case.writers)]
            for round_ in range(plan.rounds):
                # Alternate which side goes first, so a drift over the case hits both sides alike.
                for mode in ("raw", "emit") if round_ % 2 == 0 else ("emit", "raw"):
                    rate, drain, cpu_us = writers.run(mode, targets, plan.duration)
                    if mode == "raw":
                        case.raw_rates.append(rate)
                        case.raw_cpu_us.append(cpu_us)
                    else:
                        case.emit_rates.append(rate)
                        case.emit_drain_s.append(drain)
                        case.emit_cpu_us.append(cpu_us)
                    say(
                        f"  {case.name:<24} round {round_ + 1}/{plan.rounds} {mode:<4} {rate:8,.0f} events/s "
                        f"{cpu_us:6,.0f} us CPU/event"
                    )
    finally:
        writers.close()
    return cases


# --- Slice reads ----------------------------------------------------------------------------------------


def populate(session_id: str, size: int, *, chunk: int = 100_000) -> float:
    """Append `size` events to an empty session by bulk SQL, with consecutive seqs; returns the seconds taken."""
    from django.db import connection

    from workbench.ids import new_id

    uid_prefix = new_id("sevt")[:21]  # unique per session; the seq makes each uid unique within it
    payload = json.dumps({key: value for key, value in EVENT.items() if key != "type"})
    started = time.monotonic()
    for lo in range(0, size, chunk):
        hi = min(size, lo + chunk)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO agent_sessions_event (uid, session_id, seq, type, payload, processed_at, "
                "idempotency_key, lease_epoch) SELECT %s || lpad(g::text, 8, '0'), %s, g, %s, %s::jsonb, "
                "now(), NULL, NULL FROM generate_series(%s, %s) AS g",
                [uid_prefix, session_id, EVENT["type"], payload, lo, hi - 1],
            )
            cursor.execute("UPDATE agent_sessions_session SET next_seq = %s WHERE id = %s", [hi, session_id])
        if size > chunk:
            say(f"  populate {size:>9,}: {hi:>9,} events ({time.monotonic() - started:5.1f} s)")
    return time.monotonic() - started


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def time_reads(sessions: dict[int, str], reads: int) -> list[SliceResult]:
    """Time `reads` slice reads of each kind in each session, taking turns so noise hits every size alike."""
    from sessions.selectors import get_events

    rng = random.Random(0)

    def bounds(size: int, kind: str) -> tuple[int, int | None]:
        if kind == "tail":
            return -SLICE, None
        start = rng.randrange(0, size - SLICE + 1)
        return start, start + SLICE

    turns = [(size, kind) for size in sessions for kind in ("random", "tail")]
    timings: dict[tuple[int, str], list[float]] = {turn: [] for turn in turns}
    for round_ in range(20 + reads):
        for size, kind in turns:
            start, stop = bounds(size, kind)
            began = time.perf_counter()
            events = get_events(sessions[size], start, stop)
            elapsed = (time.perf_counter() - began) * 1000
            assert len(events) == SLICE, (size, kind, start, len(events))
            if round_ >= 20:  # the first rounds warm the caches and the connection
                timings[size, kind].append(elapsed)
    return [
        SliceResult(size, kind, reads, percentile(t, 0.50), percentile(t, 0.95))
        for (size, kind), t in timings.items()
    ]


def measure_slices(plan: Plan) -> tuple[list[SliceResult], dict[int, float]]:
    from django.db import connection

    loaded: dict[int, str] = {}
    seconds: dict[int, float] = {}
    for size in plan.sizes:
        say(f"populating a session of {size:,} events")
        loaded[size] = new_session()
        seconds[size] = populate(loaded[size], size)
    # What autovacuum would have done by the time anyone reads these sessions, and no checkpoint left
    # running from the bulk load under the timed reads.
    say("vacuuming, analysing and checkpointing")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) agent_sessions_event")
        cursor.execute("ANALYZE agent_sessions_session")
        cursor.execute("CHECKPOINT")
    say(f"timing {plan.reads} reads of each kind in each session")
    return time_reads(loaded, plan.reads), seconds


def flatness(slices: list[SliceResult]) -> dict[str, Any]:
    random_reads = sorted((r for r in slices if r.kind == "random"), key=lambda r: r.size)
    smallest, largest = random_reads[0], random_reads[-1]
    limit = max(smallest.p50_ms * FLAT_FACTOR, smallest.p50_ms + FLAT_SLACK_MS)
    return {
        "from": smallest.size,
        "to": largest.size,
        "p50_from_ms": smallest.p50_ms,
        "p50_to_ms": largest.p50_ms,
        "limit_ms": limit,
        "met": largest.p50_ms <= limit,
    }


# --- Report ---------------------------------------------------------------------------------------------


def process_stats() -> Iterator[tuple[int, str, list[str]]]:
    """Every process still there: its pid, its command name and the fields of /proc/<pid>/stat after the name
    (state first; utime and stime are [11:13], with the children's [11:15])."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()


def cpu_pressure_us() -> float | None:
    """Microseconds, since boot, that some runnable task waited for a CPU (Linux PSI), if the kernel says."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return float(Path("/proc/pressure/cpu").read_text().split()[4].split("=")[1])
    return None


def machine_info() -> dict[str, Any]:
    import django
    import psycopg
    from django.db import connection

    with connection.cursor() as cursor:
        settings = {}
        for name in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "shared_buffers",
            "wal_sync_method",
        ):
            cursor.execute(f"SHOW {name}")
            settings[name] = cursor.fetchone()[0]
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gib": round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1),
        "kernel": platform.release(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "postgresql": settings,
    }


def power(size: int) -> str:
    exponent = round(math.log10(size))
    return f"10^{exponent}" if 10**exponent == size else f"{size:,}"


def table(cases: list[AppendCase], slices: list[SliceResult], flat: dict[str, Any]) -> str:
    yes = {True: "met", False: "MISSED"}
    rule = "-" * 100
    lines = [
        f"{'append case':<26}{'emit_event/s':>13}{'raw/s':>9}{'emit/raw':>10}  {'target':<16}{'result':<8}"
        "CPU/event emit, raw",
        rule,
    ]
    for c in cases:
        cpu = f"{statistics.median(c.emit_cpu_us):,.0f}, {statistics.median(c.raw_cpu_us):,.0f} us"
        lines.append(
            f"{c.name:<26}{c.emit:>13,.0f}{c.raw:>9,.0f}{c.ratio:>10.0%}  "
            f"{'>= ' + format(RATIO_TARGET, '.0%') + ' of raw':<16}{yes[c.met]:<8}{cpu}"
        )
    lines += ["", f"{'slice read (100 events)':<38}{'p50 ms':>8}{'p95 ms':>9}  {'target':<16}result", rule]
    for r in slices:
        what = f"[s:s+{SLICE}], random s" if r.kind == "random" else f"[-{SLICE}:]"
        lines.append(
            f"{power(r.size) + ' events ' + what:<38}{r.p50_ms:>8.2f}{r.p95_ms:>9.2f}  "
            f"{'p50 <= ' + format(SLICE_P50_TARGET_MS, 'g') + ' ms':<16}{yes[r.met]}"
        )
    lines.append(
        f"{'flat ' + power(flat['from']) + ' -> ' + power(flat['to']) + ' (random p50)':<38}"
        f"{flat['p50_to_ms']:>8.2f}{'':>9}  {'<= ' + format(flat['limit_ms'], '.2f') + ' ms':<16}"
        f"{yes[flat['met']]}"
    )
    return "\n".join(lines)


def plot(path: Path, cases: list[AppendCase], slices: list[SliceResult], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, curves) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs = range(len(cases))
    width = 0.38
    # Whiskers span the rounds' slowest and fastest runs.
    for offset, rates, label, colour in (
        (-width / 2, [c.emit_rates for c in cases], "emit_event", "#3b6ea8"),
        (width / 2, [c.raw_rates for c in cases], "raw psycopg", "#b0b0b0"),
    ):
        medians = [statistics.median(r) for r in rates]
        spread = [
            [m - min(r) for m, r in zip(medians, rates, strict=True)],
            [max(r) - m for m, r in zip(medians, rates, strict=True)],
        ]
        bars.bar([x + offset for x in xs], medians, width, yerr=spread, capsize=3, label=label, color=colour)
    for x, c in zip(xs, cases, strict=True):
        top = max(c.emit_rates + c.raw_rates)
        bars.annotate(
            f"{c.ratio:.0%} of raw",
            (x, top),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    bars.set_ylim(top=1.12 * max(max(c.emit_rates + c.raw_rates) for c in cases))
    bars.set_xticks(list(xs), [c.name.replace(", ", ",\n") for c in cases])
    bars.set_ylabel("events / s (median of rounds)")
    bars.set_title(f"Appends (target: emit_event >= {RATIO_TARGET:.0%} of raw)")
    bars.legend()
    for kind, colour in (("random", "#3b6ea8"), ("tail", "#d0803a")):
        rows = sorted((r for r in slices if r.kind == kind), key=lambda r: r.size)
        label = f"[s:s+{SLICE}]" if kind == "random" else f"[-{SLICE}:]"
        curves.plot(
            [r.size for r in rows], [r.p50_ms for r in rows], "o-", color=colour, label=f"{label} p50"
        )
        curves.plot(
            [r.size for r in rows], [r.p95_ms for r in rows], "o--", color=colour, label=f"{label} p95"
        )
    curves.axhline(SLICE_P50_TARGET_MS, color="#a33", linewidth=0.8, linestyle=":", label="p50 target")
    curves.set_xscale("log")
    curves.set_ylim(bottom=0)
    curves.set_xlabel("events in the session")
    curves.set_ylabel("ms per get_events call")
    curves.set_title(f"Reading a {SLICE}-event slice")
    curves.legend(fontsize=8)
    save_figure(figure, path, title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: short runs, sessions up to 10^5")
    service_arguments(parser)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else DEFAULT
    began = time.monotonic()

    with services(args.database_url, args.redis_url) as (database_url, redis_url):
        setup_django(database_url, redis_url)
        from django.core.management import call_command
        from django.db import connection, connections

        if connection.vendor != "postgresql":
            raise SystemExit(f"bench/log: needs PostgreSQL, not {connection.vendor}")
        call_command("migrate", verbosity=0)
        machine = machine_info()
        pg = machine["postgresql"]
        say(
            f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, synchronous_commit="
            f"{pg['synchronous_commit']}), {machine['nproc']} CPUs, {machine['memory_gib']} GiB"
        )
        if machine["load_average_at_start"][0] > 0.5:
            say(
                f"note: load average {machine['load_average_at_start'][0]} before starting; other work on this "
                "machine will make the figures noisy"
            )
        say(f"appends: {plan.rounds} rounds of {plan.duration:g} s per side and case")
        cases = measure_appends(plan, database_url, redis_url)
        slices, populate_seconds = measure_slices(plan)
        connections.close_all()
        machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]

    flat = flatness(slices)
    report = table(cases, slices, flat)
    met = sum(c.met for c in cases) + sum(r.met for r in slices) + flat["met"]
    total = len(cases) + len(slices) + 1
    say("")
    say(report)
    say("")
    say(
        f"targets met: {met} of {total}"
        + ("" if met == total else " (a benchmark reports; exit status stays 0)")
    )

    stem = "log-quick" if args.quick else "log"
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "log",
        "quick": args.quick,
        "machine": machine,
        "plan": asdict(plan),
        "seconds": round(time.monotonic() - began, 1),
        "appends": [
            {
                "case": c.name,
                "writers": c.writers,
                "sessions": c.sessions,
                "emit_rates": [round(r, 1) for r in c.emit_rates],
                "raw_rates": [round(r, 1) for r in c.raw_rates],
                "emit_median": round(c.emit, 1),
                "raw_median": round(c.raw, 1),
                "ratio": round(c.ratio, 3),
                "emit_broadcast_drain_s": [round(d, 3) for d in c.emit_drain_s],
                "emit_writer_cpu_us_per_event": [round(u) for u in c.emit_cpu_us],
                "raw_writer_cpu_us_per_event": [round(u) for u in c.raw_cpu_us],
                "target": f"ratio >= {RATIO_TARGET}",
                "met": c.met,
            }
            for c in cases
        ],
        "slices": [
            {
                **asdict(r),
                "p50_ms": round(r.p50_ms, 3),
                "p95_ms": round(r.p95_ms, 3),
                "target": f"p50 <= {SLICE_P50_TARGET_MS} ms",
                "met": r.met,
            }
            for r in slices
        ],
        "flat": {
            **flat,
            "rule": f"p50 at the largest <= max({FLAT_FACTOR} x, +{FLAT_SLACK_MS} ms) of the smallest",
        },
        "populate_seconds": {str(size): round(s, 1) for size, s in populate_seconds.items()},
        "targets": {"met": met, "total": total},
        "table": report,
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(
        RESULTS / f"{stem}.png",
        cases,
        slices,
        f"bench/log on {machine['nproc']} CPUs, PostgreSQL {pg['server_version']} (fsync on), {machine['date']}",
    )
    say(f"wrote {RESULTS.relative_to(ROOT)}/{stem}.json and {stem}.png ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    # Stop on SIGTERM as on Ctrl-C, so the private PostgreSQL and Redis are stopped and removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
