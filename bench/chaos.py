"""Chaos: many sessions doing scripted multi-step `/bash` turns while their brains, hands and services fail,
with SSE and WebSocket clients following every session.

The system: the benchmark's own PostgreSQL and Redis, the offline model, three Celery workers (prefork, four
pool processes each), beat (the sweeper and the reaper) and Daphne, Docker sandboxes, at the product's defaults
(LEASE_SECONDS 10, SWEEP_SECONDS 2, WAKE_CRASH_LIMIT 3). Every session gets one message of STEPS `/bash`
lines, so its turn is STEPS tool calls in a row, each in the session's container. While they work, one fault
every ~KILL_EVERY seconds, chosen at random among what is running:
- a brain's pool process SIGKILLed (its worker's main process sees it die);
- a whole worker SIGKILLed with its pool, and a new one started at once, as a supervisor would;
- a session's sandbox container `docker kill`ed;
and, one every --service-every seconds in turn, a service SIGKILLed and started again as a supervisor would:
- Redis (no persistence, as `make run` runs it: the queued wakes and the channel layer's groups are gone);
- PostgreSQL (crash recovery; every connection of every process breaks);
- Daphne (every client's stream and socket breaks; it comes back on the same port).
Faults stop when every session is idle or after --seconds; then the sessions get a grace period to finish.

Every session is followed from its first event by an SSE client (`/v1/sessions/{id}/events/stream`) and a
WebSocket client (`/ws/sessions/{id}/`) with an API key (bench/common/followers.py), each reconnecting after
any failure from the last seq it received (`Last-Event-ID`, `?after=`).

The audit, per session, from its log: seq is 0..n-1 and epochs never go back; every scripted step was asked
for in exactly one `agent.tool_use` (none: lost; more: doubled) and has exactly one `agent.tool_result` (done,
or closed as an error: a killed container, or a call its brain died in, which bash cannot safely re-run); no
model request recorded more than one answer; the turn ended idle with its final message, not parked
(`retries_exhausted`) and not still running (stuck). Every client, once its session settled, received every
event of the log exactly once, in order, as the log has it. Then the reaper runs (every sandbox idle, as after
its TTL): no container of the run is left. Per fault: the time from it to the session's next event written by a
newer brain (brain kills), to its next tool result (container kills), or, for a service, to a client receiving
the next event of each session a brain was working on when it failed.

Usage: .venv/bin/python -m bench.chaos [--quick] [--sessions N] [--steps N] [--step-sleep S] [--kill-every S]
       [--service-every S] [--seconds S] [--database-url URL] [--redis-url URL] [--note TEXT]

Services are restarted only when they are the benchmark's own (no --database-url / --redis-url).

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

from bench.common.app import new_agent, new_api_key, new_environment, new_session  # noqa: E402
from bench.common.followers import Followers  # noqa: E402
from bench.common.launcher import Launcher, service_arguments  # noqa: E402
from bench.common.machine import load_average, machine_info  # noqa: E402
from bench.common.processes import Processes, wait_until  # noqa: E402
from bench.common.results import percentile, publish, pyplot, run, save_figure, say, stem  # noqa: E402

POOL, WORKER, CONTAINER = "pool process", "whole worker", "sandbox container"
REDIS, POSTGRES, DAPHNE = "Redis", "PostgreSQL", "Daphne"
SERVICES = (REDIS, POSTGRES, DAPHNE)
TOOLSET = [{"type": "agent_toolset_20260401"}]


@dataclass(frozen=True)
class Plan:
    sessions: int
    steps: int
    kill_every: float  # seconds between faults, on average
    seconds: float  # faults stop after this long at the latest
    service_every: float = 10.0  # seconds between service restarts (the first after half of it)
    step_sleep: float = 0.2  # each /bash step's sleep
    workers: int = 3
    concurrency: int = 4
    grace: float = 120.0  # after the faults stop, for every turn to end


# Steps long enough that the sessions outlast several restarts of each service.
DEFAULT = Plan(sessions=40, steps=12, kill_every=1.0, seconds=150.0, step_sleep=1.0)
QUICK = Plan(
    sessions=8, steps=4, kill_every=1.5, seconds=30.0, service_every=6.0, workers=2, concurrency=2, grace=90.0
)


@dataclass
class Fault:
    kind: str
    at: float  # wall clock
    session_id: str | None  # the session of a brain or sandbox fault
    epoch: int | None  # the killed brain's lease epoch (brain kills)
    recovered_s: float | None = None  # a service's: the slowest of its sessions'
    running: list[str] = field(
        default_factory=list
    )  # a service fault's: the sessions brains were working on then
    recoveries: list[float] = field(default_factory=list)  # a service fault's, one per session going on
    down_s: float | None = None  # a service fault's: from the kill to the service answering again


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
    tail: list[str] = field(default_factory=list)  # a session with a problem: its last events and its state


class Brains(Processes):
    """The workers, beat and Daphne. A worker that exits on its own is started again at once, as `make run`'s
    supervisor does, and counted (`exited`): the audit says whether its sessions lost anything."""

    concurrency = 4
    exited: list[tuple[float, str, str]]  # when, which worker, the last line of its log

    def start_worker(self, concurrency: int) -> str:
        self.concurrency = concurrency
        name = f"chaos-{uuid.uuid4().hex[:8]}"
        self.worker(name, pool="prefork", concurrency=concurrency, loglevel="INFO", hostname=f"{name}@%h")
        return name

    def check(self) -> None:
        if not hasattr(self, "exited"):
            self.exited = []
        for name in self.workers():
            process = self.started[name]
            if process.poll() is not None:
                last = next((line for line in reversed(self.log(name).splitlines()) if line.strip()), "")
                self.exited.append((time.time(), name, last[-300:]))
                say(f"  worker {name} exited with {process.returncode} ({last[-120:]}); starting another")
                del self.started[name]
                self.start_worker(self.concurrency)
        super().check()

    def workers(self) -> list[str]:
        return [name for name in self.started if name.startswith("chaos-")]

    def owning(self, pid: int) -> str | None:
        for name in self.workers():
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) == self.started[name].pid:
                    return name
        return None


def script(steps: int, session_no: int, sleep: float) -> str:
    lines = [f"/bash echo session {session_no} step {k}; sleep {sleep:g}" for k in range(steps)]
    return "\n".join(lines) + "\ndone"


def resilient(read: Any, *args: Any, default: Any = None, wait_s: float = 90.0) -> Any:
    """`read(*args)` against the database, tried again while PostgreSQL restarts (this process's connections
    break with it); `default` if it does not answer within `wait_s`."""
    from django.db import Error, connections

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return read(*args)
        except Error:
            connections.close_all()
            if time.monotonic() > deadline:
                return default
            time.sleep(0.2)


class Services:
    """The services a fault may restart: the benchmark's own Redis and PostgreSQL, and its Daphne."""

    def __init__(self, system: Launcher, brains: Brains, daphne_url: str) -> None:
        self.system, self.brains, self.url = system, brains, daphne_url
        self.kinds = [
            k for k in SERVICES if k == DAPHNE or (system.redis if k == REDIS else system.postmaster)
        ]

    def restart(self, kind: str) -> float:
        """SIGKILL the service and start it again; the wall-clock time of the kill."""
        if kind == REDIS:
            return self.system.restart_redis()
        if kind == POSTGRES:
            return self.system.restart_postgres()
        at = self.brains.kill("daphne")
        self.brains.daphne(port=int(self.url.rsplit(":", 1)[1]), timeout=120)
        return at


def running_sessions(session_ids: list[str]) -> list[str]:
    """The sessions a brain is working on now (running, under a lease): those waiting for a free pool
    process would wait anyway, and their time says how long the queue is, not what the fault cost."""
    from sessions.models import Session

    return list(
        Session.objects.filter(id__in=session_ids, status=Session.Status.RUNNING)
        .exclude(lease_owner="")
        .values_list("id", flat=True)
    )


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
        for sandbox_id, session_id in Sandbox.objects.filter(
            id__in=[k for k in running if k], session__status=Session.Status.RUNNING
        ).values_list("id", "session_id")
        if session_id
    ]  # a session's that still works: an ended turn's would have no next tool call to recover in
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


def longest_stall(session_id: str, began_at: float) -> dict[str, Any]:
    """The longest time the session's log did not grow while it had work (before its last event), what was
    written just before and after it, and when it began (seconds since the sessions started)."""
    from sessions.models import Event

    rows = list(
        Event.objects.filter(session_id=session_id)
        .order_by("seq")
        .values_list("seq", "type", "processed_at", "payload")
    )
    gaps = [(b[2].timestamp() - a[2].timestamp(), a, b) for a, b in zip(rows, rows[1:], strict=False)]
    if not gaps:
        return {"session_id": session_id, "stall_s": 0.0}
    gap, before, after = max(gaps, key=lambda g: g[0])
    return {
        "session_id": session_id,
        "stall_s": round(gap, 2),
        "from_s": round(before[2].timestamp() - began_at, 2),
        "before": before[1],
        "after": after[1],
        "woken_by": (after[3] or {}).get("woken_by") if after[1] == "brain.recovered" else None,
    }


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
    if found.stuck or found.problems:
        found.tail = [f"{e.seq} {e.type} (epoch {e.lease_epoch})" for e in events[-8:]] + [
            f"status {session.status}, lease {session.lease_owner or '-'}, "
            f"pending work {has_pending_work(session_id)}"
        ]
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
) -> tuple[list[Fault], list[Audit], dict[str, Any], list[tuple[float, int]], float, float]:
    """The faults injected, the sessions' audits, the clients' audit, progress over time, how long faults ran,
    and the wall-clock time the sessions started (progress counts from it)."""
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
        url = brains.daphne()
        services = Services(system, brains, url)
        agent = new_agent("chaos", tools=TOOLSET)
        environment = new_environment("chaos")
        say(
            f"{plan.sessions} sessions of {plan.steps} /bash steps; a fault every ~{plan.kill_every:g} s; "
            f"a restart of {', '.join(services.kinds)} in turn every {plan.service_every:g} s; an SSE and a "
            "WebSocket client on every session"
        )
        began, began_at = time.monotonic(), time.time()
        session_ids = [
            new_session(script(plan.steps, i, plan.step_sleep), agent=agent, environment=environment)
            for i in range(plan.sessions)
        ]
        followers = Followers(url, new_api_key("chaos"), session_ids)
        followers.start()
        next_fault = began + rng.expovariate(1 / plan.kill_every)
        next_service, service_turn = began + plan.service_every / 2, 0
        last_say = began
        while time.monotonic() - began < plan.seconds and not resilient(all_settled, session_ids):
            now = time.monotonic()
            if now >= next_service and services.kinds:
                kind = services.kinds[service_turn % len(services.kinds)]
                running = resilient(running_sessions, session_ids, default=[])
                at = services.restart(kind)
                faults.append(Fault(kind, at, None, None, running=running, down_s=time.time() - at))
                service_turn += 1
                next_service = time.monotonic() + plan.service_every
            elif now >= next_fault:
                fault = resilient(inject, brains, plan, rng, client, deployment)
                if fault is not None:
                    faults.append(fault)
                next_fault = now + rng.expovariate(1 / plan.kill_every)
            brains.check()  # a worker that exited on its own is started again
            progress.append(
                (
                    now - began,
                    resilient(steps_done_now, session_ids, default=progress[-1][1] if progress else 0),
                )
            )
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
        while time.monotonic() < grace_end and not resilient(all_settled, session_ids):
            brains.check()
            progress.append((time.monotonic() - began, resilient(steps_done_now, session_ids)))
            time.sleep(0.5)
        progress.append((time.monotonic() - began, steps_done_now(session_ids)))
        logs = {s: session_log(s) for s in session_ids}
        lengths = {s: len(log) for s, log in logs.items()}
        say("waiting for every client to receive its session's last event")
        caught_up = wait_for(lambda: followers.reached(lengths), CLIENT_GRACE_SECONDS)
        followers.stop()
        clients = followers.audit(logs)
        clients["caught up"] = caught_up
        audits = [audit(s, plan.steps) for s in session_ids]
        stalls = sorted((longest_stall(s, began_at) for s in session_ids), key=lambda x: -x["stall_s"])
        clients["longest stalls"] = stalls[:12]
        for fault in faults:
            if fault.kind in SERVICES:
                service_recovery(fault, followers)
            else:
                fault.recovered_s = recovery(fault)
        clients["containers left after the reaper"] = reap_and_count(client, deployment, environment)
        brains.check()
        clients["workers that exited on their own"] = [
            {"at": round(at - began_at, 1), "worker": name, "last line": last}
            for at, name, last in brains.exited
        ]
        for container in client.containers.list(
            all=True, filters={"label": f"workbench.deployment={deployment}"}
        ):
            with contextlib.suppress(Exception):
                container.remove(force=True)
    return faults, audits, clients, progress, faulting_s, began_at


CLIENT_GRACE_SECONDS = 60.0  # after the sessions settled, for every client to receive the last event


def wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def session_log(session_id: str) -> list[tuple[int, str]]:
    from sessions.models import Event

    return list(Event.objects.filter(session_id=session_id).order_by("seq").values_list("seq", "uid"))


def service_recovery(fault: Fault, followers: Followers) -> None:
    """For each session running when the service failed: from the failure to a client (the first of its two)
    receiving the session's first event written after it. A session with no event after it (its turn had
    just ended) did not need the service again, and is not counted."""
    for session_id in fault.running:
        arrivals = [
            r.at
            for f in followers.followers
            if f.session_id == session_id
            for r in f.received
            if r.processed_at > fault.at
        ]
        if arrivals:
            fault.recoveries.append(max(0.0, min(arrivals) - fault.at))
    fault.recovered_s = max(fault.recoveries) if fault.recoveries else None


def reap_and_count(client: Any, deployment: str, environment_id: str) -> int:
    """Run the reaper as beat's would once every sandbox of the run is idle past its TTL (made 0 here) and no
    provisioning is in flight (every session settled): the containers of this deployment still there."""
    from sandboxes import reaper
    from sandboxes.models import Environment

    found = Environment.objects.get(id=environment_id)
    Environment.objects.filter(id=environment_id).update(
        config={**found.config, "sandbox": {**(found.config.get("sandbox") or {}), "idle_ttl_seconds": 0}}
    )
    from datetime import timedelta

    reaper.PROVISIONING_GRACE = timedelta(0)
    time.sleep(1.0)  # idle past 0 s, by the database's clock
    reaper.reap_leftovers()
    return len(client.containers.list(all=True, filters={"label": f"workbench.deployment={deployment}"}))


def summary(
    plan: Plan, faults: list[Fault], audits: list[Audit], clients: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The faults by kind with their recovery times (a service's: one per session it held up), and the
    audit's counts."""
    rows: list[dict[str, Any]] = []
    for kind in (POOL, WORKER, CONTAINER, *SERVICES):
        of_kind = [f for f in faults if f.kind == kind]
        downs = [f.down_s for f in of_kind if f.down_s is not None]
        if kind in SERVICES:
            times = [t for f in of_kind for t in f.recoveries]
        else:
            times = [f.recovered_s for f in of_kind if f.recovered_s is not None]
        rows.append(
            {
                "fault": f"{kind} {'restarted' if kind in SERVICES else 'killed'}",
                "n": len(of_kind),
                "sessions at work": sum(len(f.running) for f in of_kind)
                if kind in SERVICES
                else len(of_kind),
                "down p50 s": round(percentile(downs, 0.5), 2) if downs else None,
                "recovered p50 s": round(percentile(times, 0.5), 2) if times else None,
                "recovered p95 s": round(percentile(times, 0.95), 2) if times else None,
                "not recovered": (len(of_kind) - len(times)) if kind not in SERVICES else None,
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
        "clients (SSE and WebSocket)": clients["clients"],
        "clients that missed an event": clients["clients that missed an event"],
        "clients that saw an event twice": clients["clients that saw an event twice"],
        "clients that saw events out of order": clients["clients that saw events out of order"],
        "clients that saw an event unlike the log's": clients["clients that saw an event unlike the log's"],
        "client reconnections": clients["reconnections"],
        "containers left after the reaper": clients["containers left after the reaper"],
        "workers that exited on their own (started again)": len(clients["workers that exited on their own"]),
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
    colours = {
        POOL: "#d0803a",
        WORKER: "#a33",
        CONTAINER: "#6a9a4a",
        REDIS: "#8a4fb0",
        POSTGRES: "#2f7f8f",
        DAPHNE: "#c9a227",
    }
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
        times = sorted(
            t
            for f in faults
            if f.kind == kind
            for t in (f.recoveries if kind in SERVICES else [f.recovered_s])
            if t is not None
        )
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
    parser.add_argument(
        "--service-every",
        type=float,
        help=f"seconds between restarts of Redis, PostgreSQL and Daphne, in turn (default {DEFAULT.service_every:g}; 0: none)",
    )
    parser.add_argument(
        "--step-sleep",
        type=float,
        help=f"each /bash step's sleep in seconds (default {DEFAULT.step_sleep:g})",
    )
    service_arguments(parser)
    parser.add_argument("--keep-logs", help="copy the processes' logs into this folder at the end")
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
        service_every=base.service_every if args.service_every is None else args.service_every,
        step_sleep=base.step_sleep if args.step_sleep is None else args.step_sleep,
        workers=base.workers,
        concurrency=base.concurrency,
        grace=base.grace,
    )
    started = time.monotonic()
    logs = Path(args.keep_logs) if args.keep_logs else None
    with Launcher("chaos", database_url=args.database_url, redis_url=args.redis_url, logs=logs) as system:
        system.model()
        system.start_services(max_connections=200)
        machine = machine_info()
        faults, audits, clients, progress, faulting_s, began_at = measure(plan, system)
        machine["load_average_at_end"] = load_average()
    by_kind, counts = summary(plan, faults, audits, clients)
    broken = [a for a in audits if a.lost or a.doubled or a.stuck or a.parked or a.problems]
    for found in broken[:10]:
        say(f"  {found.session_id}: {'; '.join(found.problems) or ('parked' if found.parked else 'stuck')}")
    for problem in clients["problems"][:10]:
        say(f"  client {problem}")
    clients_broken = bool(clients["problems"]) or not clients["caught up"]
    left = clients["containers left after the reaper"]
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
        "clients": {k: v for k, v in clients.items() if k != "longest stalls"},
        "longest_stalls": clients["longest stalls"],
        "targets": {"met": int(not broken) + int(not clients_broken) + int(not left), "total": 3},
    }
    title = (
        f"bench/chaos: {plan.sessions} sessions x {plan.steps} steps, {len(faults)} faults, {machine['date']}"
    )
    publish(stem("chaos", args.quick), result, lambda png: plot(png, faults, progress, began_at, title))
    return 1 if broken or clients_broken or left else 0


if __name__ == "__main__":
    run(main)
