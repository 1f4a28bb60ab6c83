"""The /v1 request path as a client sees it, through the official SDK, side by side across code versions.

Measured with `anthropic.Anthropic(max_retries=0)` at 1 client and at 20 (threads, each its own SDK client,
released together by a barrier): `agents.create`, `environments.create` (a unique name each), `sessions.create`,
`events.send` of a user.message to a fresh idle session, and a text turn: with `events.stream` open, send
"hello" and time until the first `agent.message` arrives. A Celery worker runs the brains against the offline
model with no time to first token, so every send wakes a real turn; the benchmark waits (untimed) for
`session.status_idle` after each send and turn, so the next sample starts on a quiet machine.

With `--against DIR` (repeatable) the same measurements run against other checkouts of the code: each code
version gets its own Daphne and Celery worker (cwd=DIR, PYTHONPATH=DIR), its own database (migrated by its
own manage.py) and Redis database on the same PostgreSQL and Redis, and the measurements are interleaved
round-robin by batch, so the machine's noise hits every version alike. The table gives p50/p95 per version
and the ratio of p50s (this / other).

Usage: .venv/bin/python -m bench.api [--quick] [--against DIR ...] [--samples N] [--database-url URL]
    [--redis-url URL]

It prints a table, writes bench/results/api.json and api.png (api-quick.* with --quick), and exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/api.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT  # noqa: E402
from bench.common.launcher import Launcher, service_arguments  # noqa: E402
from bench.common.machine import load_average, machine_info  # noqa: E402
from bench.common.processes import Failed  # noqa: E402
from bench.common.results import publish, pyplot, run, save_figure, say, stem  # noqa: E402

MODEL = "claude-sonnet-5-5"
HELLO = {"type": "user.message", "content": [{"type": "text", "text": "hello"}]}
WORKER_THREADS = 8


@dataclass(frozen=True)
class Plan:
    samples: int  # per measurement, client count and code version
    batches: int  # rounds of the round-robin over code versions
    clients: tuple[int, ...] = (1, 20)
    warmup: int = 5  # untimed samples per measurement and version before the first batch


DEFAULT = Plan(samples=200, batches=5)
QUICK = Plan(samples=40, batches=2, warmup=2)


@dataclass
class Version:
    """One checkout of the code under test, with its own Daphne, worker, database and API key."""

    folder: Path
    label: str
    url: str = ""
    key: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)  # "measurement@clients" -> ms


@dataclass
class Client:
    """One client thread's SDK and the agent and environment its sessions use."""

    sdk: Any
    agent: str = ""
    environment: str = ""


# --- Measurements: each returns one sample's milliseconds --------------------------------------------------


def ms_since(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def create_agent(client: Client) -> float:
    began = time.perf_counter()
    client.sdk.beta.agents.create(name="bench", model=MODEL)
    return ms_since(began)


def create_environment(client: Client) -> float:
    name = f"bench {uuid.uuid4().hex[:12]}"  # environment names are unique
    began = time.perf_counter()
    client.sdk.beta.environments.create(name=name, config={"type": "cloud"})
    return ms_since(began)


def create_session(client: Client) -> float:
    began = time.perf_counter()
    client.sdk.beta.sessions.create(agent=client.agent, environment_id=client.environment)
    return ms_since(began)


def send_message(client: Client) -> float:
    """The POST alone; the turn it wakes is then let run to idle, untimed."""
    session = client.sdk.beta.sessions.create(agent=client.agent, environment_id=client.environment).id
    with client.sdk.beta.sessions.events.stream(session) as stream:
        began = time.perf_counter()
        client.sdk.beta.sessions.events.send(session, events=[HELLO])
        took = ms_since(began)
        wait_idle(stream)
    return took


def text_turn(client: Client) -> float:
    """Send "hello" -> the first agent.message on the already open stream."""
    session = client.sdk.beta.sessions.create(agent=client.agent, environment_id=client.environment).id
    with client.sdk.beta.sessions.events.stream(session) as stream:
        began = time.perf_counter()
        client.sdk.beta.sessions.events.send(session, events=[HELLO])
        for event in stream:
            if event.type == "agent.message":
                took = ms_since(began)
                wait_idle(stream)
                return took
    raise RuntimeError("the stream ended before an agent.message")


def wait_idle(stream: Any) -> None:
    for event in stream:
        if event.type == "session.status_idle":
            return
    raise RuntimeError("the stream ended before the session went idle")


MEASUREMENTS: dict[str, Callable[[Client], float]] = {
    "agents.create": create_agent,
    "environments.create": create_environment,
    "sessions.create": create_session,
    "events.send (user.message)": send_message,
    "text turn: send -> first agent.message": text_turn,
}


# --- Running batches -------------------------------------------------------------------------------------


def clients_for(version: Version, count: int) -> list[Client]:
    """`count` SDK clients, each with an agent and environment of its own (made untimed)."""
    import anthropic

    clients = []
    for _ in range(count):
        sdk = anthropic.Anthropic(base_url=version.url, api_key=version.key, max_retries=0, timeout=60)
        agent = sdk.beta.agents.create(name="bench client", model=MODEL).id
        environment = sdk.beta.environments.create(
            name=f"bench client {uuid.uuid4().hex[:12]}", config={"type": "cloud"}
        ).id
        clients.append(Client(sdk, agent, environment))
    return clients


def run_batch(clients: list[Client], measure: Callable[[Client], float], each: int) -> list[float]:
    """Every client takes `each` samples; all start together."""
    barrier = threading.Barrier(len(clients))

    def one(client: Client) -> list[float]:
        barrier.wait()
        return [measure(client) for _ in range(each)]

    with ThreadPoolExecutor(len(clients)) as pool:
        return [ms for part in pool.map(one, clients) for ms in part]


def measure_all(plan: Plan, versions: list[Version]) -> None:
    """Each measurement and client count, in batches that take turns over the versions (first mover rotates)."""
    pools = {(v.label, n): clients_for(v, n) for v in versions for n in plan.clients}
    for name, measure in MEASUREMENTS.items():
        for version in versions:
            run_batch(pools[version.label, 1], measure, plan.warmup)
        for count in plan.clients:
            each = max(1, plan.samples // plan.batches // count)
            for batch in range(plan.batches):
                turn = batch % len(versions)
                for version in versions[turn:] + versions[:turn]:
                    samples = run_batch(pools[version.label, count], measure, each)
                    version.samples.setdefault(f"{name}@{count}", []).extend(samples)
            say(
                f"  {name} at {count} client{'s' if count > 1 else ''}: "
                + ", ".join(f"{v.label} p50 {p50(v.samples[f'{name}@{count}']):.1f} ms" for v in versions)
            )


# --- Code versions: their databases, processes and keys ------------------------------------------------


def label_of(folder: Path) -> str:
    head = (
        subprocess.run(
            ["git", "-C", folder, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or folder.name
    )
    dirty = subprocess.run(
        ["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    return head + ("+changes" if dirty else "")


def database_for(database_url: str, index: int) -> str:
    """The first version uses `database_url`; the others a database of their own beside it."""
    if index == 0:
        return database_url
    import psycopg

    base, name = database_url.rsplit("/", 1)
    other = f"{name}_against_{index}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{other}"')
        conn.execute(f'CREATE DATABASE "{other}"')
    return f"{base}/{other}"


def redis_for(redis_url: str, index: int) -> str:
    """A Redis database per version, so no worker takes another version's tasks."""
    base, number = redis_url.rsplit("/", 1)
    return f"{base}/{int(number or 0) + index}"


def manage(folder: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=folder, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise Failed(f"bench/api: manage.py {' '.join(args)} failed in {folder}:\n{done.stderr[-2000:]}")
    return done.stdout


def start_version(system: Launcher, version: Version, index: int) -> None:
    """The version's database (migrated by its own manage.py), API key, Celery worker and Daphne, all
    running its code (cwd and PYTHONPATH its folder)."""
    assert system.database_url and system.redis_url
    env = {
        "DATABASE_URL": database_for(system.database_url, index),
        "REDIS_URL": redis_for(system.redis_url, index),
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(version.folder),
        "WORKBENCH_DEPLOYMENT": f"bench-api-{os.getpid()}",
    }
    full = {**os.environ, **system.env, **env}
    manage(version.folder, full, "migrate", "--verbosity", "0")
    version.key = manage(version.folder, full, "createapikey", "--name", "bench-api").strip().splitlines()[-1]
    system.processes.worker(
        f"worker-{index}",
        pool="threads",
        concurrency=WORKER_THREADS,
        loglevel="INFO",
        env=env,
        cwd=version.folder,
        ready_within=90,
    )
    version.url = system.processes.daphne(f"daphne-{index}", env=env, cwd=version.folder)
    say(f"{version.label}: Daphne at {version.url}, worker x {WORKER_THREADS} threads ({version.folder})")


# --- Results -------------------------------------------------------------------------------------------
# The api's figures since its first run: the interpolated median, and the p95 at the nearest rank of
# (n - 1) x 0.95; kept, so that its runs stay comparable.


def p50(values: list[float]) -> float:
    return statistics.median(values)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def rows_of(plan: Plan, versions: list[Version]) -> list[dict[str, Any]]:
    rows = []
    for name in MEASUREMENTS:
        for count in plan.clients:
            key = f"{name}@{count}"
            row: dict[str, Any] = {"measurement": name, "clients": count, "versions": {}}
            for v in versions:
                row["versions"][v.label] = {
                    "n": len(v.samples[key]),
                    "p50_ms": round(p50(v.samples[key]), 2),
                    "p95_ms": round(p95(v.samples[key]), 2),
                }
            this = row["versions"][versions[0].label]["p50_ms"]
            row["ratio_p50"] = {
                v.label: round(this / row["versions"][v.label]["p50_ms"], 3) for v in versions[1:]
            }
            rows.append(row)
    return rows


def plot(path: Path, plan: Plan, rows: list[dict[str, Any]], labels: list[str], title: str) -> None:
    """Per client count: a group per measurement, a bar per version (p50 dark, p95 light behind it)."""
    plt = pyplot()
    colours = ["#3b6ea8", "#d0803a", "#5a9a5a", "#8a5aa8"]
    figure, axes = plt.subplots(len(plan.clients), 1, figsize=(12, 4.2 * len(plan.clients)), squeeze=False)
    width = 0.8 / len(labels)
    for axis, count in zip(axes[:, 0], plan.clients, strict=True):
        mine = [r for r in rows if r["clients"] == count]
        for i, label in enumerate(labels):
            xs = [x - 0.4 + width * (i + 0.5) for x in range(len(mine))]
            colour = colours[i % len(colours)]
            p95s = [r["versions"][label]["p95_ms"] for r in mine]
            p50s = [r["versions"][label]["p50_ms"] for r in mine]
            axis.bar(xs, p95s, width * 0.9, color=colour, alpha=0.35, label=f"{label} p95")
            axis.bar(xs, p50s, width * 0.9, color=colour, label=f"{label} p50")
            for x, value in zip(xs, p50s, strict=True):
                axis.annotate(
                    f"{value:.0f}",
                    (x, value),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        axis.set_xticks(range(len(mine)), [r["measurement"].replace(": ", ":\n") for r in mine], fontsize=8)
        axis.set_ylabel("ms per request (client side)")
        axis.set_title(f"{count} client{'s' if count > 1 else ''} at once")
        axis.legend(fontsize=7, ncol=len(labels))
    save_figure(figure, path, title)


# --- Main ----------------------------------------------------------------------------------------------


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK.samples} samples each")
    parser.add_argument(
        "--samples", type=int, help=f"samples per measurement and client count (default {DEFAULT.samples})"
    )
    parser.add_argument(
        "--against",
        type=Path,
        nargs="+",
        action="extend",
        default=[],
        metavar="DIR",
        help="another checkout of the code to measure side by side (repeatable)",
    )
    parser.add_argument("--logs", type=Path, help="keep the Daphne and worker logs in this folder")
    parser.add_argument("--note", default="", help="a remark saved with the results")
    service_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    plan = QUICK if args.quick else DEFAULT
    if args.samples:
        plan = Plan(samples=args.samples, batches=plan.batches, clients=plan.clients, warmup=plan.warmup)
    versions = [Version(ROOT, "this " + label_of(ROOT))]
    versions += [Version(d.resolve(), label_of(d.resolve())) for d in args.against]
    began = time.monotonic()

    with Launcher("api", database_url=args.database_url, redis_url=args.redis_url, logs=args.logs) as system:
        system.model(ttft_ms=0)
        system.start_services()
        for index, version in enumerate(versions):
            start_version(system, version, index)
        machine = machine_info()
        say(
            f"{plan.samples} samples per measurement at {', '.join(map(str, plan.clients))} clients, "
            f"{plan.batches} batches round-robin over {len(versions)} code version(s); offline model TTFT 0 ms"
        )
        measure_all(plan, versions)
        machine["load_average_at_end"] = load_average()

    labels = [v.label for v in versions]
    rows = rows_of(plan, versions)
    result = {
        "benchmark": "api",
        "quick": args.quick,
        "note": args.note,
        "machine": machine,
        "plan": asdict(plan),
        "seconds": round(time.monotonic() - began, 1),
        "versions": [{"label": v.label, "folder": str(v.folder)} for v in versions],
        "model_ttft_ms": 0,
        "worker_threads": WORKER_THREADS,
        "rows": rows,
        "samples": {v.label: {k: [round(x, 3) for x in s] for k, s in v.samples.items()} for v in versions},
    }
    title = (
        f"bench/api through the official SDK on {machine['nproc']} CPUs, {machine['date']} "
        f"(model TTFT 0 ms; {' vs '.join(labels)})"
    )
    publish(stem("api", args.quick), result, lambda png: plot(png, plan, rows, labels, title))
    return 0


if __name__ == "__main__":
    run(main)
