"""Time to first token: a sandbox provisioned (and its repository cloned) before the first model call, or not.

Every measured session starts in one of four environments, interleaved round-robin at a Poisson arrival
rate: **coupled** (`provisioning: eager`: the turn provisions the sandbox and clones the session's
repository into it before its first model call), **decoupled** (lazy, provisioned ahead: the turn starts the
sandbox and the clone beside its first model request, and the first tool call takes them), **decoupled +
warm pool** (the same, with `warm_pool` sandboxes kept provisioned, each with the repository already checked
out: the environment names it as its `pool_repository`, and the pool is filled once the background sessions
have fetched it into the workers' repository cache) and **decoupled, not ahead** (lazy with
`speculative: never`: the first tool call provisions, as before provisioning ahead). Each session is created with
a `github_repository` resource pointing at a realistic repository served by `git daemon` on loopback. A
client opens the session's SSE stream with `event_deltas[]=agent.message`, POSTs one plain-text user message
(the first model call needs no tool), and takes **time to first token** from just before that POST to the
first `event_delta` arriving on its stream. The offline model waits a fixed, stated time before its first
token, so the platform's own share is the rest. Every eighth session of each mode then sends a second
message that makes the model call `bash` (`git rev-parse HEAD` in the cloned repository, checked against the
served tip): the **first tool result** shows where the decoupled modes pay for the sandbox and the clone,
and what provisioning ahead and the warm pool take off; the **two-message exchange** runs from the first
POST to the second turn's idle.

Throughout, a background of sessions is kept running at once (50 by default): each loops through agent
turns of thinking, two `bash` calls (a long `sleep`, then git/ls in its own sandbox and clone) and an answer, and
is sent its next message as soon as it goes idle. The number of sessions actually running is sampled from
the database every second and reported with the results.

Phase 1 is the comparison above. Phase 2 measures the platform's own share of TTFT "with 50 sessions running
at once" on its own: decoupled sessions only, at a steady rate, beside the same running background, without
phase 1's stream of coupled clones competing for the machine. Both phases' figures are reported; the target
on the platform's share is judged on phase 2. Beside phase 2's decoupled sessions run as many *decoupled,
not ahead* ones, one halfway between each two (`--no-platform-control` leaves them out): the
share without provisioning ahead, measured in the same seconds, so that a slow stretch of the whole machine
(this shared virtual machine's host takes up to a core at times) is not read as provisioning ahead's cost.

Everything is real and local (bench/common/launcher.py): its own PostgreSQL and Redis, migrations, Daphne,
Celery workers (threads pool) and beat (the sweeper, the reaper, pool maintenance), Docker sandboxes from
workbench-sandbox:latest, `git daemon` and the offline model in their own processes. Sessions are archived
as they finish (once a provisioning ahead that outlived the turns has ended: a sandbox's facts, such as whether
it started from a checkout image, are read then) and their sandboxes ended at once as the reaper ends an ended
session's: terminated, or, provisioned ahead and never used, returned to the environment for the next session
(sandboxes/returns.py; SPECULATIVE_RETURNED_MAX=0 in the environment turns that off); at the end every
container labelled with the run's `workbench.deployment` is removed.

Usage: .venv/bin/python -m bench.ttft [--quick] [--per-mode N] [--rate R] [--background N]
       [--platform-sessions N] [--no-platform-control] [--seed S] [--note TEXT] [--logs DIR]

Prints progress and a table, writes bench/results/ttft.json and ttft.png (ttft-quick.* with --quick) and
exits 0 whether or not the targets are met (non-zero only if the run itself fails).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import math
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/ttft.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT  # noqa: E402
from bench.common.app import new_api_key, release_sandboxes, remove_sandboxes  # noqa: E402
from bench.common.launcher import Launcher  # noqa: E402
from bench.common.machine import (  # noqa: E402
    btrfs_commits,
    busy,
    cpu_jiffies,
    cpu_pressure_us,
    load_average,
    machine_info,
    stolen,
)
from bench.common.processes import free_port, wait_until  # noqa: E402
from bench.common.results import (  # noqa: E402
    RESULTS,
    ms,
    pct,
    percentile,
    publish,
    pyplot,
    run,
    save_figure,
    say,
    stem,
)

MODES = ("coupled", "decoupled", "decoupled+pool", "decoupled, not ahead")
AHEAD_MODES = ("decoupled", "decoupled+pool")  # provisioned ahead of the first tool call
CONTROL_MODE = "decoupled, not ahead"  # phase 2's control: the same sessions, provisioning nothing ahead
TOOL_RESULT_TARGET = 1.5  # first tool result p50, at most this many times the coupled mode's
# The reference system's figures, taken as this benchmark's targets.
P50_REDUCTION_TARGET = 0.60
P95_REDUCTION_TARGET = 0.90
PLATFORM_P50_TARGET_MS = 25.0
RUNNING_TARGET = 50

USER_MESSAGE = (
    "Before we change anything, tell me in two sentences what this repository is for and "
    "which part of it handles incoming requests."
)
REPO_MOUNT = "/workspace/repo"
TOOL_MESSAGE = f"/bash git -C {REPO_MOUNT} rev-parse HEAD"
BACKGROUND_STARTING = 4  # background sessions getting their first sandbox and clone at once
CLIENT_THREADS = 64  # the client's threads for database reads, sandbox removals, polls; its pool
BACKGROUND_THOUGHT = (
    "The failing check points at the request parser; I will look at the recent history "
    "and the tree before opening a file, so the change stays small."
)
# Where the CPU went, by part: a label and the name prefix of the launched processes it counts.
PARTS = {
    "web (Daphne)": "daphne",
    "workers (Celery)": "worker-",
    "beat": "beat",
    "git daemon": "git-daemon",
    "offline model": "model",
}


@dataclass(frozen=True)
class Plan:
    per_mode: int  # measured sessions per mode
    warmup: int  # sessions per mode run first and left out of the figures
    rate: float  # mean arrivals per second (Poisson), over all modes
    background: int  # sessions kept running at once besides the measured ones
    tool_turn_every: int  # every Nth session of each mode sends the tool-calling second message
    warm_pool: int  # the decoupled+pool environment's pool size
    model_ttft_ms: float  # the offline model's fixed time to first token
    model_tps: float  # its streaming rate, tokens per second
    background_tool_seconds: float  # each background bash call sleeps this long first
    platform_sessions: int  # phase 2: decoupled sessions for the platform's share, with the background on
    platform_rate: float  # their mean arrivals per second
    # Phase 2 also runs as many sessions that provision nothing ahead (`speculative: never`), at the same rate,
    # interleaved: the share without provisioning ahead, measured in the same seconds as the share with it.
    platform_control: bool = True
    provider: str = "docker"  # the sandboxes' provider: docker, or local (bubblewrap)
    workers: int = 4  # Celery worker processes (threads pool)
    threads: int = 25  # threads per worker
    files: int = 3000  # files in the served repository
    commits: int = 30  # its history
    seed: int = 20260401


DEFAULT = Plan(
    per_mode=70,  # 210 measured sessions in all, three modes interleaved
    warmup=3,
    rate=0.5,
    background=RUNNING_TARGET,
    tool_turn_every=4,
    warm_pool=6,
    model_ttft_ms=300.0,
    model_tps=50.0,
    background_tool_seconds=15.0,
    platform_sessions=100,
    platform_rate=1.0,
)
QUICK = replace(
    DEFAULT, per_mode=20, warmup=2, background=10, tool_turn_every=2, warm_pool=3, platform_sessions=20
)


@dataclass
class Sample:
    """One measured session."""

    phase: str  # "compare" (the three modes) or "platform" (decoupled only, for the platform's share)
    index: int
    mode: str
    warmup: bool
    tool_turn: bool
    arrival_s: float  # scheduled arrival, seconds from the start of the first measured phase
    session_id: str = ""
    ttft_ms: float | None = None  # POST of the user message -> first event_delta on the stream
    post_ms: float | None = None  # the POST's own round trip
    turn_ms: float | None = None  # POST -> session.status_idle
    tool_result_ms: float | None = None  # second POST -> agent.tool_result on the stream
    exchange_ms: float | None = None  # first POST -> the second turn's session.status_idle
    tool_ok: bool | None = None  # the tool saw the served repository's tip
    # From the log's own timestamps, relative to the POST (client wall clock, same host):
    logged_ms: float | None = None  # -> the user.message committed
    woken_ms: float | None = None  # -> session.status_running (a brain took the lease and began the turn)
    to_request_ms: float | None = None  # -> span.model_request_start (queue, lease, fold, [sandbox, clone])
    provision_ms: float | None = None  # coupled: status_running -> sandbox.provisioned
    clone_ms: float | None = None  # coupled: sandbox.provisioned -> span.model_request_start
    pooled: bool | None = None  # the sandbox came from the warm pool
    returned: bool = False  # ... from those an earlier session returned unused (sandboxes/returns.py)
    prepared_kept: bool = False  # ... with the repository checked out, and the session kept that checkout
    checkout_image: bool = False  # the sandbox started from an image holding the repository's checkout
    recovered: int = 0  # brain.recovered events: a lease lapsed and the sweeper woke another brain
    errors: list[str] = field(default_factory=list)


@dataclass
class Phase:
    """What the machine, the model and this client did during one measured phase."""

    name: str
    start_s: float = 0.0  # from the start of the first phase
    start_epoch: float = 0.0  # the wall clock then (to line the phase up with other records of the machine)
    seconds: float = 0.0
    running: list[int] = field(default_factory=list)  # sessions running, sampled each second
    cpu_busy: list[float] = field(default_factory=list)
    # The share of the CPUs' time the hypervisor gave to others (steal), each second: a machine-wide slowness
    # no process of ours is charged for; it is in cpu_busy too.
    cpu_stolen: list[float] = field(default_factory=list)
    pg_connections: list[int] = field(default_factory=list)
    live_sandboxes: list[int] = field(default_factory=list)
    model_probe_ms: list[float] = field(default_factory=list)  # the model asked directly
    loop_lag_ms: list[float] = field(default_factory=list)  # this client's event loop, late by
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # our processes, by part
    cpu_pressure: float | None = None  # share of the time some task of the machine waited for a CPU
    load_average: list[float] = field(default_factory=list)
    # The engine's btrfs: the transaction commits in each second that had any (their ms in all, and the last
    # one's, which is the longest seen when one second held one commit).
    btrfs_commits: list[tuple[float, int, float, float]] = field(default_factory=list)  # (s, n, ms, last)

    def summary(self) -> dict[str, Any]:
        def mean(values: list[Any]) -> float | None:
            return round(statistics.fmean(values), 1) if values else None

        return {
            "seconds": round(self.seconds, 1),
            "running_at_once": {
                "mean": mean(self.running) or 0.0,
                "min": min(self.running, default=0),
                "max": max(self.running, default=0),
            },
            "started_epoch": round(self.start_epoch, 3),
            "cpu_busy_mean": round(statistics.fmean(self.cpu_busy), 3) if self.cpu_busy else None,
            "cpu_stolen": {
                "mean": round(statistics.fmean(self.cpu_stolen), 3) if self.cpu_stolen else None,
                "max": max(self.cpu_stolen, default=None),
                "seconds_over_a_quarter": sum(x > 0.25 for x in self.cpu_stolen),
            },
            "cpu_pressure": self.cpu_pressure,
            "load_average_at_end": self.load_average,
            "cores_used": {
                k: round(v / self.seconds, 2)
                for k, v in sorted(self.cpu_seconds.items(), key=lambda kv: -kv[1])
                if v > 0 and self.seconds
            },
            "pg_connections_max": max(self.pg_connections, default=0),
            "live_sandboxes_mean": mean(self.live_sandboxes),
            "model_direct_ttft_ms": {
                "n": len(self.model_probe_ms),
                "p50": pct(self.model_probe_ms, 0.5),
                "p95": pct(self.model_probe_ms, 0.95),
                "p99": pct(self.model_probe_ms, 0.99),
            },
            "client_loop_lag_ms": {"p50": pct(self.loop_lag_ms, 0.5), "p99": pct(self.loop_lag_ms, 0.99)},
            "btrfs_commits": {
                "n": sum(n for _, n, _, _ in self.btrfs_commits),
                "ms": round(sum(ms for _, _, ms, _ in self.btrfs_commits)),
                "longest_seen_ms": max((last for *_, last in self.btrfs_commits), default=None),
                "by_second": self.btrfs_commits,
            },
        }


# --- The repository ----------------------------------------------------------------------------------------

WORDS = (  # noqa: SIM905 - a line of words reads better than forty lines of them
    "request response session event handler config value result error index buffer stream parse render token "
    "cache client server worker queue state item node tree path file line count limit offset start stop name "
    "kind router schema record batch retry lease"
).split()


def build_repository(folder: Path, *, files: int, commits: int, seed: int) -> dict[str, Any]:
    """A deterministic repository of source-like files (a few binary assets), with history; packed without
    deltas so that `git daemon` serves a shallow clone by copying rather than recompressing."""
    rng = random.Random(seed)
    repo = folder / "repo.git.work"
    repo.mkdir(parents=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.invalid",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    }

    def git(*args: str, at: Path = repo) -> str:
        done = subprocess.run(
            ["git", "-C", str(at), *args], check=True, capture_output=True, text=True, env=env
        )
        return done.stdout.strip()

    def source(lines: int) -> str:
        out = []
        for i in range(lines):
            indent = "    " * rng.randrange(0, 3)
            w = rng.choices(WORDS, k=rng.randrange(3, 9))
            if rng.random() < 0.1:
                out.append(f"{indent}def {w[0]}_{w[1]}_{i}(self, {', '.join(w[2:])}):")
            else:
                out.append(
                    f"{indent}{w[0]} = {'_'.join(w[1:3])}({', '.join(w[3:])})  # {rng.randrange(10**6)}"
                )
        return "\n".join(out) + "\n"

    git("init", "-q", "-b", "main")
    paths = []
    for i in range(files):
        path = (
            f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}/{rng.choice(WORDS)}_{i}"
            f"{rng.choice(('.py', '.py', '.py', '.ts', '.md', '.json'))}"
        )
        paths.append(path)
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(source(max(5, int(rng.lognormvariate(4.3, 0.8)))))
    (repo / "assets").mkdir()
    for i in range(6):
        (repo / f"assets/image_{i}.bin").write_bytes(rng.randbytes(500_000))
    (repo / "README.md").write_text("# bench-service\n\nA request router and its workers (generated).\n")
    git("add", "-A")
    git("commit", "-q", "-m", "Initial import")
    for c in range(commits):
        for path in rng.sample(paths, 60):
            with open(repo / path, "a") as out:
                out.write(source(20))
        git("commit", "-q", "-a", "-m", f"Change {c + 1}: adjust {rng.choice(WORDS)} handling")
    git("repack", "-q", "-a", "-d", "-f", "--window=0", "--depth=0")
    git("prune-packed")
    tree_bytes = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts)
    pack_bytes = sum(p.stat().st_size for p in (repo / ".git").rglob("*.pack"))
    served = folder / "repo.git"
    git("clone", "-q", "--bare", str(repo), str(served), at=folder)
    git("repack", "-q", "-a", "-d", "-f", "--window=0", "--depth=0", at=served)
    shutil.rmtree(repo)
    return {
        "files": len(paths) + 7,
        "commits": commits + 1,
        "tree_mb": round(tree_bytes / 1e6, 1),
        "pack_mb": round(pack_bytes / 1e6, 1),
        "head": git("rev-parse", "HEAD", at=served),
    }


def serve_repository(system: Launcher, plan: Plan) -> dict[str, Any]:
    """The repository, built in the run's folder and served by `git daemon` on a free loopback port."""
    folder = system.folder / "git"
    say(f"building the repository ({plan.files} files, {plan.commits + 1} commits) in {system.folder}")
    repo = build_repository(folder, files=plan.files, commits=plan.commits, seed=plan.seed)
    port = free_port()
    say(
        f"  {repo['files']} files, {repo['tree_mb']} MB of tree, pack {repo['pack_mb']} MB, head "
        f"{repo['head'][:12]}; serving it with git daemon on 127.0.0.1:{port}"
    )
    daemon = ["git", "daemon", "--reuseaddr", f"--base-path={folder}", "--export-all", "--listen=127.0.0.1"]
    system.processes.start("git-daemon", [*daemon, f"--port={port}", "--max-connections=128", str(folder)])
    return {**repo, "url": f"git://127.0.0.1:{port}/repo.git"}


# --- The client: the /v1 API and its SSE stream -----------------------------------------------------------


class Api:
    def __init__(self, base_url: str, key: str):
        import httpx

        self.http = httpx.AsyncClient(
            base_url=base_url,
            headers={"authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(60.0),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
        )

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:300]}")
        return response.json()

    async def send(self, session_id: str, text: str) -> None:
        await self.post(
            f"/v1/sessions/{session_id}/events",
            {"events": [{"type": "user.message", "content": [{"type": "text", "text": text}]}]},
        )


class Stream:
    """A session's SSE stream with agent.message deltas, read by a task that stamps each event as it arrives
    (monotonic clock)."""

    def __init__(self, api: Api, session_id: str):
        self.api, self.session_id = api, session_id
        self.queue: asyncio.Queue[tuple[float, str, dict[str, Any] | None]] = asyncio.Queue()
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        import httpx

        try:
            async with self.api.http.stream(
                "GET",
                f"/v1/sessions/{self.session_id}/events/stream",
                params=[("event_deltas[]", "agent.message")],
                timeout=httpx.Timeout(60.0, read=None),
            ) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"stream: {response.status_code}")
                name, at = "", 0.0
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        name, at = line[7:], time.perf_counter()
                        if name == "ping" and not self.opened.done():
                            self.opened.set_result(None)
                    elif line.startswith("data: ") and name not in ("ping", "event_start", "event_delta"):
                        self.queue.put_nowait((at, name, json.loads(line[6:])))
                    elif line.startswith("data: ") and name == "event_delta":
                        self.queue.put_nowait((at, name, None))
        except Exception as error:  # noqa: BLE001 - handed to whoever waits on the stream
            if not self.opened.done():
                self.opened.set_exception(error)
            self.queue.put_nowait((time.perf_counter(), "stream.error", {"error": repr(error)}))

    async def next(self, *names: str, timeout: float) -> tuple[float, str, dict[str, Any] | None]:
        """The next event of one of these names (earlier others are dropped, except errors, which raise)."""
        deadline = time.perf_counter() + timeout
        while True:
            at, name, data = await asyncio.wait_for(
                self.queue.get(), max(0.01, deadline - time.perf_counter())
            )
            if name in names:
                return at, name, data
            if name == "stream.error":
                raise RuntimeError((data or {}).get("error"))

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


# --- The run ------------------------------------------------------------------------------------------------


class Run:
    def __init__(
        self,
        plan: Plan,
        api: Api,
        repo: dict[str, Any],
        model_url: str,
        cpu_snapshot: Callable[[], dict[str, float]],
        checkpoint: Callable[[Run], None],
    ):
        self.plan, self.api, self.repo, self.model_url = plan, api, repo, model_url
        self.cpu_snapshot = cpu_snapshot
        self.checkpoint = checkpoint  # called every progress line, to save what is measured so far
        self.agent, self.environments = "", {}
        self.samples: list[Sample] = []
        self.phases: list[Phase] = []
        self.phase: Phase | None = None  # the one being measured
        # (seconds from the first phase's start, sessions running)
        self.timeline: list[tuple[float, int]] = []
        self.background_ids: list[str] = []
        self.background_turns = 0
        self.background_errors = 0
        self.in_flight = 0
        self.t0 = 0.0
        self.stopping = asyncio.Event()
        self.cleanup = asyncio.Semaphore(3)  # sandbox removals at once (dockerd does the work)

    def resource(self) -> dict[str, Any]:
        return {"type": "github_repository", "url": self.repo["url"], "mount_path": REPO_MOUNT}

    def pool_config(self, size: int) -> dict[str, Any]:
        return {
            "provider": self.plan.provider,
            "provisioning": "lazy",
            "warm_pool": size,
            "pool_repository": {"url": self.repo["url"], "mount_path": REPO_MOUNT},
        }

    async def fill_pool(self) -> None:
        """Fill decoupled+pool's warm pool now that the background's clones have put the repository in the
        workers' cache, so that its sandboxes come with the repository checked out (a pool filled before
        any session fetched the repository prepares none)."""
        environment = self.environments["decoupled+pool"]
        config = {"type": "cloud", "sandbox": self.pool_config(self.plan.warm_pool)}
        await self.api.post(f"/v1/environments/{environment}", {"config": config})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            ready, prepared = await asyncio.to_thread(pool_count, environment)
            if ready >= self.plan.warm_pool:
                break
            await asyncio.sleep(1)
        say(
            f"warm pool of decoupled+pool: {ready} of {self.plan.warm_pool} ready, {prepared} with the repository"
        )

    async def new_session(self, environment: str, agent: str | None = None) -> str:
        body = {"agent": agent or self.agent, "environment_id": environment, "resources": [self.resource()]}
        return (await self.api.post("/v1/sessions", body))["id"]

    async def setup(self) -> tuple[str, str]:
        """The measured sessions' agent and one environment per mode; the background's agent and environment."""
        toolset = [{"type": "agent_toolset_20260401"}]
        agent = {"name": "ttft", "model": "claude-sonnet-5-5", "tools": toolset}
        self.agent = (await self.api.post("/v1/agents", agent))["id"]
        window = {"type": "window", "last_events": 60}
        background = {**agent, "name": "ttft-background", "context": window}
        background_agent = (await self.api.post("/v1/agents", background))["id"]
        sandbox = {
            "coupled": {"provider": self.plan.provider, "provisioning": "eager"},
            "decoupled": {"provider": self.plan.provider, "provisioning": "lazy"},
            "decoupled+pool": self.pool_config(0),  # filled once the repository is in the cache
            "decoupled, not ahead": {
                "provider": self.plan.provider,
                "provisioning": "lazy",
                "speculative": "never",
            },
            "background": {"provider": self.plan.provider, "provisioning": "lazy"},
        }
        environments = {}
        for mode, config in sandbox.items():
            body = {"name": f"ttft {mode}", "config": {"type": "cloud", "sandbox": config}}
            environments[mode] = (await self.api.post("/v1/environments", body))["id"]
        background_environment = environments.pop("background")
        self.environments = environments
        return background_agent, background_environment

    # -- one measured session

    async def measured(self, sample: Sample) -> None:
        await asyncio.sleep(max(0.0, self.t0 + sample.arrival_s - time.perf_counter()))
        self.in_flight += 1
        stream: Stream | None = None
        try:
            sample.session_id = await self.new_session(self.environments[sample.mode])
            stream = Stream(self.api, sample.session_id)
            await asyncio.wait_for(asyncio.shield(stream.opened), 30)
            posted_wall, posted = time.time(), time.perf_counter()
            await self.api.send(sample.session_id, USER_MESSAGE)
            sample.post_ms = (time.perf_counter() - posted) * 1000
            at, name, _ = await stream.next("event_delta", "session.status_idle", timeout=300)
            if name != "event_delta":
                raise RuntimeError("the turn ended without a text delta")
            sample.ttft_ms = (at - posted) * 1000
            at, _, _ = await stream.next("session.status_idle", timeout=300)
            sample.turn_ms = (at - posted) * 1000
            if sample.tool_turn:
                posted2 = time.perf_counter()
                await self.api.send(sample.session_id, TOOL_MESSAGE)
                at, _, result = await stream.next("agent.tool_result", timeout=600)
                sample.tool_result_ms = (at - posted2) * 1000
                text = "".join(b.get("text", "") for b in (result or {}).get("content", []))
                sample.tool_ok = self.repo["head"] in text
                if not sample.tool_ok:
                    sample.errors.append(f"tool result without the repository's head: {text[:200]!r}")
                at, _, _ = await stream.next("session.status_idle", timeout=300)
                sample.exchange_ms = (at - posted) * 1000
            await asyncio.to_thread(read_log, sample, posted_wall)
        except Exception as error:  # noqa: BLE001 - a failed session is reported, not fatal
            sample.errors.append(f"{type(error).__name__}: {error}")
        finally:
            self.in_flight -= 1
            if stream is not None:
                await stream.close()
            if sample.session_id:
                async with self.cleanup:
                    await self.retire(sample.session_id)

    async def retire(self, session_id: str) -> None:
        """Archive the session, as a user would when it is done, and end its sandboxes as the reaper does for an
        ended session, at once rather than at its next round: one provisioned ahead and never used goes back
        to its environment for the next session (sandboxes/returns.py), any other is terminated."""
        with contextlib.suppress(Exception):
            await self.api.post(f"/v1/sessions/{session_id}/archive", {})
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.to_thread(release_sandboxes, session_id), 120)

    # -- the background of running sessions

    def background_message(self, *, first: bool = False) -> str:
        if first:  # get the sandbox and the clone, and answer at once
            return f"/bash git -C {REPO_MOUNT} log --oneline -1"
        s = f"{self.plan.background_tool_seconds:g}"
        return "\n".join(
            [
                f"/think {BACKGROUND_THOUGHT}",
                f"/bash sleep {s}; git -C {REPO_MOUNT} log --oneline -1",
                f"/bash sleep {s}; ls {REPO_MOUNT}/src | wc -l",
            ]
        )

    async def start_background(self, agent: str, environment: str) -> None:
        """Start the background sessions a few at a time (each clones the repository on its first tool call),
        and wait until every one has had a tool result in its own sandbox."""
        if not self.plan.background:
            return
        say(
            f"starting {self.plan.background} background sessions, at most {BACKGROUND_STARTING} cloning at once"
        )
        began, last_said = time.perf_counter(), 0.0
        while True:
            ready, failed = await asyncio.to_thread(background_state, self.background_ids)
            starting = len(self.background_ids) - ready
            for _ in range(
                min(BACKGROUND_STARTING - starting, self.plan.background - len(self.background_ids))
            ):
                session_id = await self.new_session(environment, agent)
                self.background_ids.append(session_id)
                await self.api.send(session_id, self.background_message(first=True))
            if ready >= self.plan.background:
                break
            if time.perf_counter() - last_said > 15:
                last_said = time.perf_counter()
                say(
                    f"  {time.perf_counter() - began:4.0f} s: {ready} of {self.plan.background} ready"
                    + (f", {failed} sandbox or clone errors so far" if failed else "")
                )
            if time.perf_counter() - began > 900:
                raise SystemExit(
                    f"bench/ttft: only {ready} of {self.plan.background} background sessions got a "
                    "sandbox and a tool result in 15 minutes"
                )
            await asyncio.sleep(0.5)
        say(
            f"  all {len(self.background_ids)} background sessions hold a sandbox with the repository "
            f"({time.perf_counter() - began:.0f} s)"
        )

    async def keep_background_running(self) -> None:
        """Send each background session its next message as soon as it is idle."""
        pending: set[str] = set()

        async def resend(session_id: str) -> None:
            try:
                await self.api.send(session_id, self.background_message())
                self.background_turns += 1
            except Exception:  # noqa: BLE001 - counted; the next poll tries again
                self.background_errors += 1
            finally:
                pending.discard(session_id)

        while not self.stopping.is_set():
            idle = await asyncio.to_thread(idle_sessions, self.background_ids)
            for session_id in idle:
                if session_id not in pending:
                    pending.add(session_id)
                    asyncio.create_task(resend(session_id))
            await asyncio.sleep(0.25)

    async def stop_background(self) -> None:
        say(
            f"archiving {len(self.background_ids)} background sessions (their containers go with the deployment's)"
        )
        archive = [self.api.post(f"/v1/sessions/{x}/archive", {}) for x in self.background_ids]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*archive, return_exceptions=True), 60)

    # -- what the machine and the model are doing meanwhile

    async def sample_system(self) -> None:
        previous, commits = cpu_jiffies(), btrfs_commits()
        while not self.stopping.is_set():
            await asyncio.sleep(1.0)
            running, connections, sandboxes = await asyncio.to_thread(system_counts)
            now, committed = cpu_jiffies(), btrfs_commits()
            share, taken, previous = busy(previous, now), stolen(previous, now), now
            if (phase := self.phase) is not None:
                at = round(time.perf_counter() - self.t0, 1)
                if commits and committed and committed[0] > commits[0]:
                    phase.btrfs_commits.append(
                        (at, committed[0] - commits[0], round(committed[1] - commits[1]), committed[2])
                    )
                self.timeline.append((at, running))
                phase.running.append(running)
                phase.cpu_busy.append(share)
                phase.cpu_stolen.append(taken)
                phase.pg_connections.append(connections)
                phase.live_sandboxes.append(sandboxes)
            commits = committed

    async def probe_model(self) -> None:
        """The offline model's own time to first token, asked directly (not through the platform)."""
        import httpx

        body = {
            "model": "claude-sonnet-5-5",
            "max_tokens": 16,
            "stream": True,
            "messages": [{"role": "user", "content": "probe"}],
        }
        headers = {"x-api-key": "probe", "anthropic-version": "2023-06-01"}
        async with httpx.AsyncClient(base_url=self.model_url, timeout=30) as http:
            while not self.stopping.is_set():
                began = time.perf_counter()
                with contextlib.suppress(Exception):
                    async with http.stream("POST", "/v1/messages", json=body, headers=headers) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("event: content_block_delta"):
                                if self.phase is not None:
                                    self.phase.model_probe_ms.append((time.perf_counter() - began) * 1000)
                                break
                await asyncio.sleep(2.0)

    async def watch_loop_lag(self) -> None:
        """How late this client's own event loop runs: if it lagged, the client would inflate the figures."""
        while not self.stopping.is_set():
            began = time.perf_counter()
            await asyncio.sleep(0.05)
            if self.phase is not None:
                self.phase.loop_lag_ms.append((time.perf_counter() - began - 0.05) * 1000)

    async def progress(self) -> None:
        while not self.stopping.is_set():
            await asyncio.sleep(15)
            if (phase := self.phase) is None:
                continue
            done = [
                x for x in self.samples if x.phase == phase.name and x.ttft_ms is not None and not x.warmup
            ]
            parts = []
            for mode in MODES if phase.name == "compare" else ("decoupled", CONTROL_MODE):
                values = [x.ttft_ms for x in done if x.mode == mode]
                parts.append(
                    f"{mode} {len(values)}" + (f" p50 {percentile(values, 0.5):.0f} ms" if values else "")
                )
            failed = sum(bool(x.errors) for x in self.samples if x.phase == phase.name)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.checkpoint, self)
            say(
                f"  {time.perf_counter() - self.t0 - phase.start_s:5.0f} s  "
                + " | ".join(parts)
                + f" | in flight {self.in_flight}, running {phase.running[-1] if phase.running else 0}, CPU "
                f"{100 * statistics.fmean(phase.cpu_busy[-15:] or [0]):.0f}%"
                + (
                    f" ({100 * taken:.0f}% taken by the host)"
                    if (taken := statistics.fmean(phase.cpu_stolen[-15:] or [0])) >= 0.05
                    else ""
                )
                + (f", failed {failed}" if failed else "")
            )

    # -- the measured phases

    def compare_schedule(self) -> list[Sample]:
        """The three modes round-robin at Poisson arrivals; warm-up sessions first; every Nth a tool turn."""
        rng = random.Random(self.plan.seed)
        arrival, schedule = 0.0, []
        counts: Counter[str] = Counter()
        every = self.plan.tool_turn_every
        for i in range((self.plan.warmup + self.plan.per_mode) * len(MODES)):
            mode = MODES[i % len(MODES)]
            k = counts[mode] - self.plan.warmup
            counts[mode] += 1
            schedule.append(
                Sample("compare", i, mode, k < 0, k >= 0 and k % every == every - 1, round(arrival, 3))
            )
            arrival += rng.expovariate(self.plan.rate)
        return schedule

    def platform_schedule(self) -> list[Sample]:
        """Decoupled sessions at Poisson arrivals; with the control, one session not provisioning ahead halfway
        between each two of them: as many, over the same seconds, and the decoupled ones meet the load they
        would alone, and more."""
        rng, arrivals = random.Random(self.plan.seed + 1), [0.0]
        for _ in range(self.plan.platform_sessions):
            arrivals.append(arrivals[-1] + rng.expovariate(self.plan.platform_rate))
        schedule = [("decoupled", at) for at in arrivals[:-1]]
        if self.plan.platform_control:
            schedule += [(CONTROL_MODE, (at + after) / 2) for at, after in itertools.pairwise(arrivals)]
        schedule.sort(key=lambda item: item[1])
        return [
            Sample("platform", i, mode, False, False, round(at, 3)) for i, (mode, at) in enumerate(schedule)
        ]

    async def measure(self, name: str, schedule: list[Sample]) -> Phase:
        """Run one phase's sessions at their arrival times, with the machine's figures taken meanwhile."""
        if not self.phases:
            self.t0 = time.perf_counter()
        phase = Phase(name, start_s=time.perf_counter() - self.t0, start_epoch=time.time())
        for sample in schedule:
            sample.arrival_s = round(sample.arrival_s + phase.start_s, 3)
        self.samples += schedule
        cpu_before, pressure_before = self.cpu_snapshot(), cpu_pressure_us()
        self.phase = phase
        await asyncio.gather(*(self.measured(sample) for sample in schedule))
        self.phase = None
        phase.seconds = time.perf_counter() - self.t0 - phase.start_s
        cpu_after, pressure_after = self.cpu_snapshot(), cpu_pressure_us()
        phase.cpu_seconds = {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 1) for k in cpu_after}
        if pressure_before is not None and pressure_after is not None:
            phase.cpu_pressure = round((pressure_after - pressure_before) / 1e6 / phase.seconds, 3)
        phase.load_average = load_average()
        self.phases.append(phase)
        return phase

    async def measure_phases(self) -> None:
        """Phase 1 (the three modes), then phase 2 (the platform's share), beside the running background."""
        await self.fill_pool()
        compare = self.compare_schedule()
        say(
            f"phase 1: {len(compare)} sessions ({self.plan.warmup} warm-up + {self.plan.per_mode} per mode), "
            f"Poisson arrivals at {self.plan.rate:g}/s (the last at {compare[-1].arrival_s:.0f} s), modes round-robin"
        )
        await self.measure("compare", compare)
        if self.plan.platform_sessions:
            platform = self.platform_schedule()
            control = sum(x.mode == CONTROL_MODE for x in platform)
            say(
                f"phase 2: {len(platform) - control} decoupled sessions at {self.plan.platform_rate:g}/s with the "
                "background running, for the platform's share"
                + (
                    f"; and {control} {CONTROL_MODE}, one halfway between each two (the control)"
                    if control
                    else ""
                )
            )
            await self.measure("platform", platform)


# Synchronous reads for the client's threads (Django's ORM).


SETTLE_SECONDS = 120.0  # how long a session's facts wait for its provisioning ahead to end


def client_pool(connection: Any) -> None:
    """The client's database pool as large as its threads: each keeps the connection it opened, and with
    fewer (DATABASE_POOL_MAX, 40, is sized for a worker) a loaded run's 41st waited 30 s and failed its
    session with "couldn't get a connection"."""
    pool = connection.settings_dict.get("OPTIONS", {}).get("pool")
    if isinstance(pool, dict) and pool.get("max_size", 0) < CLIENT_THREADS:
        connection.close_pool()
        pool["max_size"] = CLIENT_THREADS


def settled(session_id: str) -> bool:
    """Wait until no sandbox of the session is still provisioning (the model may answer without a tool before
    its provisioning ahead ends); whether none is. Its facts (the checkout image) are read after, and only
    then is the session retired, so its provisioning is never cut short by the client."""
    from sandboxes.models import Sandbox

    provisioning = Sandbox.objects.filter(session_id=session_id, status=Sandbox.Status.PROVISIONING)
    deadline = time.monotonic() + SETTLE_SECONDS
    while provisioning.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def read_log(sample: Sample, posted_wall: float) -> None:
    """Where the time went, by the log's own timestamps, once the session's provisioning has settled."""
    from sessions.models import Event

    if not settled(sample.session_id):
        sample.errors.append(f"a sandbox still provisioning {SETTLE_SECONDS:g} s after the turns ended")

    events = list(
        Event.objects.filter(session_id=sample.session_id)
        .order_by("seq")
        .values_list("type", "processed_at", "payload")
    )
    first: dict[str, float] = {}
    for kind, at, payload in events:
        first.setdefault(kind, at.timestamp())
        if kind == "session.error":
            sample.errors.append(f"session.error: {payload.get('error', {}).get('message', '')[:200]}")
        if kind == "brain.recovered" and "epoch" in payload:
            sample.recovered += 1
        if kind == "sandbox.provisioned" and sample.pooled is None:
            sample.pooled = bool(payload.get("pooled"))
            sample.returned = bool(payload.get("returned"))
    from sandboxes.models import Sandbox

    if sample.pooled or sample.returned:
        sample.prepared_kept = Sandbox.objects.filter(
            session_id=sample.session_id, labels__prepared__kept=True
        ).exists()
    sample.checkout_image = Sandbox.objects.filter(
        session_id=sample.session_id, labels__checkout_image=True
    ).exists()
    if "user.message" in first:
        sample.logged_ms = (first["user.message"] - posted_wall) * 1000
    if "session.status_running" in first:
        sample.woken_ms = (first["session.status_running"] - posted_wall) * 1000
    if "span.model_request_start" in first:
        sample.to_request_ms = (first["span.model_request_start"] - posted_wall) * 1000
    if sample.mode == "coupled" and "sandbox.provisioned" in first and "session.status_running" in first:
        sample.provision_ms = (first["sandbox.provisioned"] - first["session.status_running"]) * 1000
        sample.clone_ms = (first["span.model_request_start"] - first["sandbox.provisioned"]) * 1000
    if sample.mode == "coupled" and first.get("sandbox.provisioned", math.inf) > first.get(
        "span.model_request_start", -math.inf
    ):
        sample.errors.append("coupled session whose first model call came before its sandbox")


def background_state(session_ids: list[str]) -> tuple[int, int]:
    """(sessions that had a tool result in a live sandbox, sandbox and clone errors so far)."""
    from sandboxes.models import Sandbox
    from sessions.models import Event

    with_result = set(
        Event.objects.filter(session_id__in=session_ids, type="agent.tool_result")
        .values_list("session_id", flat=True)
        .distinct()
    )
    ready = Sandbox.objects.filter(session_id__in=with_result, status=Sandbox.Status.READY).count()
    failed = Event.objects.filter(
        session_id__in=session_ids, type__in=("sandbox.failed", "session.error")
    ).count()
    return ready, failed


def idle_sessions(session_ids: list[str]) -> list[str]:
    from sessions.models import Session

    return list(
        Session.objects.filter(id__in=session_ids, status=Session.Status.IDLE).values_list("id", flat=True)
    )


def system_counts() -> tuple[int, int, int]:
    from django.db import connection

    from sandboxes.models import Sandbox
    from sessions.models import Session

    running = Session.objects.filter(status=Session.Status.RUNNING, archived_at__isnull=True).count()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
        connections = cursor.fetchone()[0]
    sandboxes = Sandbox.objects.filter(status=Sandbox.Status.READY).count()
    return running, connections, sandboxes


def pool_count(environment_id: str) -> tuple[int, int]:
    """(the environment's pooled sandboxes that are ready, those of them with the repository checked out)."""
    from sandboxes.models import Sandbox

    ready = Sandbox.objects.filter(
        environment_id=environment_id, session__isnull=True, status="ready", labels__pooled=True
    )
    return ready.count(), ready.filter(labels__has_key="prepared").count()


# --- Figures ------------------------------------------------------------------------------------------------


def reduction(coupled: float | None, other: float | None) -> float | None:
    return None if not coupled or other is None else round(1 - other / coupled, 3)


def good(samples: list[Sample], phase: str, mode: str) -> list[Sample]:
    return [
        x
        for x in samples
        if x.phase == phase and x.mode == mode and not x.warmup and x.ttft_ms is not None and not x.errors
    ]


def parts(ok: list[Sample], plan: Plan) -> dict[str, float | None]:
    """p50s of where TTFT went, from the POST: committed, a brain began the turn, the model request went out;
    and after it, the streaming path's time beyond the model's own TTFT (SDK, previews, Redis, Daphne, client)."""
    stream = [x.ttft_ms - x.to_request_ms - plan.model_ttft_ms for x in ok if x.to_request_ms is not None]
    return {
        "post_p50_ms": pct([x.post_ms for x in ok if x.post_ms is not None], 0.50),
        "committed_p50_ms": pct([x.logged_ms for x in ok if x.logged_ms is not None], 0.50),
        "brain_p50_ms": pct([x.woken_ms for x in ok if x.woken_ms is not None], 0.50),
        "to_request_p50_ms": pct([x.to_request_ms for x in ok if x.to_request_ms is not None], 0.50),
        "stream_path_p50_ms": pct(stream, 0.50),
    }


def figures(ok: list[Sample], plan: Plan) -> dict[str, Any]:
    """TTFT of good sessions, and the platform's share of it (TTFT - the model's fixed TTFT)."""
    ttft = [x.ttft_ms for x in ok]
    share = [t - plan.model_ttft_ms for t in ttft]
    return {
        "n": len(ok),
        "p50_ms": pct(ttft, 0.50),
        "p95_ms": pct(ttft, 0.95),
        "p99_ms": pct(ttft, 0.99),
        "model_ttft_ms": plan.model_ttft_ms,
        "platform_p50_ms": pct(share, 0.50),
        "platform_p95_ms": pct(share, 0.95),
        "platform_p99_ms": pct(share, 0.99),
    }


def summarise(samples: list[Sample], plan: Plan) -> list[dict[str, Any]]:
    """Phase 1: one row per mode, reductions against coupled."""
    rows = []
    for mode in MODES:
        ok = good(samples, "compare", mode)
        ttft = [x.ttft_ms for x in ok]
        tools = [x.tool_result_ms for x in ok if x.tool_result_ms is not None]
        exchanges = [x.exchange_ms for x in ok if x.exchange_ms is not None]
        mine = [x for x in samples if x.phase == "compare" and x.mode == mode and not x.warmup]
        rows.append(
            {
                "mode": mode,
                **figures(ok, plan),
                "failed": sum(1 for x in mine if x.errors or x.ttft_ms is None),
                "mean_ms": round(statistics.fmean(ttft), 1) if ttft else None,
                "max_ms": round(max(ttft), 1) if ttft else None,
                **parts(ok, plan),
                "provision_p50_ms": pct([x.provision_ms for x in ok if x.provision_ms is not None], 0.50),
                "clone_p50_ms": pct([x.clone_ms for x in ok if x.clone_ms is not None], 0.50),
                "tool_result_n": len(tools),
                "tool_result_p50_ms": pct(tools, 0.50),
                "tool_result_p95_ms": pct(tools, 0.95),
                "exchange_p50_ms": pct(exchanges, 0.50),
                "exchange_p95_ms": pct(exchanges, 0.95),
                "pooled_first_sandboxes": sum(1 for x in ok if x.pooled),
                "returned_first_sandboxes": sum(1 for x in ok if x.returned),
                "prepared_checkouts_kept": sum(1 for x in ok if x.prepared_kept),
                "checkout_images": sum(1 for x in ok if x.checkout_image),
                "recovered_sessions": sum(1 for x in ok if x.recovered),
            }
        )
    coupled = rows[0]
    for row in rows:
        for q in ("p50", "p95", "p99"):
            row[f"{q}_reduction"] = None if row is coupled else reduction(coupled[f"{q}_ms"], row[f"{q}_ms"])
        row["tool_result_vs_coupled"] = ratio(row["tool_result_p50_ms"], coupled["tool_result_p50_ms"])
    return rows


def ratio(value: float | None, of: float | None) -> float | None:
    return None if not of or value is None else round(value / of, 2)


def summarise_platform(samples: list[Sample], plan: Plan) -> dict[str, Any]:
    """Phase 2: decoupled sessions beside the running background (the target's figures), and the control's
    beside them, if it ran: how much of the share provisioning ahead adds, measured in the same seconds."""

    def of(mode: str) -> tuple[list[Sample], dict[str, Any]]:
        """A mode's good sessions, and their figures, failures and parts."""
        ok = good(samples, "platform", mode)
        failed = sum(
            1 for x in samples if x.phase == "platform" and x.mode == mode and (x.errors or x.ttft_ms is None)
        )
        return ok, {**figures(ok, plan), "failed": failed, **parts(ok, plan)}

    ok, summary = of("decoupled")
    summary["returned_first_sandboxes"] = sum(1 for x in ok if x.returned)
    control, control_figures = of(CONTROL_MODE)
    if control:
        summary["control"] = {"mode": CONTROL_MODE, **control_figures}
        ahead, without = summary["platform_p50_ms"], summary["control"]["platform_p50_ms"]
        summary["ahead_adds_p50_ms"] = None if ahead is None or without is None else round(ahead - without, 1)
        summary["ahead_ratio_p50"] = ratio(ahead, without)
        summary["by_window"] = windows(ok, control, plan)
    return summary


def windows(ok: list[Sample], control: list[Sample], plan: Plan, count: int = 5) -> list[dict[str, Any]]:
    """The phase cut into `count` spans of arrivals, each span's share p50 with and without provisioning ahead:
    a slow stretch of the whole machine shows in both columns; one of provisioning ahead's own, in one."""
    arrivals = [x.arrival_s for x in ok + control]
    start, end = min(arrivals), max(arrivals) + 1e-9
    width = (end - start) / count

    def share(group: list[Sample], low: float) -> float | None:
        return pct([x.ttft_ms - plan.model_ttft_ms for x in group if low <= x.arrival_s < low + width], 0.5)

    lows = [start + k * width for k in range(count)]
    return [
        {"from_s": round(low, 1), "ahead_p50_ms": share(ok, low), "control_p50_ms": share(control, low)}
        for low in lows
    ]


def goal(target: str, goal: str, measured: str | None, met: bool) -> dict[str, Any]:
    return {"target": target, "goal": goal, "measured": measured, "met": met}


def targets(
    rows: list[dict[str, Any]], platform: dict[str, Any], phases: dict[str, Phase]
) -> list[dict[str, Any]]:
    out = []
    for row in rows[1:]:
        for q, least in (("p50", P50_REDUCTION_TARGET), ("p95", P95_REDUCTION_TARGET)):
            value = row[f"{q}_reduction"]
            measured = None if value is None else f"{value:.1%}"
            met = value is not None and value >= least
            out.append(
                goal(f"{row['mode']}: {q} TTFT reduction vs coupled", f">= {least:.0%}", measured, met)
            )
        if row["mode"] in AHEAD_MODES:
            value = row["tool_result_vs_coupled"]
            measured = None if value is None else f"{value:.2f}x ({ms(row['tool_result_p50_ms'])} ms)"
            met = value is not None and value <= TOOL_RESULT_TARGET
            out.append(
                goal(
                    f"{row['mode']}: first tool result p50 vs coupled",
                    f"<= {TOOL_RESULT_TARGET:g}x",
                    measured,
                    met,
                )
            )
    value = platform["platform_p50_ms"]
    measured = None if value is None else f"{value:.1f} ms"
    met = value is not None and value <= PLATFORM_P50_TARGET_MS
    out.append(
        goal(
            "platform share of TTFT, p50 (phase 2, decoupled)",
            f"<= {PLATFORM_P50_TARGET_MS:g} ms",
            measured,
            met,
        )
    )
    if "platform" in phases:
        running = phases["platform"].summary()["running_at_once"]
        measured, met = f"{running['mean']:.1f}; {running['min']}", running["mean"] >= RUNNING_TARGET
        out.append(
            goal(
                "  with sessions running at once (phase 2: mean; min)", f">= {RUNNING_TARGET}", measured, met
            )
        )
    return out


def plot(
    path: Path,
    samples: list[Sample],
    rows: list[dict[str, Any]],
    platform: dict[str, Any],
    plan: Plan,
    timeline: list[tuple[float, int]],
    title: str,
) -> None:
    plt = pyplot()
    colours = {
        "coupled": "#b0483a",
        "decoupled": "#3b6ea8",
        "decoupled+pool": "#3a9a5b",
        "decoupled, not ahead": "#9a7a3a",
        "phase 2": "#333333",
    }
    figure, (ecdf, tools, over_time) = plt.subplots(1, 3, figsize=(18, 5.2))

    def step(axis: Any, values: list[float], **style: Any) -> None:
        values = sorted(values)
        fractions = [(i + 1) / len(values) for i in range(len(values))]
        axis.step([values[0], *values], [0.0, *fractions], where="post", **style)

    for mode in MODES:
        ok = good(samples, "compare", mode)
        if not ok:
            continue
        row = next(r for r in rows if r["mode"] == mode)
        step(
            ecdf,
            [x.ttft_ms for x in ok],
            color=colours[mode],
            label=f"{mode}: p50 {ms(row['p50_ms'])}, p95 {ms(row['p95_ms'])} ms",
        )
        ecdf.plot([row["p50_ms"], row["p95_ms"]], [0.5, 0.95], "o", color=colours[mode], markersize=4)
        tool_values = [x.tool_result_ms for x in ok if x.tool_result_ms is not None]
        if tool_values:
            step(
                tools,
                tool_values,
                color=colours[mode],
                label=f"{mode}: p50 {ms(percentile(tool_values, 0.5))} ms",
            )
        exchanges = [x.exchange_ms for x in ok if x.exchange_ms is not None]
        if exchanges:
            step(
                tools,
                exchanges,
                color=colours[mode],
                linestyle="--",
                label=f"{mode}, whole exchange: p50 {ms(percentile(exchanges, 0.5))} ms",
            )
        dots = {"color": colours[mode], "markersize": 3, "label": mode}
        over_time.plot([x.arrival_s for x in ok], [x.ttft_ms for x in ok], ".", **dots)
    second = good(samples, "platform", "decoupled")
    if second:
        step(
            ecdf,
            [x.ttft_ms for x in second],
            color=colours["phase 2"],
            linestyle="--",
            label=f"phase 2, decoupled: p50 {ms(platform['p50_ms'])}, p95 {ms(platform['p95_ms'])} ms",
        )
        dots = {"color": colours["phase 2"], "markersize": 3, "label": "phase 2 (decoupled)"}
        over_time.plot([x.arrival_s for x in second], [x.ttft_ms for x in second], ".", **dots)
    control = good(samples, "platform", CONTROL_MODE)
    if control and platform.get("control"):
        step(
            ecdf,
            [x.ttft_ms for x in control],
            color=colours[CONTROL_MODE],
            linestyle="--",
            label=f"phase 2, {CONTROL_MODE} (control): p50 {ms(platform['control']['p50_ms'])}, "
            f"p95 {ms(platform['control']['p95_ms'])} ms",
        )
        dots = {"color": colours[CONTROL_MODE], "markersize": 3, "marker": "x", "linestyle": "none"}
        over_time.plot(
            [x.arrival_s for x in control], [x.ttft_ms for x in control], label="phase 2 (control)", **dots
        )
    ecdf.axvline(
        plan.model_ttft_ms,
        color="#777",
        linestyle=":",
        linewidth=1,
        label=f"the model's fixed TTFT ({plan.model_ttft_ms:g} ms)",
    )
    over_time.axhline(plan.model_ttft_ms, color="#777", linestyle=":", linewidth=1)
    ecdf.set_xscale("log")
    ecdf.set_xlabel("time to first token, ms (log)")
    ecdf.set_ylabel("fraction of sessions")
    ecdf.set_ylim(0, 1.02)
    ecdf.set_title("TTFT: POST -> first text delta on the client's stream")
    ecdf.legend(fontsize=7.5, loc="lower right")
    tools.set_xscale("log")
    tools.set_xlabel("ms (log)")
    tools.set_ylabel("fraction of tool turns")
    tools.set_ylim(0, 1.02)
    tools.set_title(
        f"Second message -> first tool result; first POST -> second idle, dashed (every {plan.tool_turn_every}th)"
    )
    if tools.get_legend_handles_labels()[0]:
        tools.legend(fontsize=7.5, loc="lower right")
    over_time.set_yscale("log")
    over_time.set_xlabel("seconds into the measurement (arrival)")
    over_time.set_ylabel("TTFT, ms (log)")
    over_time.set_title("Over the run, with sessions running at once (grey)")
    if timeline:
        twin = over_time.twinx()
        twin.plot([t for t, _ in timeline], [n for _, n in timeline], color="#999", linewidth=0.8)
        twin.set_ylabel("sessions running")
        twin.set_ylim(bottom=0)
    over_time.legend(fontsize=7.5, loc="upper right")
    save_figure(figure, path, title)


# --- Main ---------------------------------------------------------------------------------------------------


async def drive(
    plan: Plan,
    base_url: str,
    key: str,
    repo: dict[str, Any],
    model_url: str,
    cpu_snapshot: Callable[[], dict[str, float]],
    checkpoint: Callable[[Run], None],
) -> Run:
    loop = asyncio.get_running_loop()
    # Database reads, sandbox removals and polls run in threads; the default pool (a few threads) would queue them.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=CLIENT_THREADS, thread_name_prefix="ttft"))
    main_task = asyncio.current_task()
    assert main_task is not None
    interrupted = []

    def interrupt() -> None:
        say("interrupted: stopping the measurement and cleaning up")
        interrupted.append(True)
        main_task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt)
    run = Run(plan, Api(base_url, key), repo, model_url, cpu_snapshot, checkpoint)
    background = await run.setup()
    helpers = [
        asyncio.create_task(c)
        for c in (run.sample_system(), run.probe_model(), run.watch_loop_lag(), run.progress())
    ]
    try:
        await run.start_background(*background)
        helpers.append(asyncio.create_task(run.keep_background_running()))
        await run.measure_phases()
    finally:
        run.stopping.set()
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await run.stop_background()
        await run.api.http.aclose()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if interrupted:
            checkpoint(run)
            raise SystemExit("bench/ttft: interrupted; `--from-partial` writes the results measured so far")
    return run


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: ~20 sessions per mode, 10 in background"
    )
    parser.add_argument("--per-mode", type=int, help="measured sessions per mode (default 70: 210 in all)")
    parser.add_argument("--rate", type=float, help="mean arrivals per second over all modes (default 0.5)")
    parser.add_argument(
        "--background", type=int, help="sessions kept running besides the measured (default 50)"
    )
    parser.add_argument("--platform-sessions", type=int, help="phase 2's decoupled sessions (default 100)")
    parser.add_argument(
        "--no-platform-control",
        dest="platform_control",
        action="store_false",
        default=None,
        help="phase 2 without its control (as many sessions that provision nothing ahead, interleaved)",
    )
    parser.add_argument("--seed", type=int, help="seed of the arrivals and of the repository")
    parser.add_argument(
        "--provider", choices=("docker", "local"), help="the sandboxes' provider (default docker)"
    )
    parser.add_argument("--note", default="", help="a remark saved with the results")
    parser.add_argument("--logs", type=Path, help="copy the processes' logs into this folder at the end")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the saved JSON")
    parser.add_argument(
        "--from-partial",
        action="store_true",
        help="write the results from the checkpoint an interrupted run left (ttft-partial.json)",
    )
    return parser


def plan_of(args: argparse.Namespace) -> Plan:
    options = ("per_mode", "rate", "background", "platform_sessions", "platform_control", "provider", "seed")
    overrides = {k: getattr(args, k) for k in options if getattr(args, k) is not None}
    return replace(QUICK if args.quick else DEFAULT, **overrides)


def start_platform(system: Launcher, plan: Plan, deployment: str) -> str:
    """PostgreSQL, Redis, Daphne, the Celery workers and beat, for this run's deployment; Daphne's URL."""
    os.environ.update(
        WORKBENCH_DEPLOYMENT=deployment,
        REPOSITORY_PLAIN_HOSTS="127.0.0.1",  # the git daemon on loopback serves git://
    )
    system.env.update(LOG_LEVEL="WARNING")
    system.start_services(max_connections=600, settings="-c shared_buffers=256MB")
    # On the way out, once the processes have stopped (no more sandboxes made): what is left of them.
    system.callback(
        lambda: say(
            f"removed {remove_sandboxes(deployment, plan.provider)} leftover sandboxes of {deployment}, and its "
            "checkout images"
        )
    )
    url = system.processes.daphne()
    for n in range(plan.workers):
        system.processes.worker(
            f"worker-{n}", pool="threads", concurrency=plan.threads, hostname=f"ttft-{n}@%h"
        )
    system.processes.beat()
    return url


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    plan, name = plan_of(args), stem("ttft", args.quick)
    if args.replot:
        return replot(RESULTS / f"{name}.json")
    partial = RESULTS / f"{name}-partial.json"
    if args.from_partial:
        say(f"summarising the checkpoint {partial.relative_to(ROOT)} of an interrupted run")
        raw = {**json.loads(partial.read_text()), "interrupted": True}
        return finish(raw, name=name, quick=args.quick, note=args.note)
    began = time.monotonic()
    deployment = f"bench-ttft-{secrets.token_hex(4)}"

    with Launcher("ttft", logs=args.logs) as system:
        repo = serve_repository(system, plan)
        model_url = system.model(ttft_ms=plan.model_ttft_ms, tps=plan.model_tps)
        base_url = start_platform(system, plan, deployment)
        key = new_api_key("bench-ttft")
        machine = machine_info(tools=True)
        ls_remote = ["git", "ls-remote", repo["url"]]
        served = lambda: subprocess.run(ls_remote, capture_output=True).returncode == 0  # noqa: E731
        wait_until(served, 30, "git daemon", system.processes)
        say(
            f"Daphne at {base_url}; {plan.workers} Celery workers x {plan.threads} threads; beat; offline model at "
            f"{model_url} (TTFT {plan.model_ttft_ms:g} ms, {plan.model_tps:g} tokens/s); deployment "
            f"{deployment}; {machine['nproc']} CPUs, load {machine['load_average_at_start'][0]}"
        )

        def checkpoint(run: Run) -> None:
            RESULTS.mkdir(parents=True, exist_ok=True)
            state = raw_state(plan, machine, repo, deployment, run, began, interrupted=True)
            partial.with_suffix(".tmp").write_text(json.dumps(state) + "\n")
            partial.with_suffix(".tmp").replace(partial)

        from django.db import connection, connections

        connections.close_all()  # the client's threads open their own
        client_pool(connection)
        cpu = functools.partial(system.cpu_seconds, PARTS)
        measured = asyncio.run(drive(plan, base_url, key, repo, model_url, cpu, checkpoint))
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # asyncio put back the default
        system.processes.check()
        machine["load_average_at_end"] = load_average()

    partial.unlink(missing_ok=True)
    return finish(
        raw_state(plan, machine, repo, deployment, measured, began),
        name=name,
        quick=args.quick,
        note=args.note,
    )


def raw_state(
    plan: Plan,
    machine: dict[str, Any],
    repo: dict[str, Any],
    deployment: str,
    run: Run,
    began: float,
    *,
    interrupted: bool = False,
) -> dict[str, Any]:
    """Everything the figures are computed from; saved as a checkpoint while the run goes on."""
    phases = list(run.phases)
    if run.phase is not None:  # the phase under way, up to now
        phases.append(replace(run.phase, seconds=time.perf_counter() - run.t0 - run.phase.start_s))
    return {
        "plan": asdict(plan),
        "machine": machine,
        "repo": repo,
        "deployment": deployment,
        "samples": [asdict(x) for x in run.samples],
        "phases": [asdict(x) for x in phases],
        "timeline": run.timeline,
        "background_turns": run.background_turns,
        "background_errors": run.background_errors,
        "background_message": run.background_message(),
        "background_first_message": run.background_message(first=True),
        "seconds": round(time.monotonic() - began, 1),
        "interrupted": interrupted,
    }


def finish(raw: dict[str, Any], *, name: str, quick: bool, note: str) -> int:
    """The figures of a run (or of an interrupted run's checkpoint): printed, and saved with their plot."""
    plan, machine, repo = Plan(**raw["plan"]), raw["machine"], raw["repo"]
    samples = [Sample(**x) for x in raw["samples"] if x["ttft_ms"] is not None or x["errors"]]
    interrupted = raw.get("interrupted", False)
    if interrupted:
        note = (note + " " if note else "") + (
            f"Interrupted after {raw['seconds']:.0f} s: the figures are those of the sessions finished by then."
        )
    rows = summarise(samples, plan)
    platform = summarise_platform(samples, plan)
    phases = {x["name"]: Phase(**x) for x in raw["phases"]}
    goals = targets(rows, platform, phases)
    failures = [
        {"phase": x.phase, "index": x.index, "mode": x.mode, "errors": x.errors} for x in samples if x.errors
    ]
    previous = previous_run(RESULTS / f"{name}.json")
    result = {
        "benchmark": "ttft",
        "quick": quick,
        "note": note,
        "interrupted": interrupted,
        "machine": machine,
        "plan": asdict(plan),
        "settings": settings_of(plan, raw),
        "seconds": raw["seconds"],
        "summary": rows,
        "platform": platform,
        "targets": goals,
        "phases": {key: phase.summary() for key, phase in phases.items()},
        "background": {"turns_sent": raw["background_turns"], "send_errors": raw["background_errors"]},
        "failures": failures,
        "previous": previous,
        "samples": [asdict(x) for x in samples],
        "timeline": raw["timeline"],
    }
    title = plot_title(plan, repo, machine, control="control" in platform)
    publish(name, result, lambda png: plot(png, samples, rows, platform, plan, raw["timeline"], title))
    return 0


def settings_of(plan: Plan, raw: dict[str, Any]) -> dict[str, Any]:
    """How the run was set up, in words, for the report."""
    return {
        "model": {
            "ttft_ms": plan.model_ttft_ms,
            "tokens_per_second": plan.model_tps,
            "server": "offline_model in its own process",
        },
        "arrivals": f"phase 1: Poisson, mean {plan.rate:g}/s over all modes, modes round-robin, seed {plan.seed}; "
        f"phase 2: Poisson, mean {plan.platform_rate:g}/s, decoupled"
        + (
            f"; and as many {CONTROL_MODE} (the control), one halfway between each two"
            if plan.platform_control
            else " only"
        ),
        "web": "1 Daphne process",
        "workers": f"{plan.workers} Celery worker processes, --pool threads --concurrency {plan.threads}, "
        "prefetch multiplier 1",
        "beat": "Celery beat: sweep every SWEEP_SECONDS=2, reap every REAP_SECONDS=30, maintain_pools every 60 s",
        "postgresql": "own cluster, fsync/synchronous_commit on, max_connections 600, shared_buffers 256MB",
        "environments": {
            "coupled": {"provisioning": "eager"},
            "decoupled": {"provisioning": "lazy", "speculative": "auto (the default)"},
            "decoupled+pool": {"provisioning": "lazy", "warm_pool": plan.warm_pool},
            "decoupled, not ahead": {"provisioning": "lazy", "speculative": "never"},
        },
        "sandbox": (
            "docker, workbench-sandbox:latest, 1 CPU, 512 MB, no network (environment defaults)"
            if plan.provider == "docker"
            else "local (bubblewrap namespaces, the host's /usr), 1 CPU and 512 MB by cgroup, loopback only"
        ),
        "user_message": USER_MESSAGE,
        "tool_message": TOOL_MESSAGE,
        "background": {
            "sessions": plan.background,
            "message": raw["background_message"],
            "first_message": raw["background_first_message"],
            "context": {"type": "window", "last_events": 60},
            "environment": {"provisioning": "lazy"},
        },
        "repository": raw["repo"],
        "deployment": raw["deployment"],
    }


def replot(path: Path) -> int:
    data = json.loads(path.read_text())
    plan = Plan(**data["plan"])
    samples = [Sample(**x) for x in data["samples"]]
    timeline = [tuple(x) for x in data["timeline"]]
    title = plot_title(
        plan, data["settings"]["repository"], data["machine"], control="control" in data["platform"]
    )
    plot(path.with_suffix(".png"), samples, data["summary"], data["platform"], plan, timeline, title)
    say(f"redrew {path.with_suffix('.png').relative_to(ROOT)}")
    return 0


def plot_title(plan: Plan, repo: dict[str, Any], machine: dict[str, Any], *, control: bool) -> str:
    return (
        f"bench/ttft on {machine['nproc']} CPUs: {plan.per_mode} sessions per mode at {plan.rate:g}/s, then "
        f"{plan.platform_sessions} decoupled{' + as many not ahead (control)' if control else ''}; "
        f"{plan.background} background sessions running; repository "
        f"{repo['files']} files / {repo['tree_mb']} MB; {plan.provider} sandboxes; model TTFT {plan.model_ttft_ms:g} ms; "
        f"{machine['date']}"
    )


def previous_run(path: Path) -> dict[str, Any] | None:
    """The figures of the run this one replaces, to show how far a second run reproduces them."""
    try:
        old = json.loads(path.read_text())
        keep = ("n", "p50_ms", "p95_ms", "p99_ms", "platform_p50_ms", "p50_reduction", "p95_reduction")
        modes = {r["mode"]: {k: r.get(k) for k in keep} for r in old["summary"]}
        if old.get("platform"):
            modes["phase 2"] = {k: old["platform"].get(k) for k in keep}
        return {"date": old["machine"]["date"], "plan": old["plan"], "modes": modes}
    except (OSError, ValueError, KeyError, TypeError):
        return None


if __name__ == "__main__":
    run(main)
