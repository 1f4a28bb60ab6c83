"""The self-hosted work queue: poll-to-ack latency of the SDK's own poller, and a bash tool round trip
through the SDK's worker beside the same step through the Docker provider, in one run (no targets: issue
16 gives none; the figures are reported with what bounds them).

    .venv/bin/python -m bench.work_queue [--quick] [--waiting 200] [--random 60] [--turns 40]

Prints a table and writes bench/results/work_queue.json and work_queue.png (work_queue-quick.* with --quick).

- **Poll-to-ack**: the SDK's poller (`client.beta.environments.work.poller`, block_ms=999, unmodified) in a
  process of its own polls a self-hosted environment; this process queues an item (`work_ensure(session)`)
  and the poller acks it. Its HTTP client's hooks note, on the machine's monotonic clock (one clock for all
  processes here), when each poll is sent and answered and when the ack is answered, so the time splits
  into work_ensure's own (the commit and the Redis wake-up), then to the poll's answer, then to the ack's.
  Two cases: the item queued while a poll waits (100 ms after the poll was sent), which is the server's
  wake-up path; and queued at a random moment (0 to 4 s after the last ack), which also meets the SDK's
  own pause of 1 to 3 s (jitter) between an empty poll and the next: that pause bounds it.
- **A bash tool round trip**: the offline model's `/bash echo hi` turn, driven by a real brain (a Celery
  worker) in two sessions taking turns: one in a self-hosted environment served by the SDK's environment
  worker (tests/harness/self_hosted_worker.py, unmodified SDK code, in its own process), timed from the
  `agent.tool_use` event to the worker's `user.tool_result`; one in a cloud environment on the Docker
  provider with its sandbox warm (its first turn is not timed), to the platform's `agent.tool_result`.
  Also the whole turn (user.message to `session.status_idle` with end_turn). Times are the events'
  `processed_at`, set by the appends.

Everything is local and removed at the end, on Ctrl-C too: PostgreSQL, Redis, Daphne, the Celery worker and beat,
the offline model, the SDK's processes (SIGKILLed) and the containers (labelled
workbench.deployment=bench-work).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if (
    str(Path(__file__).resolve().parent.parent) not in sys.path
):  # `python bench/work_queue.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT  # noqa: E402
from bench.common.processes import Failed, Processes, wait_until  # noqa: E402
from bench.common.results import pct, publish, pyplot, run, save_figure, say, stem  # noqa: E402

DEPLOYMENT = "bench-work"
TOOLSET = {"type": "agent_toolset_20260401"}
WORKER_SCRIPT = ROOT / "tests" / "harness" / "self_hosted_worker.py"
WAIT_AFTER_POLL_SENT_S = 0.1
RANDOM_DELAY_S = (0.0, 4.0)
COMMAND = "/bash echo hi"


@dataclass(frozen=True)
class Plan:
    waiting: int  # items queued while a poll waits
    random: int  # items queued at a random moment
    turns: int  # timed turns per side, the sides taking turns
    warmup: int  # untimed turns per side first (the first provisions the sandbox, claims the worker)


DEFAULT = Plan(waiting=200, random=60, turns=40, warmup=2)
QUICK = Plan(waiting=10, random=5, turns=5, warmup=1)


# -- the poller's process: the SDK's poller, its HTTP client's hooks noting the times


def poller_main(base_url: str, environment_id: str) -> None:
    """Print `polling T` as each poll is sent and `acked ID POLL_ANSWERED ACK_ANSWERED` as each item is
    handed over, T on the monotonic clock; never heartbeats (this process's reader stops the items)."""
    import asyncio

    import anthropic

    answered: dict[str, float] = {}

    async def on_request(request: Any) -> None:
        if request.url.path.endswith("/work/poll"):
            print(f"polling {time.monotonic():.6f}", flush=True)

    async def on_response(response: Any) -> None:
        path = response.request.url.path
        if path.endswith("/work/poll"):
            answered["poll"] = time.monotonic()
        elif path.endswith("/ack"):
            answered["ack"] = time.monotonic()

    async def poll() -> None:
        key = os.environ["ANTHROPIC_ENVIRONMENT_KEY"]
        hooks = {"request": [on_request], "response": [on_response]}
        http = anthropic.DefaultAsyncHttpxClient(event_hooks=hooks)
        client = anthropic.AsyncAnthropic(base_url=base_url, auth_token=key, max_retries=2, http_client=http)
        items = client.beta.environments.work.poller(
            environment_id=environment_id,
            environment_key=key,
            worker_id=os.environ.get("WORKER_ID", "bench-poller"),
            auto_stop=False,
        )
        async for item in items:
            print(f"acked {item.id} {answered['poll']:.6f} {answered['ack']:.6f}", flush=True)

    asyncio.run(poll())


# -- the rig


@dataclass
class Rig:
    processes: Processes
    base_url: str
    poll_environment: str
    poll_session: str
    poller: str  # the poller's process name
    worker_session: str  # a self-hosted session the SDK's worker serves
    docker_session: str  # a cloud session on the Docker provider

    def poller_lines(self) -> list[str]:
        return self.processes.log(self.poller).splitlines()


def remove_containers() -> None:
    from bench.common.app import remove_sandboxes, terminate_sandboxes

    with contextlib.suppress(Exception):
        terminate_sandboxes()
    removed = remove_sandboxes(DEPLOYMENT, "docker")
    say(f"removed the benchmark's containers ({removed} left by the provider's label)")


def check_docker() -> None:
    import docker
    from django.conf import settings

    try:
        engine = docker.from_env(version="auto")
        engine.api.inspect_image(settings.SANDBOX_IMAGE)
    except docker.errors.DockerException as error:
        raise Failed(
            f"bench/work_queue: no Docker engine or no image {settings.SANDBOX_IMAGE} ({error}); "
            "scripts/start-dockerd.sh and scripts/build-image.sh"
        ) from None


@contextlib.contextmanager
def rig(processes: Processes, folder: Path) -> Iterator[Rig]:
    """Daphne, a Celery brain worker on the Docker provider, the SDK's poller and worker, the environments
    and sessions, against this process's Django (the children get `processes.env`: the database, Redis and
    the model's URL); the SDK's processes are SIGKILLed and the containers removed on the way out."""
    from bench.common.app import new_agent, new_environment, new_session
    from sandboxes.work_keys import environment_key_create

    check_docker()
    processes.env.update(WORKBENCH_DEPLOYMENT=DEPLOYMENT, SANDBOX_PROVIDER="docker")
    sdk_names: list[str] = []
    stack = contextlib.ExitStack()
    with stack:
        stack.callback(remove_containers)

        def kill_sdk() -> None:
            for name in sdk_names:
                if name in processes.started:
                    with contextlib.suppress(ProcessLookupError):
                        processes.kill(name)
            say(f"killed the SDK's processes ({', '.join(sdk_names)})")

        stack.callback(kill_sdk)
        base_url = processes.daphne()
        processes.worker("brain", pool="threads", concurrency=4, loglevel="INFO", ready_within=120)
        # As deployed: beat's sweeper re-wakes a session left with work pending (a wake that found the
        # session busy while its brain was releasing the lease is otherwise lost; seen in the first runs).
        processes.beat()
        agent = new_agent("bench work", tools=[TOOLSET])
        suffix = os.urandom(3).hex()
        poll_environment = new_environment(f"bench poll {suffix}", {"type": "self_hosted"})
        hands_environment = new_environment(f"bench hands {suffix}", {"type": "self_hosted"})
        docker_environment = new_environment(f"bench docker {suffix}", {"type": "cloud"})
        poll_key = environment_key_create(poll_environment, name="bench poller")[1]
        hands_key = environment_key_create(hands_environment, name="bench worker")[1]
        workdir = folder / "worker"
        workdir.mkdir(parents=True, exist_ok=True)
        here = [sys.executable, "-m", "bench.work_queue", "--poller", base_url, poll_environment]
        processes.start(
            "sdk-poller", here, env={"ANTHROPIC_ENVIRONMENT_KEY": poll_key, "WORKER_ID": "poller"}
        )
        sdk_names.append("sdk-poller")
        worker = [sys.executable, str(WORKER_SCRIPT), "serve", base_url, hands_environment]
        worker += ["--workdir", str(workdir), "--max-idle", "3600"]
        processes.start(
            "sdk-worker", worker, env={"ANTHROPIC_ENVIRONMENT_KEY": hands_key, "WORKER_ID": "hands"}
        )
        sdk_names.append("sdk-worker")
        found = Rig(
            processes=processes,
            base_url=base_url,
            poll_environment=poll_environment,
            poll_session=new_session(agent=agent, environment=poll_environment),
            poller="sdk-poller",
            worker_session=new_session(agent=agent, environment=hands_environment),
            docker_session=new_session(agent=agent, environment=docker_environment),
        )
        wait_until(
            lambda: any(line.startswith("polling") for line in found.poller_lines()),
            60,
            "the poller",
            processes,
        )
        yield found


# -- poll-to-ack


def _acked_after(rig: Rig, seen: int, timeout: float = 30) -> tuple[int, str, float, float]:
    """The first `acked` line after the first `seen` lines: its index, the item and its two times."""

    def look() -> tuple[int, str, float, float] | None:
        lines = rig.poller_lines()
        for i in range(seen, len(lines)):
            parts = lines[i].split()
            if parts[:1] == ["acked"] and len(parts) == 4:
                return i, parts[1], float(parts[2]), float(parts[3])
        return None

    return wait_until(look, timeout, "the poller's ack", rig.processes, every=0.005)


def _poll_sent_after(rig: Rig, seen: int) -> None:
    def look() -> bool:
        return any(line.startswith("polling") for line in rig.poller_lines()[seen:])

    wait_until(look, 10, "the poller's next poll", rig.processes, every=0.005)


def measure_poll(rig: Rig, plan: Plan, *, progress: Callable[[str], None] = say) -> list[dict[str, Any]]:
    """Per case, the samples (ms): work_ensure → ack answered, and its three parts."""
    from sandboxes.work_queue import work_ensure, work_stop

    rows = []
    for case, count in (("while a poll waits", plan.waiting), ("at a random moment", plan.random)):
        parts: dict[str, list[float]] = {"total": [], "ensure": [], "to_poll": [], "to_ack": []}
        seen = len(rig.poller_lines())
        for n in range(count):
            if case == "while a poll waits":
                _poll_sent_after(rig, seen)
                time.sleep(WAIT_AFTER_POLL_SENT_S)
            else:
                time.sleep(random.uniform(*RANDOM_DELAY_S))
            started = time.monotonic()
            work_id = work_ensure(rig.poll_session)
            ensured = time.monotonic()
            index, acked_id, poll_at, ack_at = _acked_after(rig, seen)
            if acked_id != work_id:
                raise Failed(
                    f"bench/work_queue: the poller acked {acked_id}, not the item queued ({work_id})"
                )
            seen = index + 1
            work_stop(rig.poll_environment, work_id, force=True)
            parts["total"].append((ack_at - started) * 1000)
            parts["ensure"].append((ensured - started) * 1000)
            parts["to_poll"].append((poll_at - ensured) * 1000)
            parts["to_ack"].append((ack_at - poll_at) * 1000)
            if (n + 1) % 20 == 0 or n + 1 == count:
                progress(
                    f"poll-to-ack, queued {case}: {n + 1}/{count}, p50 {statistics.median(parts['total']):.1f} ms"
                )
        rows.append({"case": case, "n": count, **{k: row_of(v) for k, v in parts.items()}})
    return rows


# -- the bash tool round trip


def _turn(session_id: str, timeout: float = 90) -> dict[str, Any]:
    """Send the command and wait for the turn's end_turn idle; its events' times and the result's side."""
    from harness.services.lifecycle import session_send_events
    from sessions.models import Event

    start = Event.objects.filter(session_id=session_id).order_by("-seq").values_list("seq", flat=True).first()
    start = -1 if start is None else start
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": COMMAND}]}]
    )

    def ended() -> list[Any] | None:
        events = list(Event.objects.filter(session_id=session_id, seq__gt=start).order_by("seq"))
        done = any(
            e.type == "session.status_idle" and (e.payload.get("stop_reason") or {}).get("type") == "end_turn"
            for e in events
        )
        return events if done else None

    events = wait_until(ended, timeout, f"a turn of {session_id}", every=0.02)
    first = {}
    for e in events:
        first.setdefault(e.type, e)
    use, message = first.get("agent.tool_use"), first.get("user.message")
    result = next(
        (
            e
            for e in events
            if e.type in ("agent.tool_result", "user.tool_result")
            and use
            and e.payload.get("tool_use_id") == use.uid
        ),
        None,
    )
    idle = next(
        e
        for e in events
        if e.type == "session.status_idle" and e.payload["stop_reason"]["type"] == "end_turn"
    )
    if use is None or result is None or message is None:
        raise Failed(
            f"bench/work_queue: a turn of {session_id} had no tool call and result: {[e.type for e in events]}"
        )
    text = "".join(b.get("text", "") for b in result.payload.get("content") or [] if isinstance(b, dict))
    if text.strip() != "hi" or result.payload.get("is_error"):
        raise Failed(f"bench/work_queue: the tool's result was {text!r}, not 'hi'")
    return {
        "result_type": result.type,
        "tool_ms": (result.processed_at - use.processed_at).total_seconds() * 1000,
        "turn_ms": (idle.processed_at - message.processed_at).total_seconds() * 1000,
    }


SIDES = {"worker": ("worker_session", "user.tool_result"), "docker": ("docker_session", "agent.tool_result")}


def measure_turns(rig: Rig, plan: Plan, *, progress: Callable[[str], None] = say) -> list[dict[str, Any]]:
    """The tool round trip and the whole turn, per side, the sides taking turns."""
    samples: dict[str, dict[str, list[float]]] = {side: {"tool": [], "turn": []} for side in SIDES}
    for n in range(plan.warmup + plan.turns):
        order = list(SIDES) if n % 2 == 0 else list(reversed(SIDES))
        for side in order:
            attribute, expected = SIDES[side]
            got = _turn(getattr(rig, attribute), timeout=120 if n < plan.warmup else 60)
            if got["result_type"] != expected:
                raise Failed(
                    f"bench/work_queue: the {side} side's result was {got['result_type']}, not {expected}"
                )
            if n >= plan.warmup:
                samples[side]["tool"].append(got["tool_ms"])
                samples[side]["turn"].append(got["turn_ms"])
        if n >= plan.warmup and ((n - plan.warmup + 1) % 10 == 0 or n + 1 == plan.warmup + plan.turns):
            progress(
                f"turns: {n - plan.warmup + 1}/{plan.turns} per side, tool p50 worker "
                f"{statistics.median(samples['worker']['tool']):.1f} ms, docker "
                f"{statistics.median(samples['docker']['tool']):.1f} ms"
            )
    rows = []
    for key, measurement in (
        ("tool", "bash tool round trip: agent.tool_use → its result"),
        ("turn", "whole turn: user.message → idle (end_turn)"),
    ):
        worker, docker = row_of(samples["worker"][key]), row_of(samples["docker"][key])
        ratio = worker["p50_ms"] / docker["p50_ms"] if docker["p50_ms"] else None
        rows.append(
            {
                "measurement": measurement,
                "n": plan.turns,
                "worker": worker,
                "docker": docker,
                "ratio_p50": None if ratio is None else round(ratio, 2),
            }
        )
    return rows


# -- results


def row_of(samples: list[float]) -> dict[str, Any]:
    return {
        "p50_ms": pct(samples, 0.5),
        "p95_ms": pct(samples, 0.95),
        "max_ms": round(max(samples), 1) if samples else None,
        "samples_ms": [round(v, 2) for v in samples],
    }


def result_of(
    poll: list[dict[str, Any]],
    turns: list[dict[str, Any]],
    plan: Plan,
    *,
    machine: dict[str, Any],
    quick: bool,
    seconds: float,
) -> dict[str, Any]:
    return {
        "benchmark": "work_queue",
        "quick": quick,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "seconds": round(seconds, 1),
        "plan": plan.__dict__,
        "poll": poll,
        "turns": turns,
        "method": [
            "Poll-to-ack: the SDK's poller (block_ms=999, unmodified) in its own process; times on the machine's "
            "monotonic clock from its HTTP client's hooks. Queued while a poll waits: 100 ms after the poll was "
            "sent; at a random moment: 0 to 4 s after the previous ack.",
            "What bounds it: while a poll waits, work_ensure's commit publishes a Redis wake-up and the waiting poll "
            "hands the item out at once (the server's path: a wake-up, a claim, an HTTP answer, then the ack). "
            "Between polls the SDK's poller sleeps 1 to 3 s (its jitter after an empty poll), so an item queued "
            "then waits for the next poll: up to 3 s plus that path.",
            "Tool round trip: the offline model's `/bash echo hi`, a Celery brain worker, two sessions taking turns: "
            "self-hosted (the SDK's environment worker runs it; `user.tool_result`) and cloud on the Docker "
            "provider with a warm sandbox (`agent.tool_result`); times are the events' processed_at.",
        ],
    }


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    poll = result["poll"]
    axes[0].boxplot([row["total"]["samples_ms"] or [0] for row in poll], showfliers=True)
    axes[0].set_xticks(range(1, len(poll) + 1), [f"queued {row['case']}" for row in poll], fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms (log)")
    axes[0].set_title("poll-to-ack: work_ensure → ack answered")
    data, labels = [], []
    for row in result["turns"]:
        short = "tool round trip" if row["measurement"].startswith("bash") else "whole turn"
        for side in ("worker", "docker"):
            data.append(row[side]["samples_ms"] or [0])
            labels.append(f"{short}\n{'SDK worker' if side == 'worker' else 'Docker'}")
    axes[1].boxplot(data, showfliers=True)
    axes[1].set_xticks(range(1, len(data) + 1), labels, fontsize=8)
    axes[1].set_ylabel("ms")
    axes[1].set_title("/bash echo hi: through the SDK's worker vs the Docker provider")
    save_figure(figure, path, title)


def main() -> int:
    from bench.common.launcher import Launcher, service_arguments
    from bench.common.machine import load_average, machine_info, warn_if_busy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few samples, for a smoke run")
    parser.add_argument(
        "--waiting", type=int, help=f"items queued while a poll waits (default {DEFAULT.waiting})"
    )
    parser.add_argument(
        "--random", type=int, help=f"items queued at a random moment (default {DEFAULT.random})"
    )
    parser.add_argument("--turns", type=int, help=f"timed turns per side (default {DEFAULT.turns})")
    parser.add_argument("--logs", type=Path, help="copy the run's logs here")
    service_arguments(parser)
    args = parser.parse_args()
    base = QUICK if args.quick else DEFAULT
    plan = Plan(
        waiting=args.waiting if args.waiting is not None else base.waiting,
        random=args.random if args.random is not None else base.random,
        turns=args.turns if args.turns is not None else base.turns,
        warmup=base.warmup,
    )
    began = time.monotonic()
    with Launcher(
        "work_queue", database_url=args.database_url, redis_url=args.redis_url, logs=args.logs
    ) as system:
        system.model()
        system.start_services()
        machine = machine_info(tools=True)
        warn_if_busy(machine)
        with rig(system.processes, system.folder) as found:
            say(
                f"poll-to-ack: {plan.waiting} items queued while a poll waits, {plan.random} at random moments"
            )
            poll = measure_poll(found, plan)
            say(f"turns: {plan.warmup} untimed then {plan.turns} timed per side, alternating")
            turns = measure_turns(found, plan)
        machine["load_average_at_end"] = load_average()
        result = result_of(
            poll, turns, plan, machine=machine, quick=args.quick, seconds=time.monotonic() - began
        )
        title = f"bench/work_queue on {machine['nproc']} CPUs, Docker {machine.get('docker') or '-'}, {result['at']}"
        publish(stem("work_queue", args.quick), result, lambda png: plot(result, png, title))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--poller"]:
        poller_main(sys.argv[2], sys.argv[3])
    else:
        run(main)
