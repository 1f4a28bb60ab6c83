"""The brain's benchmark: how fast a killed turn resumes, and what the harness itself costs per model call.

Resume: a turn streams a long answer from the offline model on one of three Celery workers (prefork,
concurrency 1) while beat runs the sweeper, all at the product's default LEASE_SECONDS (10 s); at a random
moment of the stream the brain is SIGKILLed, two ways taking turns:
- the pool process alone (the OOM killer, a crash): the worker's main process sees it die, frees the dead
  process's lease and Celery requeues the wake (harness.tasks.WakeRequest). Judged: p50 <= 1 s, p95 <= 2 s;
- the whole worker, main process and pool child together, and a new worker started at once, as a supervisor
  (`make run`, compose's restart policy) would: the new worker frees the leases of this host's processes that
  are gone and wakes their sessions. Reported, not judged: it is mostly the new worker's start.
Measured per kill: from the kill to the first event the resumed turn writes (its `brain.recovered`), by that
event's own timestamp, beside the lease the dead brain left (what the resume waited before these paths: a
machine that vanishes, telling no one, still waits it out, and then the sweeper wakes the session).

Overhead: in this process, `run_brain` answers one-line messages, one wake and one model call each, from
an offline model in another process with zero latency. Per call: the wall time of the model step (the
context, the `span.model_request_start`, the streamed request through the SDK with its previews, and the
recorded response) minus the time the model server spent on the request, timed in the server process
from the request's arrival to its last byte. The same for 500-word answers (500 streamed deltas, each a
preview) streamed at 500 tokens/s, faster than Claude streams: the harness handles each delta while the
next is on its way, as it would with a real model, and what it adds is what the step takes beyond the
stream. The same 500 words sent all at once are reported too, not judged: there the SDK's parsing of each
event (and the harness's preview of it) adds up with nothing to overlap it. And per wake (all of
`run_brain`, minus the server's time).

Usage: .venv/bin/python -m bench.harness [--quick] [--kills N] [--calls N] [--lease-seconds S]
       [--sweep-seconds S] [--database-url URL] [--redis-url URL] [--note TEXT]

Without a database URL (or BENCH_DATABASE_URL) it starts its own PostgreSQL (default durability) and Redis
(bench/common/launcher.py), and removes them at the end. It prints a table, writes bench/results/harness.json
and harness.png (harness-quick.* with --quick), and exits 0 whether or not the targets are met.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/harness.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common.app import new_session  # noqa: E402
from bench.common.launcher import Launcher, service_arguments  # noqa: E402
from bench.common.machine import load_average, machine_info  # noqa: E402
from bench.common.processes import Failed, Processes, wait_until  # noqa: E402
from bench.common.results import percentile, publish, pyplot, run, save_figure, say, stem  # noqa: E402

RESUME_P50_TARGET_S = 1.0  # a pool process killed, at the default LEASE_SECONDS
RESUME_P95_TARGET_S = 2.0
POOL, WORKER = "pool process", "whole worker, restarted"
OVERHEAD_P50_TARGET_MS = 10.0
LONG_WORDS = 500
PACED_TPS = 500.0  # the streaming rate of the judged long answers, tokens (deltas) per second


@dataclass(frozen=True)
class Plan:
    kills: int
    calls: int  # timed model calls per answer length (after the warm-up)
    warmup: int = 10
    workers: int = 3


DEFAULT = Plan(kills=30, calls=100)
QUICK = Plan(kills=6, calls=30, warmup=5)


@dataclass
class Kill:
    kind: str  # POOL or WORKER
    resume_s: float  # SIGKILL → the resumed turn's first event
    lease_left_s: float  # how long the dead brain's lease still ran at the kill
    killed_after_s: float  # how far into the stream the kill came
    completed: bool  # the resumed turn went on to answer and end idle


@dataclass
class Call:
    step_ms: float  # the CallModel step, wall time
    server_ms: float  # the model server's own time for the request
    before_ms: float  # status, context and span.model_request_start, before the request goes out
    stream_ms: float  # stream_response, wall time (includes server_ms)
    wake_ms: float  # the whole run_brain of the wake that made the call

    @property
    def overhead_ms(self) -> float:
        return self.step_ms - self.server_ms


@dataclass
class Settings:
    lease_seconds: float
    sweep_seconds: float
    interrupt_poll_seconds: float = 0.2


# --- The offline model, timed in its own process ---------------------------------------------------------


def serve_model(timings: Path) -> None:
    """The offline model server, appending each /v1/messages request's time in the server to `timings`."""
    from offline_model import server

    handler = server._Handler
    original = handler.do_POST

    def timed(self: Any) -> None:
        began = time.perf_counter()
        original(self)
        if self.path.startswith("/v1/messages"):
            with open(timings, "a") as out:
                out.write(f"{(time.perf_counter() - began) * 1000:.4f}\n")

    handler.do_POST = timed  # type: ignore[method-assign]
    model = server.OfflineModelServer(("127.0.0.1", 0))
    print(model.base_url, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    model.serve_forever()


def set_latency(base_url: str, *, ttft_ms: float = 0, tps: float = 0) -> None:
    import httpx

    httpx.post(
        f"{base_url}/_control/latency", json={"ttft_ms": ttft_ms, "tps": tps}, timeout=5
    ).raise_for_status()


def model_stats(base_url: str) -> dict[str, Any]:
    import httpx

    return httpx.get(f"{base_url}/_control/stats", timeout=5).json()


# --- Resume after SIGKILL -------------------------------------------------------------------------------


class Brains(Processes):
    """Celery workers (prefork, one pool child each) and beat, against the benchmark's services."""

    def start_worker(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        self.worker(name, pool="prefork", concurrency=1, loglevel="INFO", hostname=f"{name}@%h")
        return name

    def workers(self) -> list[str]:
        return [name for name in self.started if name.startswith("bench-")]

    def start_beat(self) -> None:
        self.beat(loglevel="INFO", max_interval=1)

        def swept() -> bool:
            beat = self.log("beat")
            if "Couldn't apply scheduled task" in beat:
                line = next(line for line in beat.splitlines() if "Couldn't apply scheduled task" in line)
                raise Failed(
                    f"bench/harness: celery beat cannot send the sweeper, so nothing resumes a killed turn:\n{line}"
                )
            return any(
                "harness.tasks.sweep[" in self.log(w) and "succeeded" in self.log(w) for w in self.workers()
            )

        wait_until(swept, 60, "the first sweep", every=0.02)

    def holder(self, owner: str) -> str | None:
        """The worker whose pool child holds the lease (`owner` ends in that child's pid)."""
        pid = int(owner.rsplit(":", 1)[1])
        for name in self.workers():
            try:
                if os.getpgid(pid) == self.started[name].pid:
                    return name
            except ProcessLookupError:
                continue
        return None


def one_kill(brains: Brains, model_url: str, rng: random.Random, kind: str) -> Kill:
    from harness.brain import has_pending_work
    from sessions.models import Event, Session

    set_latency(model_url, tps=1000)  # 3000 words: a three-second stream
    session_id = new_session("/long 3000")
    wait_until(
        lambda: (
            Session.objects.filter(id=session_id).exclude(lease_owner="").exists()
            and model_stats(model_url)["in_flight"] == 1
        ),
        30,
        "the model to stream",
        every=0.02,
    )
    streaming_since = time.monotonic()
    time.sleep(rng.uniform(0.2, 2.0))
    owner = Session.objects.values_list("lease_owner", flat=True).get(id=session_id)
    victim = brains.holder(owner)
    if victim is None or model_stats(model_url)["in_flight"] != 1:
        raise RuntimeError(f"the brain of {session_id} is not streaming (owner {owner!r})")
    held = Session.objects.get(id=session_id)  # read before the kill: a freed lease has no expiry
    replacement = None
    if kind == POOL:
        killed_at = time.time()
        os.kill(int(owner.rsplit(":", 1)[1]), signal.SIGKILL)
    else:
        killed_at = brains.kill(victim)
        replacement = brains.start_worker()
    killed_after = time.monotonic() - streaming_since
    set_latency(model_url, tps=0)
    assert held.lease_expires_at is not None
    lease_left = held.lease_expires_at.timestamp() - killed_at
    resumed = wait_until(
        lambda: (
            Event.objects.filter(session_id=session_id, lease_epoch__gt=held.lease_epoch)
            .order_by("seq")
            .first()
        ),
        60,
        "the resumed turn's first event",
        every=0.02,
    )

    def done() -> bool:
        row = Session.objects.get(id=session_id)
        return row.status == Session.Status.IDLE and not row.lease_owner and not has_pending_work(session_id)

    try:
        completed = bool(wait_until(done, 10, "the resumed turn to end", every=0.02))
    except Failed:
        completed = False
    if replacement is not None:
        wait_until(lambda: brains.ready(replacement), 60, "the replacement worker", every=0.02)
    return Kill(kind, resumed.processed_at.timestamp() - killed_at, lease_left, killed_after, completed)


def measure_resume(plan: Plan, settings: Settings, system: Launcher) -> list[Kill]:
    from django.db import connections

    env = {
        "LEASE_SECONDS": str(settings.lease_seconds),
        "SWEEP_SECONDS": str(settings.sweep_seconds),
        "INTERRUPT_POLL_SECONDS": str(settings.interrupt_poll_seconds),
        "REAP_SECONDS": "86400",  # the reaper would remove every other deployment's containers on this engine
    }
    rng = random.Random(7)
    kills: list[Kill] = []
    # Stopped before the overhead is measured in this process: no worker may take those wakes.
    with Brains(system.folder, {**system.env, **env}) as brains:
        say(f"starting {plan.workers} celery workers and beat")
        started = [brains.start_worker() for _ in range(plan.workers)]
        wait_until(lambda: all(brains.ready(w) for w in started), 60, "the workers", every=0.02)
        brains.start_beat()
        for i in range(plan.kills):
            kill = one_kill(brains, system.model_url, rng, POOL if i % 2 == 0 else WORKER)
            kills.append(kill)
            say(
                f"  kill {i + 1:>2}/{plan.kills} ({kill.kind}): resumed in {kill.resume_s:5.2f} s"
                f" (lease left {kill.lease_left_s:4.2f}"
                f" s, killed {kill.killed_after_s:4.2f} s into the stream)"
                + ("" if kill.completed else "  -- the resumed turn did not finish")
            )
            connections.close_all()
    return kills


# --- Harness overhead per model call ---------------------------------------------------------------------


def measure_overhead(plan: Plan, model_url: str, timings: Path, text: str, *, tps: float = 0) -> list[Call]:
    """Answer `text` warmup + calls times in one session, each message its own wake, in this process, from
    the offline model streaming at `tps` tokens per second (0: all at once)."""
    from django.db import connections

    from harness import brain as brain_module
    from harness.harnesses import steps
    from sessions.models import Session
    from sessions.services import emit_event

    set_latency(model_url, tps=tps)
    session_id = new_session(None)
    phases: dict[str, float] = {}
    step_run, stream = steps.CallModel.run, steps.stream_response

    def timed_step(self: Any, brain: Any) -> None:
        phases["step_at"] = time.perf_counter()
        step_run(self, brain)
        phases["step"] = time.perf_counter() - phases["step_at"]

    def timed_stream(*args: Any, **kwargs: Any) -> Any:
        phases["request_at"] = time.perf_counter()
        try:
            return stream(*args, **kwargs)
        finally:
            phases["stream"] = time.perf_counter() - phases["request_at"]

    steps.CallModel.run = timed_step  # type: ignore[method-assign]
    steps.stream_response = timed_stream
    calls: list[Call] = []
    try:
        for i in range(plan.warmup + plan.calls):
            served_before = len(timings.read_text().split())
            emit_event(session_id, {"type": "user.message", "content": [{"type": "text", "text": text}]})
            Session.objects.filter(id=session_id).update(status=Session.Status.RUNNING)
            phases.clear()
            began = time.perf_counter()
            outcome = brain_module.run_brain(session_id)
            wake = time.perf_counter() - began
            served = [float(x) for x in timings.read_text().split()][served_before:]
            if outcome != "idle" or len(served) != 1:
                raise RuntimeError(f"a wake made {len(served)} model requests and ended {outcome!r}")
            if i >= plan.warmup:
                calls.append(
                    Call(
                        step_ms=phases["step"] * 1000,
                        server_ms=served[0],
                        before_ms=(phases["request_at"] - phases["step_at"]) * 1000,
                        stream_ms=phases["stream"] * 1000,
                        wake_ms=wake * 1000,
                    )
                )
            if (i + 1) % 25 == 0:
                say(f"  {i + 1:>3}/{plan.warmup + plan.calls} calls")
    finally:
        steps.CallModel.run = step_run  # type: ignore[method-assign]
        steps.stream_response = stream
        connections.close_all()
    return calls


def drain_broadcasts(timeout: float = 300.0) -> dict[str, float]:
    """Wait for this process's broadcaster to publish what the timed calls queued (previews mostly), so that
    nothing is left to fail once Redis stops; returns how much there was and how long it took."""
    from sessions import broadcast

    publisher = broadcast._instance
    if publisher is None:
        return {"queued_after_calls": 0, "drain_s": 0.0}
    queued = publisher._queue.qsize()
    began = time.monotonic()
    if queued:
        say(f"waiting for {queued:,} queued broadcasts (previews of the timed calls) to go out")
        wait_until(publisher._queue.empty, timeout, "the broadcaster to drain")
    return {"queued_after_calls": queued, "drain_s": round(time.monotonic() - began, 2)}


# --- Report ---------------------------------------------------------------------------------------------


# The overhead runs: their label, and whether the target judges them.
Answers = list[tuple[str, list[Call], bool]]


def answers_of(short: list[Call], paced: list[Call], burst: list[Call]) -> Answers:
    return [
        ("one-line answer", short, True),
        (f"{LONG_WORDS} words at {PACED_TPS:g} tokens/s", paced, True),
        (f"{LONG_WORDS} words sent at once", burst, False),
    ]


def summary(kills: list[Kill], answers: Answers) -> list[dict[str, Any]]:
    def row(metric: str, values: list[float], unit: str, target: str, met: bool | None) -> dict[str, Any]:
        return {
            "metric": metric,
            "n": len(values),
            "p50": round(percentile(values, 0.5), 3),
            "p95": round(percentile(values, 0.95), 3),
            "unit": unit,
            "target": target,
            "result": "-" if met is None else ("met" if met else "MISSED"),
        }

    rows = []
    for kind in (POOL, WORKER):
        of_kind = [k for k in kills if k.kind == kind]
        if not of_kind:
            continue
        resume = [k.resume_s for k in of_kind]
        judged = kind == POOL
        rows += [
            row(
                f"resume, {kind} killed: SIGKILL -> resumed turn's next event",
                resume,
                "s",
                f"p50 <= {RESUME_P50_TARGET_S:g} s, p95 <= {RESUME_P95_TARGET_S:g} s"
                if judged
                else "(not judged)",
                percentile(resume, 0.5) <= RESUME_P50_TARGET_S
                and percentile(resume, 0.95) <= RESUME_P95_TARGET_S
                if judged
                else None,
            ),
            row(
                "  the dead brain's lease left (no longer waited)",
                [k.lease_left_s for k in of_kind],
                "s",
                "",
                None,
            ),
        ]
    for label, calls, judged in answers:
        overhead = [c.overhead_ms for c in calls]
        rows += [
            row(
                f"overhead per model call ({label})",
                overhead,
                "ms",
                f"p50 <= {OVERHEAD_P50_TARGET_MS:g} ms" if judged else "(not judged)",
                percentile(overhead, 0.5) <= OVERHEAD_P50_TARGET_MS if judged else None,
            ),
            row(
                "  before the request (status, context, span start)",
                [c.before_ms for c in calls],
                "ms",
                "",
                None,
            ),
            row(
                "  streaming, client side (SDK, previews)",
                [c.stream_ms - c.server_ms for c in calls],
                "ms",
                "",
                None,
            ),
            row(
                "  recording the response (one transaction)",
                [c.step_ms - c.before_ms - c.stream_ms for c in calls],
                "ms",
                "",
                None,
            ),
            row("  model server's own time (excluded)", [c.server_ms for c in calls], "ms", "", None),
            row(
                "  per wake (run_brain - server time)",
                [c.wake_ms - c.server_ms for c in calls],
                "ms",
                "",
                None,
            ),
        ]
    return rows


def plot(path: Path, kills: list[Kill], answers: Answers, title: str) -> None:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for kind, colour in ((POOL, "#3b6ea8"), (WORKER, "#d0803a")):
        times = sorted(k.resume_s for k in kills if k.kind == kind)
        fractions = [(rank + 1) / len(times) for rank in range(len(times))]
        left.plot(times, fractions, "o-", color=colour, markersize=3, label=f"{kind} killed")
    left.plot(
        sorted(k.lease_left_s for k in kills),
        [(rank + 1) / len(kills) for rank in range(len(kills))],
        ".--",
        color="#b0b0b0",
        label="lease left at the kill",
    )
    left.axvline(RESUME_P50_TARGET_S, color="#a33", linestyle=":", linewidth=0.8, label="p50 target")
    left.axvline(RESUME_P95_TARGET_S, color="#a33", linestyle="--", linewidth=0.8, label="p95 target")
    left.set_xlabel("seconds")
    left.set_ylabel("fraction of kills")
    left.set_title(f"Resume after SIGKILL ({len(kills)} kills)")
    left.set_xlim(left=0)
    left.legend(fontsize=8)
    for (label, calls, _), colour in zip(answers, ("#3b6ea8", "#d0803a", "#b0b0b0"), strict=True):
        right.plot(range(1, len(calls) + 1), [c.overhead_ms for c in calls], ".", color=colour, label=label)
    right.axhline(OVERHEAD_P50_TARGET_MS, color="#a33", linestyle=":", linewidth=0.8, label="p50 target")
    right.set_xlabel("model call (the session's log grows with each)")
    right.set_ylabel("ms: model step minus the model server's time")
    right.set_title("Harness overhead per model call")
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    save_figure(figure, path, title)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run: {QUICK.kills} kills, {QUICK.calls} calls"
    )
    parser.add_argument("--kills", type=int, help=f"kills to time (default {DEFAULT.kills})")
    parser.add_argument(
        "--calls", type=int, help=f"model calls to time per answer length (default {DEFAULT.calls})"
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=10.0,
        help="the workers' LEASE_SECONDS (default 10, the product's)",
    )
    parser.add_argument(
        "--sweep-seconds",
        type=float,
        default=2.0,
        help="the workers' SWEEP_SECONDS (default 2, the product's)",
    )
    service_arguments(parser)
    parser.add_argument(
        "--note", default="", help="a remark saved with the results (e.g. what code was measured)"
    )
    parser.add_argument("--serve-model", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    if args.serve_model:
        serve_model(args.serve_model)
        return 0
    plan = QUICK if args.quick else DEFAULT
    plan = Plan(
        kills=args.kills or plan.kills,
        calls=args.calls or plan.calls,
        warmup=plan.warmup,
        workers=plan.workers,
    )
    settings = Settings(args.lease_seconds, args.sweep_seconds)
    began = time.monotonic()

    with Launcher("harness", database_url=args.database_url, redis_url=args.redis_url) as system:
        timings = system.folder / "model-timings.txt"
        timings.touch()
        model_url = system.model(
            command=[sys.executable, "-m", "bench.harness", "--serve-model", str(timings)]
        )
        system.start_services()  # after the model: the brains in this process read its URL at setup
        machine = machine_info()
        say(
            f"{machine['nproc']} CPUs, PostgreSQL {machine['postgresql']['server_version']} "
            f"(fsync={machine['postgresql']['fsync']}); offline model at {model_url}"
        )
        say(
            f"resume: {plan.kills} kills with LEASE_SECONDS={settings.lease_seconds:g}, SWEEP_SECONDS={settings.sweep_seconds:g}"
        )
        kills = measure_resume(plan, settings, system)
        say(f"overhead: {plan.warmup} warm-up + {plan.calls} timed model calls per answer length, in-process")
        short = measure_overhead(plan, model_url, timings, "hello")
        paced = measure_overhead(plan, model_url, timings, f"/long {LONG_WORDS}", tps=PACED_TPS)
        burst = measure_overhead(plan, model_url, timings, f"/long {LONG_WORDS}")
        answers = answers_of(short, paced, burst)
        backlog = drain_broadcasts()
        machine["load_average_at_end"] = load_average()

    rows = summary(kills, answers)
    met = sum(r["result"] == "met" for r in rows)
    total = sum(r["result"] != "-" for r in rows)
    result = {
        "benchmark": "harness",
        "quick": args.quick,
        "note": args.note,
        "machine": machine,
        "plan": asdict(plan),
        "settings": asdict(settings),
        "seconds": round(time.monotonic() - began, 1),
        "summary": rows,
        "samples": {
            "kill_kind": [k.kind for k in kills],
            "resume_s": [round(k.resume_s, 4) for k in kills],
            "lease_left_s": [round(k.lease_left_s, 4) for k in kills],
            "killed_after_s": [round(k.killed_after_s, 3) for k in kills],
            "resumed_turn_completed": [k.completed for k in kills],
            "overhead_ms_one_line": [round(c.overhead_ms, 3) for c in short],
            f"overhead_ms_{LONG_WORDS}_words_paced": [round(c.overhead_ms, 3) for c in paced],
            f"overhead_ms_{LONG_WORDS}_words_at_once": [round(c.overhead_ms, 3) for c in burst],
            "server_ms_one_line": [round(c.server_ms, 3) for c in short],
            f"server_ms_{LONG_WORDS}_words_paced": [round(c.server_ms, 3) for c in paced],
            f"server_ms_{LONG_WORDS}_words_at_once": [round(c.server_ms, 3) for c in burst],
        },
        "broadcast_backlog": backlog,
        "means": {
            **{
                f"resume_s_{kind}": round(statistics.fmean(k.resume_s for k in kills if k.kind == kind), 3)
                for kind in (POOL, WORKER)
                if any(k.kind == kind for k in kills)
            },
            "overhead_ms_one_line": round(statistics.fmean(c.overhead_ms for c in short), 3),
        },
        "targets": {"met": met, "total": total},
    }
    title = (
        f"bench/harness on {machine['nproc']} CPUs, LEASE_SECONDS={settings.lease_seconds:g}, "
        f"SWEEP_SECONDS={settings.sweep_seconds:g}, {machine['date']}"
    )
    publish(stem("harness", args.quick), result, lambda png: plot(png, kills, answers, title))
    return 0


if __name__ == "__main__":
    run(main)
