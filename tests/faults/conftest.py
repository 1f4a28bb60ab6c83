"""Real Celery workers and beat against the test database and Redis, the offline model, and log checks.

Each worker runs in its own process group (``start_new_session``), so a test can SIGKILL the worker's main
process and its pool child together: nothing is left to requeue the task it held, and only the sweeper
(beat → ``sweep`` → ``wake(by="sweeper")``) can bring the session back. The broker's visibility timeout is
hours long, so a session that comes back within seconds was not brought back by redelivery.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from offline_model.testing import OfflineModel, start_offline_model
from sandboxes.models import Sandbox
from sessions.models import Event, Session
from tests.conftest import ROOT, child_env, make_agent, make_session, require

LEASE_SECONDS = 2.0
SWEEP_SECONDS = 0.5
BOOT_SECONDS = 60.0
TOOLSET = [{"type": "agent_toolset_20260401"}]


def wait_for(
    condition: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    on_timeout: Callable[[], str] = str,
    every: float = 0.05,
) -> Any:
    """Poll until `condition()` is truthy and return it; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n{on_timeout()}")
        time.sleep(every)


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, T for stopped, Z …), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


@dataclass
class Worker:
    """One `celery worker --pool prefork --concurrency 1`, listening on the default queue and its own."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def queue(self) -> str:
        return self.name

    @property
    def pgid(self) -> int:
        return self.process.pid  # started with start_new_session: it leads its own group

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def owns(self, pid: int) -> bool:
        try:
            return os.getpgid(pid) == self.pgid
        except ProcessLookupError:
            return False

    def pool_pids(self) -> list[int]:
        return children_of(self.process.pid)

    def ready(self) -> bool:
        if not self.alive:
            pytest.fail(f"worker {self.name} exited with {self.process.returncode}:\n{self.log()[-3000:]}")
        return f"{self.name}@" in self.log() and " ready." in self.log() and bool(self.pool_pids())

    def kill(self) -> None:
        """SIGKILL the main process and its pool child at once: neither can requeue or ack anything."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.process.wait(10)

    def signal_group(self, signum: int) -> None:
        os.killpg(self.pgid, signum)


@dataclass
class Cluster:
    """The processes of a deployment, minus the web server: workers, beat and the offline model."""

    folder: Path
    model: OfflineModel
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def start_workers(self, count: int, **extra_env: str) -> list[Worker]:
        started = [self._start_worker(**extra_env) for _ in range(count)]
        wait_for(
            lambda: all(worker.ready() for worker in started),
            timeout=BOOT_SECONDS,
            what=f"{count} celery workers to be ready",
            on_timeout=self.diagnostics,
        )
        return started

    def _start_worker(self, **extra_env: str) -> Worker:
        name = f"faults-{len(self.workers)}-{uuid.uuid4().hex[:6]}"
        log_path = self.folder / f"{name}.log"
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.faults.workerapp",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            "1",
            "-Q",
            f"celery,{name}",
            "--hostname",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
        ]
        # Each worker is a machine of its own unless told otherwise: none frees the leases of another's dead
        # processes (what a vanished machine leaves), and only the lease's expiry brings their sessions back.
        env = {"LEASE_HOST": name, **extra_env}
        worker = Worker(name, self._popen(command, log_path, env), log_path)
        self.workers.append(worker)
        return worker

    def start_beat(self) -> None:
        """Celery beat with the product's schedule (`sweep` every SWEEP_SECONDS); returns once a worker has
        run a sweep, or fails at once when beat cannot send it."""
        log_path = self.folder / "beat.log"
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workbench",
            "beat",
            "-s",
            str(self.folder / "beat"),
            "--max-interval",
            "1",
            "-l",
            "INFO",
        ]
        self.others.append(self._popen(command, log_path, {}))

        def swept() -> bool:
            beat = log_path.read_text(errors="replace") if log_path.exists() else ""
            if "Couldn't apply scheduled task" in beat or "SchedulingError" in beat:
                error = next(
                    line for line in beat.splitlines() if "SchedulingError" in line or "Couldn't" in line
                )
                pytest.fail(f"celery beat cannot send the sweeper: {error}")
            return any("harness.tasks.sweep[" in w.log() and "succeeded" in w.log() for w in self.workers)

        wait_for(swept, timeout=BOOT_SECONDS, what="the first sweep", on_timeout=self.diagnostics)

    def _popen(
        self, command: list[str], log_path: Path, extra_env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        self.logs.append(log_path)
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                command,
                cwd=ROOT,
                env={**self.env, **extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def holder(self, session_id: str) -> Worker | None:
        """The worker whose pool process holds the session's lease now (owner is `host:pid`)."""
        owner = Session.objects.values_list("lease_owner", flat=True).get(id=session_id)
        if not owner:
            return None
        pid = int(owner.rsplit(":", 1)[1])
        return next((worker for worker in self.workers if worker.alive and worker.owns(pid)), None)

    def diagnostics(self) -> str:
        parts = []
        for path in self.logs:
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {path.name} (last 2500 characters)\n{text[-2500:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        for process in self.others:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _docker_available() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        from django.conf import settings

        client.images.get(settings.SANDBOX_IMAGE)
        return True
    except Exception:  # noqa: BLE001 - any failure here means "no usable Docker"
        return False


def _remove_containers(sandbox_ids: list[str]) -> None:
    import docker

    client = docker.from_env(timeout=30)
    for sandbox_id in sandbox_ids:
        for container in client.containers.list(
            all=True, filters={"label": f"workbench.sandbox={sandbox_id}"}
        ):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)


@pytest.fixture
def docker_engine() -> None:
    from django.conf import settings

    require(
        _docker_available(),
        f"no Docker engine with image {settings.SANDBOX_IMAGE} (tools run in containers; "
        "run scripts/start-dockerd.sh and scripts/build-image.sh)",
    )


@pytest.fixture
def cluster(transactional_db: Any, redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Started empty: a test starts the workers (and beat) it needs. Everything is killed before the
    database is flushed, and every container the test's sandboxes ran in is removed."""
    model = start_offline_model()
    env = child_env(
        LEASE_SECONDS=str(LEASE_SECONDS),
        SWEEP_SECONDS=str(SWEEP_SECONDS),
        ANTHROPIC_BASE_URL=model.base_url,
        ANTHROPIC_API_KEY="",
        CONN_MAX_AGE="0",
        MODEL_RETRY_BASE_SECONDS="0.05",
        PYTHONUNBUFFERED="1",
        # The reaper is not under test, and it removes every managed container on the engine that this
        # database does not know: on a shared engine, other test runs' and the developer's sandboxes.
        REAP_SECONDS="86400",
    )
    cluster = Cluster(tmp_path, model, env)
    try:
        yield cluster
    finally:
        cluster.close()
        model.stop()
        sandbox_ids = list(Sandbox.objects.values_list("id", flat=True))  # the test database: all ours
        if sandbox_ids and _docker_available():
            _remove_containers(sandbox_ids)


# --- Sessions and their logs ---------------------------------------------------------------------------


def new_session(text: str | None = None, *, tools: bool = False) -> str:
    """A session, with a first user message if `text` is given (its wake is queued on commit)."""
    agent = make_agent(tools=TOOLSET) if tools else make_agent()
    initial = (
        [{"type": "user.message", "content": [{"type": "text", "text": text}]}] if text is not None else []
    )
    return make_session(agent=agent, initial_events=initial)


def log_of(session_id: str) -> list[Event]:
    return list(Event.objects.filter(session_id=session_id).order_by("seq"))


def first(events: list[Event], kind: str, **payload: Any) -> Event | None:
    return next(
        (e for e in events if e.type == kind and all(e.payload.get(k) == v for k, v in payload.items())), None
    )


def settled(session_id: str, *, last_is_idle: bool = True) -> bool:
    """Idle, lease free, nothing pending, and (unless told otherwise) the log's last word is the idle."""
    from harness.brain import has_pending_work

    session = Session.objects.get(id=session_id)
    last = Event.objects.filter(session_id=session_id).order_by("-seq").first()
    return (
        session.status == Session.Status.IDLE
        and not session.lease_owner
        and last is not None
        and (last.type == "session.status_idle" or not last_is_idle)
        and not has_pending_work(session_id)
    )


def describe(events: list[Event]) -> str:
    return "\n".join(
        f"  {e.seq:>3} epoch={e.lease_epoch!s:<4} {e.type:<28} "
        f"{str({k: v for k, v in e.payload.items() if k != 'content'})[:110]}"
        for e in events
    )


def check_log(session_id: str, *, closed_requests: bool = True) -> list[Event]:
    """The invariants every kill must leave intact; returns the log for further checks."""
    events = log_of(session_id)
    shown = describe(events)
    assert [e.seq for e in events] == list(range(len(events))), f"seq is not 0..n-1 without gaps:\n{shown}"

    # Fencing: once a newer epoch has written, an older one never writes again.
    epochs = [e.lease_epoch for e in events if e.lease_epoch is not None]
    assert epochs == sorted(epochs), f"an older epoch wrote after a newer one:\n{shown}"

    # Each model request: one start, at most one end, and at most one agent.message, between them.
    open_requests: dict[str, Event] = {}
    messages_of: dict[str, int] = {}
    for event in events:
        if event.type == "span.model_request_start":
            open_requests[event.uid] = event
            messages_of[event.uid] = 0
        elif event.type == "span.model_request_end":
            start = event.payload["model_request_start_id"]
            assert start in open_requests, f"request {start} ended twice or never started:\n{shown}"
            del open_requests[start]
        elif event.type == "agent.message":
            assert len(open_requests) == 1, f"agent.message {event.seq} outside exactly one request:\n{shown}"
            (start,) = open_requests
            assert open_requests[start].lease_epoch == event.lease_epoch, (
                f"message and request epochs differ:\n{shown}"
            )
            messages_of[start] += 1
    duplicated = {uid: count for uid, count in messages_of.items() if count > 1}
    assert not duplicated, f"a model request has more than one agent.message: {duplicated}\n{shown}"
    if closed_requests:
        assert not open_requests, f"model requests never closed: {sorted(open_requests)}\n{shown}"

    uses = [e for e in events if e.type == "agent.tool_use"]
    for use in uses:
        results = [
            e for e in events if e.type == "agent.tool_result" and e.payload.get("tool_use_id") == use.uid
        ]
        assert len(results) == 1, f"tool_use {use.seq} has {len(results)} results:\n{shown}"
        assert results[0].seq > use.seq
    return events
