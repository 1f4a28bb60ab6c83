"""Chaos: many sessions doing scripted multi-step `/bash` turns while their brains and hands are killed.

The system: the benchmark's own PostgreSQL and Redis, the offline model, three Celery workers (prefork, four
pool processes each) and beat (the sweeper and the reaper), Docker sandboxes, at the product's defaults
(LEASE_SECONDS 10, SWEEP_SECONDS 2, WAKE_CRASH_LIMIT 3). Every session gets one message of STEPS `/bash`
lines, so its turn is STEPS tool calls in a row, each in the session's container. While they work, one fault
every ~KILL_EVERY seconds, chosen at random among what is running:
- a brain's pool process SIGKILLed (its worker's main process sees it die);
- a whole worker SIGKILLed with its pool, and a new one started at once, as a supervisor would;
- a session's sandbox container `docker kill`ed.
Faults stop when every session is idle or after --seconds; then the sessions get a grace period to finish.

The audit, per session, from its log: seq is 0..n-1 and epochs never go back; every scripted step was asked
for in exactly one `agent.tool_use` (none: lost; more: doubled) and has exactly one `agent.tool_result` (done,
or closed as an error: a killed container, or a call its brain died in, which bash cannot safely re-run); no
model request recorded more than one answer; the turn ended idle with its final message, not parked
(`retries_exhausted`) and not still running (stuck). Per fault: the time from it to the session's next event
written by a newer brain (brain kills) or to its next tool result (container kills).

Usage: .venv/bin/python -m bench.chaos [--quick] [--sessions N] [--steps N] [--kill-every S] [--seconds S]
       [--database-url URL] [--redis-url URL] [--note TEXT]

Needs a Docker engine with the sandbox image (scripts/start-dockerd.sh, scripts/build-image.sh). It prints a
table, writes bench/results/chaos.json and chaos.png (chaos-quick.* with --quick), removes the containers
it made, and exits 1 if anything was lost, doubled or stuck.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/chaos.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common.app import new_agent, new_environment, new_session  # noqa: E402
from bench.common.launcher import Launcher, service_arguments  # noqa: E402
from bench.common.machine import load_average, machine_info  # noqa: E402
from bench.common.processes import Processes, wait_until  # noqa: E402
from bench.common.results import percentile, publish, pyplot, run, save_figure, say, stem  # noqa: E402

POOL, WORKER, CONTAINER = "pool process", "whole worker", "sandbox container"
TOOLSET = [{"type": "agent_toolset_20260401"}]


@dataclass(frozen=True)
class Plan:
    sessions: int
    steps: int
    kill_every: float  # seconds between faults, on average
    seconds: float  # faults stop after this long at the latest
    workers: int = 3
    concurrency: int = 4
    grace: float = 120.0  # after the faults stop, for every turn to end


DEFAULT = Plan(sessions=40, steps=8, kill_every=1.0, seconds=120.0)
QUICK = Plan(sessions=8, steps=4, kill_every=1.5, seconds=30.0, workers=2, concurrency=2, grace=90.0)


@dataclass
class Fault:
    kind: str
    at: float  # wall clock
    session_id: str
    epoch: int | None  # the killed brain's lease epoch (brain kills)
    recovered_s: float | None = None


@dataclass
class Audit:
    session_id: str
    steps_done: int = 0
    steps_errored: int = 0
    lost: int = 0
    doubled: int = 0
    problems: list[str] = field(default_factory=list)
    parked: bool = False
    stuck: bool = False


class Brains(Processes):
    def start_worker(self, concurrency: int) -> str:
        name = f"chaos-{uuid.uuid4().hex[:8]}"
        self.worker(name, pool="prefork", concurrency=concurrency, loglevel="INFO", hostname=f"{name}@%h")
        return name

    def workers(self) -> list[str]:
        return [name for name in self.started if name.startswith("chaos-")]

    def owning(self, pid: int) -> str | None:
        for name in self.workers():
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) == self.started[name].pid:
                    return name
        return None


def script(steps: int, session_no: int) -> str:
    return "\n".join(f"/bash echo session {session_no} step {k}; sleep 0.2" for k in range(steps)) + "\ndone"


def inject(brains: Brains, plan: Plan, rng: random.Random, docker: Any, deployment: str) -> Fault | None:
    """One fault of a kind chosen at random among those something is running for; None if nothing is."""
    from sandboxes.models import Sandbox
    from sessions.models import Session

    leased = list(
        Session.objects.exclude(lease_owner="")
        .filter(lease_expires_at__isnull=False)
        .values_list("id", "lease_owner", "lease_epoch")
    )
    ours = [(s, owner, epoch) for s, owner, epoch in leased if brains.owning(int(owner.rsplit(":", 1)[1]))]
    running = {
        c.labels.get("workbench.sandbox"): c
        for c in docker.containers.list(filters={"label": f"workbench.deployment={deployment}"})
    }
    hands = [
        (sandbox_id, session_id)
        for sandbox_id, session_id in Sandbox.objects.filter(id__in=[k for k in running if k]).values_list(
            "id", "session_id"
        )
        if session_id
    ]
    kinds = [POOL] * 4 + [WORKER] if ours else []
    kinds += [CONTAINER] * 2 if hands else []
    if not kinds:
        return None
    kind = rng.choice(kinds)
    if kind == CONTAINER:
        sandbox_id, session_id = rng.choice(hands)
        at = time.time()
        with contextlib.suppress(Exception):  # it may have stopped meanwhile
            running[sandbox_id].kill()
        return Fault(kind, at, session_id, None)
    session_id, owner, epoch = rng.choice(ours)
    pid = int(owner.rsplit(":", 1)[1])
    if kind == POOL:
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return Fault(kind, at, session_id, epoch)
    victim = brains.owning(pid)
    if victim is None:
        return None
    at = brains.kill(victim)
    brains.start_worker(plan.concurrency)
    return Fault(kind, at, session_id, epoch)


def audit(session_id: str, steps: int) -> Audit:
    from harness.brain import has_pending_work
    from sessions.models import Event, Session

    found = Audit(session_id)
    events = list(Event.objects.filter(session_id=session_id).order_by("seq"))
    if [e.seq for e in events] != list(range(len(events))):
        found.problems.append("seq is not 0..n-1")
    epochs = [e.lease_epoch for e in events if e.lease_epoch is not None]
    if epochs != sorted(epochs):
        found.problems.append("an older epoch wrote after a newer one")
    uses = [e for e in events if e.type == "agent.tool_use"]
    results = Counter(e.payload.get("tool_use_id") for e in events if e.type == "agent.tool_result")
    errored = {
        e.payload.get("tool_use_id")
        for e in events
        if e.type == "agent.tool_result" and e.payload.get("is_error")
    }
    asked: Counter[str] = Counter()
    for use in uses:
        command = str(use.payload.get("input", {}).get("command", ""))
        asked[command] += 1
        answers = results[use.uid] + (
            results[use.payload["id"]] if use.payload.get("id") not in (None, use.uid) else 0
        )
        if answers == 0:
            found.lost += 1
            found.problems.append(f"tool_use {use.seq} has no result")
        elif answers > 1:
            found.doubled += 1
            found.problems.append(f"tool_use {use.seq} has {answers} results")
        elif use.uid in errored or use.payload.get("id") in errored:
            found.steps_errored += 1
        else:
            found.steps_done += 1
    for command, count in asked.items():
        if count > 1:
            found.doubled += count - 1
            found.problems.append(f"{command!r} asked for {count} times")
    missing = steps - len(asked)
    if missing > 0:
        found.lost += missing
        found.problems.append(f"{missing} scripted steps never asked for")
    # At most one answer per model request.
    open_request: str | None = None
    answers_of: Counter[str] = Counter()
    for event in events:
        if event.type == "span.model_request_start":
            open_request = event.uid
        elif event.type == "span.model_request_end":
            open_request = None
        elif event.type == "agent.message" and open_request is not None:
            answers_of[open_request] += 1
    if any(count > 1 for count in answers_of.values()):
        found.problems.append("a model request recorded more than one answer")
    session = Session.objects.get(id=session_id)
    last = events[-1] if events else None
    found.parked = any(e.type == "brain.parked" for e in events)
    idle = (
        session.status == Session.Status.IDLE and not session.lease_owner and not has_pending_work(session_id)
    )
    found.stuck = not idle or last is None or last.type != "session.status_idle"
    if not found.parked and not found.stuck and not any(e.type == "agent.message" for e in events):
        found.problems.append("the turn ended without its final message")
    return found


def recovery(fault: Fault) -> float | None:
    from sessions.models import Event

    after = Event.objects.filter(session_id=fault.session_id).order_by("seq")
    if fault.epoch is not None:
        first = after.filter(lease_epoch__gt=fault.epoch).first()
    else:
        first = after.filter(type="agent.tool_result").filter(processed_at__gt=_datetime(fault.at)).first()
    return None if first is None else max(0.0, first.processed_at.timestamp() - fault.at)


def _datetime(at: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, tz=UTC)


def all_settled(session_ids: list[str]) -> bool:
    from sessions.models import Session

    return not Session.objects.filter(id__in=session_ids).exclude(
        status=Session.Status.IDLE
    ).exists() and not (Session.objects.filter(id__in=session_ids).exclude(lease_owner="").exists())


def steps_done_now(session_ids: list[str]) -> int:
    from sessions.models import Event

    return Event.objects.filter(session_id__in=session_ids, type="agent.tool_result").count()


def measure(
    plan: Plan, system: Launcher
) -> tuple[list[Fault], list[Audit], list[tuple[float, int]], float, float]:
    """The faults injected, the sessions' audits, progress over time, how long faults ran, and the wall-clock
    time the sessions started (progress counts from it)."""
    import docker as docker_sdk
    from django.conf import settings
    from django.db import connections

    client = docker_sdk.from_env()
    deployment = settings.WORKBENCH_DEPLOYMENT
    rng = random.Random(18)
    faults: list[Fault] = []
    progress: list[tuple[float, int]] = []
    env = {"REAP_SECONDS": "86400"}  # the reaper would remove other deployments' containers on this engine
    with Brains(system.folder, {**system.env, **env}) as brains:
        say(f"starting {plan.workers} celery workers ({plan.concurrency} pool processes each) and beat")
        started = [brains.start_worker(plan.concurrency) for _ in range(plan.workers)]
        wait_until(lambda: all(brains.ready(w) for w in started), 90, "the workers", every=0.1)
        brains.beat(loglevel="INFO", max_interval=1)
        agent = new_agent("chaos", tools=TOOLSET)
        environment = new_environment("chaos")
        say(f"{plan.sessions} sessions of {plan.steps} /bash steps; a fault every ~{plan.kill_every:g} s")
        began, began_at = time.monotonic(), time.time()
        session_ids = [
            new_session(script(plan.steps, i), agent=agent, environment=environment)
            for i in range(plan.sessions)
        ]
        next_fault = began + rng.expovariate(1 / plan.kill_every)
        last_say = began
        while time.monotonic() - began < plan.seconds and not all_settled(session_ids):
            now = time.monotonic()
            if now >= next_fault:
                fault = inject(brains, plan, rng, client, deployment)
                if fault is not None:
                    faults.append(fault)
                next_fault = now + rng.expovariate(1 / plan.kill_every)
            progress.append((now - began, steps_done_now(session_ids)))
            if now - last_say >= 10:
                kinds = Counter(f.kind for f in faults)
                say(
                    f"  {now - began:5.0f} s: {progress[-1][1]}/{plan.sessions * plan.steps} steps answered, "
                    f"faults {dict(kinds)}"
                )
                last_say = now
            connections.close_all()
            time.sleep(0.1)
        faulting_s = time.monotonic() - began
        say(
            f"faults stop after {faulting_s:.0f} s ({len(faults)}); waiting up to {plan.grace:g} s for every turn"
        )
        grace_end = time.monotonic() + plan.grace
        while time.monotonic() < grace_end and not all_settled(session_ids):
            progress.append((time.monotonic() - began, steps_done_now(session_ids)))
            time.sleep(0.5)
        progress.append((time.monotonic() - began, steps_done_now(session_ids)))
        audits = [audit(s, plan.steps) for s in session_ids]
        for fault in faults:
            fault.recovered_s = recovery(fault)
        for container in client.containers.list(
            all=True, filters={"label": f"workbench.deployment={deployment}"}
        ):
            with contextlib.suppress(Exception):
                container.remove(force=True)
    return faults, audits, progress, faulting_s, began_at


def summary(
    plan: Plan, faults: list[Fault], audits: list[Audit]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The faults by kind with their recovery times, and the audit's counts."""
    rows: list[dict[str, Any]] = []
    for kind in (POOL, WORKER, CONTAINER):
        of_kind = [f for f in faults if f.kind == kind]
        times = [f.recovered_s for f in of_kind if f.recovered_s is not None]
        rows.append(
            {
                "fault": f"{kind} killed",
                "n": len(of_kind),
                "recovered p50 s": round(percentile(times, 0.5), 2) if times else None,
                "recovered p95 s": round(percentile(times, 0.95), 2) if times else None,
                "not recovered": len(of_kind) - len(times),
            }
        )
    total = plan.sessions * plan.steps
    counts = {
        "steps scripted": total,
        "steps done": sum(a.steps_done for a in audits),
        "steps closed as errors": sum(a.steps_errored for a in audits),
        "lost": sum(a.lost for a in audits),
        "doubled": sum(a.doubled for a in audits),
        "sessions parked": sum(a.parked for a in audits),
        "sessions stuck": sum(a.stuck for a in audits),
        "sessions with other problems": sum(bool(a.problems) and not (a.lost or a.doubled) for a in audits),
    }
    return rows, [{"audit": name, "n": value} for name, value in counts.items()]


def plot(
    path: Path, faults: list[Fault], progress: list[tuple[float, int]], began: float, title: str
) -> None:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    left.plot(
        [t for t, _ in progress], [n for _, n in progress], color="#3b6ea8", label="tool results written"
    )
    colours = {POOL: "#d0803a", WORKER: "#a33", CONTAINER: "#6a9a4a"}
    for kind, colour in colours.items():
        at = [f.at - began for f in faults if f.kind == kind]
        if at:
            left.vlines(
                at,
                0,
                1,
                transform=left.get_xaxis_transform(),
                colors=colour,
                linewidth=0.6,
                alpha=0.7,
                label=kind,
            )
    left.set_xlabel("seconds since the sessions started")
    left.set_ylabel("tool results in the logs")
    left.set_title("Progress under faults")
    left.legend(fontsize=8)
    for kind, colour in colours.items():
        times = sorted(f.recovered_s for f in faults if f.kind == kind and f.recovered_s is not None)
        if times:
            right.plot(
                times,
                [(i + 1) / len(times) for i in range(len(times))],
                "o-",
                markersize=3,
                color=colour,
                label=kind,
            )
    right.set_xlabel("seconds from the fault to the session going on")
    right.set_ylabel("fraction of faults")
    right.set_title("Recovery per fault kind")
    right.set_xlim(left=0)
    right.legend(fontsize=8)
    save_figure(figure, path, title)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run: {QUICK.sessions} sessions of {QUICK.steps} steps"
    )
    parser.add_argument("--sessions", type=int, help=f"sessions (default {DEFAULT.sessions})")
    parser.add_argument("--steps", type=int, help=f"/bash steps per session (default {DEFAULT.steps})")
    parser.add_argument(
        "--kill-every", type=float, help=f"mean seconds between faults (default {DEFAULT.kill_every:g})"
    )
    parser.add_argument(
        "--seconds", type=float, help=f"faults stop after this long at most (default {DEFAULT.seconds:g})"
    )
    service_arguments(parser)
    parser.add_argument(
        "--note", default="", help="a remark saved with the results (e.g. what code was measured)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    base = QUICK if args.quick else DEFAULT
    plan = Plan(
        sessions=args.sessions or base.sessions,
        steps=args.steps or base.steps,
        kill_every=args.kill_every or base.kill_every,
        seconds=args.seconds or base.seconds,
        workers=base.workers,
        concurrency=base.concurrency,
        grace=base.grace,
    )
    started = time.monotonic()
    with Launcher("chaos", database_url=args.database_url, redis_url=args.redis_url) as system:
        system.model()
        system.start_services(max_connections=200)
        machine = machine_info()
        faults, audits, progress, faulting_s, began_at = measure(plan, system)
        machine["load_average_at_end"] = load_average()
    by_kind, counts = summary(plan, faults, audits)
    broken = [a for a in audits if a.lost or a.doubled or a.stuck or a.parked or a.problems]
    for found in broken[:10]:
        say(f"  {found.session_id}: {'; '.join(found.problems) or ('parked' if found.parked else 'stuck')}")
    result = {
        "benchmark": "chaos",
        "quick": args.quick,
        "note": args.note,
        "machine": machine,
        "plan": asdict(plan),
        "seconds": round(time.monotonic() - started, 1),
        "faulting_seconds": round(faulting_s, 1),
        "faults_by_kind": by_kind,
        "audit": counts,
        "fault_log": [asdict(f) | {"at": round(f.at - began_at, 3)} for f in faults],
        "sessions_with_problems": [asdict(a) for a in broken],
        "targets": {"met": int(not broken), "total": 1},
    }
    title = (
        f"bench/chaos: {plan.sessions} sessions x {plan.steps} steps, {len(faults)} faults, {machine['date']}"
    )
    publish(stem("chaos", args.quick), result, lambda png: plot(png, faults, progress, began_at, title))
    return 1 if broken else 0


if __name__ == "__main__":
    run(main)
