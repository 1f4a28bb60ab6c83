"""Load: sessions at rising concurrency, each followed on its SSE stream, and a thousand idle streams.

The system, as `make run` runs it: the benchmark's own PostgreSQL (fsync on) and Redis, one Daphne, one Celery
worker (prefork, 4 pool processes, log level INFO), Celery beat, and the offline model answering at once (no
time to first token, the whole answer in one go), so that what is measured is the platform, not a model's
wait. The agents have no tools: every turn is a text answer and no sandbox is provisioned (Docker is not what
this measures). Everything listens on loopback; the clients are asyncio + httpx in this process.

Idle streams (first, on a fresh Daphne): IDLE sessions each get an open SSE stream (`GET
/v1/sessions/{id}/events/stream`, the /v1 API's; the UI's WebSocket is not measured), opened PROBES at a time.
Daphne's resident memory before and after gives the memory per idle stream; the cores each part uses over
IDLE_WINDOW seconds with nothing sent give what idle streams cost (each catches up from the database every
STREAM_CATCHUP_SECONDS and re-checks its key every STREAM_RECHECK_SECONDS). A probe (PROBES sessions, one turn
each, one after the other) runs before the idle streams open and again while they are open: append -> stream
latency and turn latency, side by side.

Ramp: at each level N, N new sessions open their streams, then all send their first user message at once and
go on for TURNS turns, each waiting for its turn's `session.status_idle` on its stream and then a think time
drawn uniformly from THINK seconds. Per level: events written per second (every event of the level's sessions,
over the time from the first message sent to the last turn's end), append -> stream latency (the client's
wall clock when an event's SSE frame arrived minus the event's `processed_at`, stamped by the appending
process just before its INSERT; one machine, one clock), turn latency (message POSTed -> its
`session.status_idle` received), CPU seconds by part (per turn), and errors: a non-2xx answer, a stream that
failed or ended, a turn without its idle within TURN_TIMEOUT, and every stream checked against the log (each
event after the stream opened received exactly once and in order).

Degradation: the first level whose append -> stream p95 or turn p95 is above DEGRADE_FACTOR times the first
level's and DEGRADE_FLOOR_MS more than it, or that has errors. At that level: the cores each part used, the
machine's busy share and CPU pressure (Linux PSI; the machine is shared, so it counts others' work too), and
the same level again, ROUNDS times taking turns, as it is, with a second worker (8 pool processes), and with a
second Daphne (streams and messages split between the two), to show what moves the point and what does not.

Usage: SECRET_KEY=x .venv/bin/python -m bench.load [--quick] [--levels 25,50,...] [--turns N] [--idle N]
       [--database-url URL] [--redis-url URL] [--note TEXT]

It prints a table, writes bench/results/load.json and load.png (load-quick.* with --quick), and exits 1 if any
stream lost, doubled or reordered an event, or anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/load.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common.app import new_agent, new_api_key, new_environment, new_session  # noqa: E402
from bench.common.launcher import Launcher, service_arguments  # noqa: E402
from bench.common.machine import (  # noqa: E402
    busy,
    cpu_jiffies,
    cpu_pressure_us,
    load_average,
    machine_info,
    warn_if_busy,
)
from bench.common.results import pct, publish, pyplot, run, save_figure, say, stem  # noqa: E402

PARTS = {"web (Daphne)": "daphne", "workers (Celery)": "worker-", "beat": "beat", "offline model": "model"}
TURN_TIMEOUT = 180.0
OPEN_TIMEOUT = 120.0
DEGRADE_FACTOR = 2.0
DEGRADE_FLOOR_MS = 50.0
AS_IS, TWO_WORKERS, TWO_DAPHNES = "1 Daphne, 1 worker", "1 Daphne, 2 workers", "2 Daphnes, 1 worker"


@dataclass(frozen=True)
class Plan:
    levels: tuple[int, ...]
    turns: int  # user messages per session at each level
    think: tuple[float, float]  # seconds between a turn's end and the next message, uniform
    idle: int  # idle streams
    probes: int  # probe turns (and sessions), before and while the idle streams are open
    idle_window: float  # seconds the idle streams are watched with nothing sent
    rounds: int = 2  # per side of the comparison at the degradation level
    worker_concurrency: int = 4  # the Procfile's WORKER_CONCURRENCY default


DEFAULT = Plan(
    levels=(25, 50, 100, 200, 300), turns=4, think=(0.5, 2.0), idle=1000, probes=20, idle_window=15
)
QUICK = Plan(levels=(5, 10), turns=2, think=(0.2, 0.6), idle=100, probes=5, idle_window=4, rounds=1)


# --- The client: an SSE follower per session, and a driver sending its messages ------------------------------


@dataclass
class Received:
    uid: str
    type: str
    at: float  # wall clock when its frame arrived
    processed_at: float


@dataclass
class Stream:
    session_id: str
    base: str
    received: list[Received] = field(default_factory=list)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    idles: asyncio.Queue[float] = field(default_factory=asyncio.Queue)
    error: str | None = None


@dataclass
class Turn:
    sent: float
    posted: float
    idle: float


@dataclass
class Outcome:
    turns: list[Turn] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


async def follow(client: httpx.AsyncClient, stream: Stream) -> None:
    """Read the session's SSE stream until cancelled: every event with the time it arrived."""
    url = f"{stream.base}/v1/sessions/{stream.session_id}/events/stream"
    name, data = "", ""
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                stream.error = f"stream answered {response.status_code}"
                return
            async for line in response.aiter_lines():
                if line:
                    field_name, _, value = line.partition(":")
                    if field_name == "event":
                        name = value.strip()
                    elif field_name == "data":
                        data += value.strip()
                    continue
                now = time.time()
                if name == "ping":
                    stream.opened.set()
                elif name == "error":
                    stream.error = f"stream error event: {data[:200]}"
                    return
                elif data:
                    event = _json(data)
                    processed = datetime.fromisoformat(event["processed_at"]).timestamp()
                    stream.received.append(Received(event["id"], event["type"], now, processed))
                    if event["type"] == "session.status_idle":
                        stream.idles.put_nowait(now)
                name, data = "", ""
        stream.error = "stream ended"
    except httpx.HTTPError as failed:
        stream.error = f"stream failed: {type(failed).__name__}"


def _json(data: str) -> dict[str, Any]:
    import json

    parsed: dict[str, Any] = json.loads(data)
    return parsed


def message(text: str) -> dict[str, Any]:
    return {"events": [{"type": "user.message", "content": [{"type": "text", "text": text}]}]}


async def turn(client: httpx.AsyncClient, stream: Stream, text: str, outcome: Outcome) -> bool:
    """One message POSTed and its turn's idle awaited on the stream; False if it failed."""
    sent = time.time()
    try:
        response = await client.post(
            f"{stream.base}/v1/sessions/{stream.session_id}/events", json=message(text)
        )
    except httpx.HTTPError as failed:
        outcome.errors[f"POST failed: {type(failed).__name__}"] += 1
        return False
    posted = time.time()
    if response.status_code != 200:
        outcome.errors[f"POST answered {response.status_code}"] += 1
        return False
    try:
        idle = await asyncio.wait_for(stream.idles.get(), TURN_TIMEOUT)
    except TimeoutError:
        outcome.errors["turn without its idle in time"] += 1
        return False
    outcome.turns.append(Turn(sent, posted, idle))
    return True


async def drive(
    client: httpx.AsyncClient,
    stream: Stream,
    turns: int,
    think: tuple[float, float],
    rng: random.Random,
    outcome: Outcome,
) -> None:
    for k in range(turns):
        if k:
            await asyncio.sleep(rng.uniform(*think))
        if not await turn(client, stream, f"load {stream.session_id} turn {k}", outcome):
            return


def http_client(key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        headers={"x-api-key": key},
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        timeout=httpx.Timeout(60, read=None),
    )


async def open_streams(
    client: httpx.AsyncClient, streams: list[Stream], outcome: Outcome, *, at_once: int = 50
) -> list[asyncio.Task[None]]:
    """Start following each stream, `at_once` connecting at a time; returns once every one has its first ping."""
    tasks: list[asyncio.Task[None]] = []
    for start in range(0, len(streams), at_once):
        batch = streams[start : start + at_once]
        tasks += [asyncio.create_task(follow(client, s)) for s in batch]
        await _opened(batch, outcome)
    return tasks


async def _opened(streams: list[Stream], outcome: Outcome) -> None:
    waits = [asyncio.wait_for(s.opened.wait(), OPEN_TIMEOUT) for s in streams]
    for stream, done in zip(streams, await asyncio.gather(*waits, return_exceptions=True), strict=True):
        if isinstance(done, BaseException):
            outcome.errors[stream.error or "stream not open in time"] += 1


async def close(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- The log's side ----------------------------------------------------------------------------------------


def lengths(session_ids: list[str]) -> dict[str, int]:
    from sessions.models import Session

    return dict(Session.objects.filter(id__in=session_ids).values_list("id", "next_seq"))


def audit(streams: list[Stream], since: dict[str, int], outcome: Outcome) -> int:
    """Check each stream against the log: every event from `since` on received once, in order; the stream's own
    failures counted. How many events the log has after `since`."""
    from sessions.models import Event

    written: dict[str, list[str]] = {s.session_id: [] for s in streams}
    rows = Event.objects.filter(session_id__in=list(written)).order_by("session_id", "seq")
    for session_id, seq, uid in rows.values_list("session_id", "seq", "uid"):
        if seq >= since[session_id]:
            written[session_id].append(uid)
    for stream in streams:
        got = [r.uid for r in stream.received]
        expected = written[stream.session_id]
        if stream.error and stream.error != "stream ended":
            outcome.errors[stream.error] += 1
        if got == expected:
            continue
        counts = Counter(got)
        outcome.errors["events not streamed"] += len(set(expected) - set(got))
        outcome.errors["events streamed twice"] += sum(n - 1 for n in counts.values() if n > 1)
        outcome.errors["events streamed but not in the log"] += len(set(got) - set(expected))
        if [u for u in got if u in set(expected)] != [u for u in expected if u in counts]:
            outcome.errors["events streamed out of order"] += 1
    return sum(len(v) for v in written.values())


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- The phases --------------------------------------------------------------------------------------------


@dataclass
class System:
    launcher: Launcher
    key: str
    agent: str
    environment: str
    urls: list[str]  # the Daphnes streams and messages go to, taking turns

    def sessions(self, n: int) -> list[str]:
        from django.db import connections

        made = [new_session(agent=self.agent, environment=self.environment) for _ in range(n)]
        connections.close_all()
        return made

    def cpu(self) -> dict[str, float]:
        return self.launcher.cpu_seconds(PARTS)


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores used by each of our parts (the Docker engine is other people's here: no sandbox is made)."""
    return {
        part: round((after[part] - before.get(part, 0.0)) / seconds, 3)
        for part in after
        if part != "docker engine (shared)"
    }


def latencies(streams: list[Stream], outcome: Outcome) -> dict[str, Any]:
    lag = [(r.at - r.processed_at) * 1000 for s in streams for r in s.received]
    turn_ms = [(t.idle - t.sent) * 1000 for t in outcome.turns]
    post_ms = [(t.posted - t.sent) * 1000 for t in outcome.turns]
    return {
        "events_streamed": len(lag),
        "append_to_stream_p50_ms": pct(lag, 0.5),
        "append_to_stream_p95_ms": pct(lag, 0.95),
        "append_to_stream_max_ms": round(max(lag), 1) if lag else None,
        "turn_p50_ms": pct(turn_ms, 0.5),
        "turn_p95_ms": pct(turn_ms, 0.95),
        "post_p50_ms": pct(post_ms, 0.5),
        "post_p95_ms": pct(post_ms, 0.95),
    }


async def probe(client: httpx.AsyncClient, streams: list[Stream], outcome: Outcome) -> None:
    """One turn per session, one after the other (a lone user's view of the system)."""
    for stream in streams:
        await turn(client, stream, f"probe {stream.session_id}", outcome)
        await asyncio.sleep(0.1)


def idle_phase(system: System, plan: Plan) -> dict[str, Any]:
    say(f"idle streams: making {plan.idle} sessions and {2 * plan.probes} probe sessions")
    idle_ids = system.sessions(plan.idle)
    probe_ids = system.sessions(2 * plan.probes)
    since = lengths(probe_ids)
    daphne = system.launcher.processes.started["daphne"].pid
    url = system.urls[0]

    async def phase() -> dict[str, Any]:
        found: dict[str, Any] = {}
        async with http_client(system.key) as client:
            before_probe, during_probe = Outcome(), Outcome()
            first = [Stream(s, url) for s in probe_ids[: plan.probes]]
            second = [Stream(s, url) for s in probe_ids[plan.probes :]]
            tasks = await open_streams(client, first + second, before_probe)
            await probe(client, first, before_probe)
            await asyncio.sleep(1)
            found["rss_before_kib"] = rss_kib(daphne)
            idle = [Stream(s, url) for s in idle_ids]
            opened = Outcome()
            started = time.monotonic()
            tasks += await open_streams(client, idle, opened)
            found["open_seconds"] = round(time.monotonic() - started, 1)
            say(
                f"  {plan.idle} idle streams open in {found['open_seconds']} s; watching them for {plan.idle_window:g} s"
            )
            await asyncio.sleep(2)
            found["rss_after_kib"] = rss_kib(daphne)
            cpu0, t0 = system.cpu(), time.monotonic()
            await asyncio.sleep(plan.idle_window)
            found["idle_cores"] = cores(cpu0, system.cpu(), time.monotonic() - t0)
            await probe(client, second, during_probe)
            await asyncio.sleep(1)
            await close(tasks)
            found["outcomes"] = (opened, before_probe, during_probe)
            found["streams"] = (idle, first, second)
            return found

    found = asyncio.run(phase())
    opened, before_probe, during_probe = found.pop("outcomes")
    idle, first, second = found.pop("streams")
    audit(first, since, before_probe)
    audit(second, since, during_probe)
    audit(idle, lengths(idle_ids), opened)  # nothing was sent to them: nothing may arrive
    per_stream = (found["rss_after_kib"] - found["rss_before_kib"]) / plan.idle
    return {
        **found,
        "streams": plan.idle,
        "kib_per_idle_stream": round(per_stream, 1),
        "idle_errors": dict(opened.errors),
        "probes": [
            {
                "probe": f"{plan.probes} turns, no idle streams",
                **latencies(first, before_probe),
                "errors": dict(before_probe.errors),
            },
            {
                "probe": f"{plan.probes} turns, {plan.idle} idle streams open",
                **latencies(second, during_probe),
                "errors": dict(during_probe.errors),
            },
        ],
    }


def level(system: System, n: int, plan: Plan, *, label: str = "") -> dict[str, Any]:
    """N sessions at once, TURNS turns each, every one followed on its stream."""
    ids = system.sessions(n)
    since = lengths(ids)
    rng = random.Random(n)
    streams = [Stream(s, system.urls[i % len(system.urls)]) for i, s in enumerate(ids)]
    outcome = Outcome()
    machine: dict[str, float] = {}

    async def phase() -> tuple[float, float, dict[str, float], dict[str, float], float]:
        async with http_client(system.key) as client:
            tasks = await open_streams(client, streams, outcome)
            cpu0, t0, began = system.cpu(), time.monotonic(), time.time()
            machine0 = cpu_jiffies(), cpu_pressure_us()
            await asyncio.gather(*(drive(client, s, plan.turns, plan.think, rng, outcome) for s in streams))
            took = time.monotonic() - t0
            cpu1 = system.cpu()
            machine["busy"] = busy(machine0[0], cpu_jiffies())
            pressure = cpu_pressure_us()
            if pressure is not None and machine0[1] is not None:
                machine["pressure"] = (pressure - machine0[1]) / (took * 1e6)
            await asyncio.sleep(0.5)  # anything a stream would wrongly add after its idle
            await close(tasks)
            return began, took, cpu0, cpu1, time.time()

    load0 = load_average()
    began, took, cpu0, cpu1, _ = asyncio.run(phase())
    written = audit(streams, since, outcome)
    turns = len(outcome.turns)
    spent = {part: round(cpu1[part] - cpu0.get(part, 0.0), 2) for part in cpu1}
    row = {
        "sessions": n,
        "config": label or describe(system),
        "seconds": round(took, 1),
        "turns": turns,
        "events_written": written,
        "events_per_s": round(written / took, 1),
        "turns_per_s": round(turns / took, 1),
        **latencies(streams, outcome),
        "worker_cpu_ms_per_turn": round(1000 * spent.get("workers (Celery)", 0) / max(1, turns), 1),
        "all_cpu_ms_per_turn": round(
            1000 * sum(v for k, v in spent.items() if k != "this client") / max(1, turns), 1
        ),
        "cores": cores(cpu0, cpu1, took),
        "machine_busy": round(machine["busy"], 3),
        "cpu_pressure": round(machine["pressure"], 3) if "pressure" in machine else None,
        "errors": dict(outcome.errors),
        "error_count": sum(outcome.errors.values()),
        "load_average": [load0, load_average()],
    }
    say(
        f"  {n:4d} sessions ({row['config']}): {row['events_per_s']:,.0f} events/s, {row['turns_per_s']} turns/s, "
        f"append->stream p95 {row['append_to_stream_p95_ms']} ms, turn p95 {row['turn_p95_ms']} ms, "
        f"worker {row['worker_cpu_ms_per_turn']} ms CPU/turn, errors {row['error_count']}, "
        f"cores {top_parts(row['cores'])}; machine {row['machine_busy']:.0%} busy, CPU pressure {row['cpu_pressure']}"
    )
    return row


def describe(system: System) -> str:
    workers = len(system.launcher.processes.pids("worker-"))
    return f"{len(system.urls)} Daphne, {workers} worker"


def median(values: list[Any]) -> float:
    return float(statistics.median(v for v in values if v is not None))


def top_parts(used: dict[str, float], n: int = 3) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(used.items(), key=lambda kv: -kv[1])[:n])


def degradation(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first level past DEGRADE_FACTOR x (and DEGRADE_FLOOR_MS over) the first level's p95s, or with errors."""
    base = rows[0]
    for row in rows:
        reasons = []
        for metric in ("append_to_stream_p95_ms", "turn_p95_ms"):
            if row[metric] is None or base[metric] is None:
                continue
            if row[metric] > DEGRADE_FACTOR * base[metric] and row[metric] - base[metric] > DEGRADE_FLOOR_MS:
                reasons.append(f"{metric} {row[metric]:,.0f} vs {base[metric]:,.0f}")
        if row["error_count"]:
            reasons.append(f"{row['error_count']} errors")
        if reasons:
            return {"sessions": row["sessions"], "why": "; ".join(reasons)}
    return None


def bottleneck(row: dict[str, Any]) -> str:
    """The part of the system that used the most cores at this level (this client aside)."""
    used = {k: v for k, v in row["cores"].items() if k != "this client"}
    return max(used, key=lambda k: used[k])


def _stop(processes: Any, name: str) -> None:
    process = processes.started.pop(name)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    process.wait(30)


# --- Results -----------------------------------------------------------------------------------------------


def summary_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "sessions": row["sessions"],
        "system": row["config"],
        "s": row["seconds"],
        "turns": row["turns"],
        "events/s": row["events_per_s"],
        "turns/s": row["turns_per_s"],
        "append->stream p50 / p95 ms": f"{row['append_to_stream_p50_ms']} / {row['append_to_stream_p95_ms']}",
        "turn p50 / p95 ms": f"{row['turn_p50_ms']} / {row['turn_p95_ms']}",
        "POST p95 ms": row["post_p95_ms"],
        "worker CPU ms / turn": row["worker_cpu_ms_per_turn"],
        "all CPU ms / turn": row["all_cpu_ms_per_turn"],
        "machine busy": f"{row['machine_busy']:.0%}",
        "CPU pressure": row["cpu_pressure"],
        "errors": row["error_count"],
        "load avg at end": row["load_average"][1][0],
    }


def tables(
    plan: Plan,
    idle: dict[str, Any],
    rows: list[dict[str, Any]],
    compared: list[dict[str, Any]],
    point: dict[str, Any] | None,
    first: str,
    at: dict[str, Any],
) -> dict[str, Any]:
    """The lists of rows bench/report.py renders as the README's tables."""
    parts = sorted(
        {p for r in rows for p in r["cores"]}, key=lambda p: -max(r["cores"].get(p, 0) for r in rows)
    )
    idle_rows = [
        {
            "idle streams": "Daphne RSS before / after, MiB",
            "value": f"{idle['rss_before_kib'] / 1024:.1f} / {idle['rss_after_kib'] / 1024:.1f}",
        },
        {"idle streams": "memory per idle stream, KiB", "value": idle["kib_per_idle_stream"]},
        {"idle streams": f"seconds to open {idle['streams']:,}", "value": idle["open_seconds"]},
        {
            "idle streams": f"cores used with {idle['streams']:,} idle streams open, nothing sent",
            "value": top_parts(idle["idle_cores"], 6),
        },
        {
            "idle streams": "errors (failed, ended, or an event where none was sent)",
            "value": sum(idle["idle_errors"].values()),
        },
    ]
    probes = [
        {
            "probe": p["probe"],
            "append->stream p50 / p95 ms": f"{p['append_to_stream_p50_ms']} / {p['append_to_stream_p95_ms']}",
            "turn p50 / p95 ms": f"{p['turn_p50_ms']} / {p['turn_p95_ms']}",
            "errors": sum(p["errors"].values()),
        }
        for p in idle["probes"]
    ]
    found = [
        {
            "finding": "degradation point",
            "value": f"{point['sessions']} sessions: {point['why']}"
            if point
            else f"none up to {rows[-1]['sessions']} sessions",
        },
        {
            "finding": "most cores at that level",
            "value": f"{first}: {at['cores'].get(first, 0):.2f} of {os.cpu_count()} cores; the machine "
            f"{at['machine_busy']:.0%} busy, CPU pressure {at['cpu_pressure']}",
        },
    ]
    for label in (AS_IS, TWO_WORKERS, TWO_DAPHNES):
        runs = [r for r in compared if r["config"] == label]
        if runs:
            found.append(
                {
                    "finding": f"{runs[0]['sessions']} sessions, {label} (median of {len(runs)})",
                    "value": f"{median([r['events_per_s'] for r in runs]):,.0f} events/s, turn p95 "
                    f"{median([r['turn_p95_ms'] for r in runs]):,.0f} ms, POST p95 "
                    f"{median([r['post_p95_ms'] for r in runs]):,.0f} ms, append->stream p95 "
                    f"{median([r['append_to_stream_p95_ms'] for r in runs]):,.0f} ms",
                }
            )
    return {
        "findings": found,
        "ramp": [summary_row(r) for r in rows],
        "cores_by_part": [
            {"sessions": r["sessions"], **{p: r["cores"].get(p, 0.0) for p in parts}} for r in rows
        ],
        "comparison": [summary_row(r) for r in compared],
        "idle": idle_rows,
        "probes": probes,
    }


def plot(path: Path, rows: list[dict[str, Any]], compared: list[dict[str, Any]], title: str) -> None:
    plt = pyplot()
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.8))
    levels = [r["sessions"] for r in rows]
    left.plot(levels, [r["events_per_s"] for r in rows], "o-", color="#3b6ea8", label="events written / s")
    left.set_xlabel("concurrent sessions")
    left.set_ylabel("events / s")
    left.set_title("Throughput")
    twin = left.twinx()
    twin.plot(levels, [r["turns_per_s"] for r in rows], "s--", color="#888", label="turns / s")
    twin.set_ylabel("turns / s")
    left.legend(loc="upper left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)
    for metric, colour, name in (
        ("append_to_stream_p95_ms", "#d0803a", "append -> stream p95"),
        ("append_to_stream_p50_ms", "#e8b98a", "append -> stream p50"),
        ("turn_p95_ms", "#a33", "turn p95"),
        ("turn_p50_ms", "#d99", "turn p50"),
    ):
        middle.plot(levels, [r[metric] for r in rows], "o-", color=colour, label=name)
    markers = {AS_IS: "o", TWO_WORKERS: "^", TWO_DAPHNES: "s"}
    for label, marker in markers.items():
        runs = [r for r in compared if r["config"] == label]
        if runs:
            middle.plot(
                [r["sessions"] for r in runs],
                [r["turn_p95_ms"] for r in runs],
                marker,
                color="#333",
                fillstyle="none",
                markersize=8,
                label=f"turn p95, {label}",
            )
    middle.set_xlabel("concurrent sessions")
    middle.set_ylabel("ms (log)")
    middle.set_yscale("log")
    middle.set_title("Latency (black: the comparison at the degradation point)")
    middle.legend(fontsize=8)
    parts = sorted(
        {p for r in rows for p in r["cores"]}, key=lambda p: -max(r["cores"].get(p, 0) for r in rows)
    )
    bottom = [0.0] * len(rows)
    positions = list(range(len(rows)))
    for part in parts:
        values = [r["cores"].get(part, 0.0) for r in rows]
        right.bar(positions, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.axhline(os.cpu_count() or 2, color="#333", linewidth=0.8, linestyle=":")
    right.set_xticks(positions, [str(n) for n in levels])
    right.set_xlabel("concurrent sessions")
    right.set_ylabel("cores")
    right.set_title("CPU by part (dotted: the machine's cores)")
    right.legend(fontsize=7)
    save_figure(figure, path, title)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run: levels {QUICK.levels}, {QUICK.idle} idle streams"
    )
    parser.add_argument("--levels", help=f"concurrency levels, comma-separated (default {DEFAULT.levels})")
    parser.add_argument("--turns", type=int, help=f"turns per session (default {DEFAULT.turns})")
    parser.add_argument("--idle", type=int, help=f"idle streams (default {DEFAULT.idle})")
    service_arguments(parser)
    parser.add_argument("--note", default="", help="a remark saved with the results")
    return parser


def raise_open_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # the children inherit it
    return wanted


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    base = QUICK if args.quick else DEFAULT
    plan = replace(
        base,
        levels=tuple(int(x) for x in args.levels.split(",")) if args.levels else base.levels,
        turns=args.turns or base.turns,
        idle=args.idle if args.idle is not None else base.idle,
    )
    files = raise_open_files()
    started = time.monotonic()
    compared: list[dict[str, Any]] = []
    with Launcher("load", database_url=args.database_url, redis_url=args.redis_url) as launcher:
        launcher.model()
        launcher.start_services(max_connections=400)
        machine = machine_info()
        warn_if_busy(machine)
        say(f"starting Daphne, a Celery worker (prefork, {plan.worker_concurrency}) and beat")
        url = launcher.processes.daphne()
        launcher.processes.worker(
            "worker-1", pool="prefork", concurrency=plan.worker_concurrency, loglevel="INFO", ready_within=90
        )
        launcher.processes.beat()
        system = System(launcher, new_api_key("load"), new_agent("load"), new_environment("load"), [url])
        idle = idle_phase(system, plan)
        say(
            f"  Daphne RSS {idle['rss_before_kib'] / 1024:.0f} -> {idle['rss_after_kib'] / 1024:.0f} MiB: "
            f"{idle['kib_per_idle_stream']} KiB per idle stream; idle cores {top_parts(idle['idle_cores'])}"
        )
        say(
            f"ramp: {plan.levels} sessions, {plan.turns} turns each, think {plan.think[0]:g}-{plan.think[1]:g} s"
        )
        rows = [level(system, n, plan) for n in plan.levels]
        point = degradation(rows)
        at = next((r for r in rows if point and r["sessions"] == point["sessions"]), rows[-1])
        first = bottleneck(at)
        say(
            f"comparison at {at['sessions']} sessions: as it is, a second worker, a second Daphne; {plan.rounds} rounds"
        )
        url2 = launcher.processes.daphne("daphne-2")
        two_daphnes = replace(system, urls=[url, url2])
        for _ in range(plan.rounds):
            compared.append(level(system, at["sessions"], plan, label=AS_IS))
            launcher.processes.worker(
                "worker-2",
                pool="prefork",
                concurrency=plan.worker_concurrency,
                loglevel="INFO",
                ready_within=90,
            )
            try:
                compared.append(level(system, at["sessions"], plan, label=TWO_WORKERS))
            finally:
                _stop(launcher.processes, "worker-2")
            compared.append(level(two_daphnes, at["sessions"], plan, label=TWO_DAPHNES))
        machine["load_average_at_end"] = load_average()
    everything = [*rows, *compared]
    errors = (
        sum(r["error_count"] for r in everything)
        + sum(sum(p["errors"].values()) for p in idle["probes"])
        + sum(idle["idle_errors"].values())
    )
    result = {
        "benchmark": "load",
        "quick": args.quick,
        "note": args.note,
        "machine": machine,
        "plan": asdict(plan) | {"open_files": files, "turn_timeout_s": TURN_TIMEOUT},
        "seconds": round(time.monotonic() - started, 1),
        **tables(plan, idle, rows, compared, point, first, at),
        "errors": errors,
        "degradation": point,
        "bottleneck": {"part": first, "at_sessions": at["sessions"], "cores": at["cores"]},
        "detail": {"idle": idle, "levels": rows, "comparison": compared},
    }
    title = f"bench/load: {','.join(map(str, plan.levels))} sessions x {plan.turns} turns, {plan.idle} idle streams, {machine['date']}"
    publish(stem("load", args.quick), result, lambda png: plot(png, rows, compared, title))
    return 1 if errors else 0


if __name__ == "__main__":
    run(main)
