"""`make run` as a user runs it, in a data folder and on loopback ports of its own: once it is ready, each of its
processes is SIGKILLed in turn — the Celery worker's main process, one of its pool processes, Redis, Daphne,
beat, PostgreSQL, the offline model and the egress proxy — and each time the supervisor restarts it and a turn
through /v1 completes. Ctrl-C then stops every process group it started and names the sandbox containers it left
(kept for their sessions); the next start reaps the one whose session was deleted and keeps the other.

Needs PostgreSQL's server binaries (scripts/bootstrap.sh installs them) and, for the `/bash` turns and the
sandboxes, a Docker engine with the sandbox image (`make test` starts one and builds it); outside CI, without
Docker, the turns have no tool call and nothing is reaped.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import docker
import httpx
import pytest

from tests.conftest import IN_CI, ROOT, free_port, require
from tests.deploy.supervised import left_running, started
from tests.faults.conftest import _docker_available, children_of, process_state, wait_for
from tests.vault.egress.conftest import _free_subnet, _remove_firewall
from workbench.supervise import group_members

pytestmark = [pytest.mark.server, pytest.mark.timeout(480)]

START_SECONDS = 240  # a new PostgreSQL cluster made and migrated: ~30 s on a busy two-core machine
RESTART_SECONDS = 60
TURN_SECONDS = 90
STOP_SECONDS = 60
TOOLSET = {"type": "agent_toolset_20260401"}
SERVER_ERRORS = (anthropic.APIConnectionError, anthropic.InternalServerError, httpx.HTTPError)


@dataclass
class MakeRun:
    """`make run` with `env`, started (again) by `start`; each start's output in a log of its own."""

    folder: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['PORT']}"

    def start(self) -> None:
        self.logs.append(self.folder / f"make-run-{len(self.logs) + 1}.log")
        with open(self.logs[-1], "wb") as out:
            self.process = subprocess.Popen(
                ["make", "--no-print-directory", "run"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group, as a terminal's foreground job: Ctrl-C reaches it all
            )

    def output(self) -> str:
        return self.logs[-1].read_text(errors="replace") if self.logs else ""

    def tail(self) -> str:
        return f"--- the last lines of {self.logs[-1]}\n{self.output()[-6000:]}"

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match[str]:
        def seen() -> re.Match[str] | None:
            if self.process is not None and self.process.poll() is not None:
                pytest.fail(f"make run exited with {self.process.returncode}\n{self.tail()}")
            return re.search(pattern, self.output(), re.MULTILINE)

        return wait_for(
            seen, timeout=timeout, what=f"a line like {pattern!r}", on_timeout=self.tail, every=0.1
        )

    def pid(self, name: str) -> int:
        return started(self.output(), name)[-1]

    def restarted(self, name: str, old: int) -> int:
        """The pid `name` was started again with, after `old` died."""

        def again() -> int | None:
            pids = started(self.output(), name)
            return pids[-1] if pids and pids[-1] != old else None

        return int(wait_for(again, timeout=RESTART_SECONDS, what=f"{name} restarted", on_timeout=self.tail))

    def interrupt(self) -> str:
        """Ctrl-C, as a terminal sends it: SIGINT to the whole job. Its output once it has exited."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make run did not stop within {STOP_SECONDS} s of Ctrl-C\n{self.tail()}")
        return self.output()

    def kill_everything(self) -> None:
        for log in self.logs:
            for group in left_running(log.read_text(errors="replace")):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


class Api:
    """The official SDK against the run, retrying what a process being down (or restarting) makes fail."""

    def __init__(self, url: str, key: str, on_timeout: Callable[[], str]) -> None:
        self.sdk = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=20)
        self.on_timeout = on_timeout

    def retrying(self, call: Callable[[], Any], what: str, timeout: float = TURN_SECONDS) -> Any:
        def answered() -> Any:
            with contextlib.suppress(*SERVER_ERRORS):
                return call()
            return None

        return wait_for(answered, timeout=timeout, what=what, on_timeout=self.on_timeout, every=0.2)

    def new_session(self, environment: str, *, tools: bool) -> str:
        agent = self.retrying(
            lambda: self.sdk.beta.agents.create(
                name="make-run", model="claude-sonnet-5-5", tools=[TOOLSET] if tools else []
            ),
            "an agent",
        )
        return str(
            self.retrying(
                lambda: self.sdk.beta.sessions.create(agent=agent.id, environment_id=environment).id,
                "a session",
            )
        )

    def turn(self, session_id: str, text: str) -> list[Any]:
        """Send `text` and wait for the session to go idle after answering it; the events since it."""
        key = f"make-run-{uuid.uuid4().hex}"  # a retried send is the same send
        message = {"type": "user.message", "content": [{"type": "text", "text": text}]}
        self.retrying(
            lambda: self.sdk.beta.sessions.events.send(
                session_id, events=[message], extra_headers={"Idempotency-Key": key}
            ),
            f"the message {text!r} to be taken",
        )

        def answered() -> list[Any] | None:
            events = self.sdk.beta.sessions.events.list(session_id, limit=1000).data
            sent = [i for i, e in enumerate(events) if e.type == "user.message" and e.content[0].text == text]
            if not sent or events[-1].type != "session.status_idle":
                return None
            since = events[sent[-1] :]
            return since if any(e.type == "agent.message" for e in since) else None

        return list(self.retrying(answered, f"the answer to {text!r}"))


def reply(events: list[Any]) -> str:
    return str([e for e in events if e.type == "agent.message"][-1].content[0].text)


@pytest.fixture
def make_run() -> Iterator[MakeRun]:
    require(
        bool(glob.glob("/usr/lib/postgresql/*/bin/postgres")),
        "no PostgreSQL server (apt-get install postgresql)",
    )
    # Not under pytest's own tmp folder: PostgreSQL runs as the postgres user, who must reach its files.
    folder = Path(tempfile.mkdtemp(prefix="workbench-make-run-"))
    folder.chmod(0o755)
    deployment = f"mrun{uuid.uuid4().hex[:8]}"
    ports = {name: str(free_port()) for name in ("PORT", "REDIS_PORT", "POSTGRES_PORT", "OFFLINE_MODEL_PORT")}
    ports.update(
        {name: str(free_port()) for name in ("EGRESS_CONTROL_PORT", "EGRESS_HARNESS_PORT", "EGRESS_PORT")}
    )
    env = {
        # Only what a user's shell would give it: nothing of this test run's database, Redis or settings.
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        **{name: os.environ[name] for name in ("DOCKER_HOST", "LANG") if name in os.environ},
        **ports,
        "WORKBENCH_DATA_DIR": str(folder / "data"),
        "WORKBENCH_DEPLOYMENT": deployment,
        "VAULT_KEY_FILE_FOR_EGRESS": str(folder / "vault" / "keyring.json"),
        "VAULT_PUBLIC_KEY_FILE": str(folder / "vault" / "public.json"),
        "EGRESS_DATA_DIR": str(folder / "egress"),
        "EGRESS_SUBNET": egress_subnet(),
        "WORKER_CONCURRENCY": "2",
        # Beat's reaper would remove the deleted session's sandbox before the second start can.
        "REAP_SECONDS": "3600",
    }
    run = MakeRun(folder, env)
    try:
        yield run
    finally:
        run.kill_everything()
        remove_what_the_run_left(deployment)
        shutil.rmtree(folder, ignore_errors=True)


def egress_subnet() -> str:
    with contextlib.suppress(Exception):  # no Docker engine: the run makes no sandbox network
        return _free_subnet()
    return "10.214.250.0/24"


def remove_what_the_run_left(deployment: str) -> None:
    """Its sandboxes, its sandboxes' network and that network's firewall rules."""
    with contextlib.suppress(Exception):  # no Docker engine: nothing to remove
        engine = docker.from_env(version="auto")
        for container in engine.containers.list(
            all=True, filters={"label": f"workbench.deployment={deployment}"}
        ):
            container.remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):
            engine.networks.get(f"workbench-egress-{deployment}").remove()
        _remove_firewall(f"wbe-{deployment[:11]}")


def sandbox_containers(deployment: str) -> set[str]:
    engine = docker.from_env(version="auto")
    filters = {"label": f"workbench.deployment={deployment}"}
    return {container.id[:12] for container in engine.containers.list(all=True, filters=filters)}


def container_of(api: Api, session_id: str) -> str:
    """The sandbox container of the session's first tool call (its sandbox.provisioned event)."""
    events = api.sdk.beta.sessions.events.list(session_id, limit=1000).data
    sandbox_id = next(e for e in events if e.type == "sandbox.provisioned").model_dump()["sandbox_id"]
    [container] = docker.from_env(version="auto").containers.list(
        all=True, filters={"label": f"workbench.sandbox={sandbox_id}"}
    )
    return str(container.id[:12])


def test_make_run_restarts_each_killed_process_stops_on_ctrl_c_and_reaps_what_it_left(make_run):
    began = time.monotonic()
    docker_ok = _docker_available()
    if not docker_ok:
        if IN_CI:
            pytest.fail("required service missing in CI: a Docker engine with the sandbox image")
        print(
            "NOTE: no Docker engine with the sandbox image: the turns run no tool, and no sandbox is reaped"
        )
    deployment = make_run.env["WORKBENCH_DEPLOYMENT"]

    make_run.start()
    make_run.wait_for_line(r"^  Log in at ", START_SECONDS)
    output = make_run.output()
    assert f"Database: PostgreSQL at 127.0.0.1:{make_run.env['POSTGRES_PORT']}" in output
    assert f"Sandboxes an earlier run left (deployment {deployment}): none." in output
    make_run.wait_for_line(r"worker@\S+ ready\.", START_SECONDS)
    wait_for(
        lambda: (
            httpx.get(f"{make_run.url}/readyz", params={"exclude": "docker"}, timeout=5).status_code == 200
        ),
        timeout=START_SECONDS,
        what="/readyz",
        on_timeout=make_run.tail,
        every=0.5,
    )
    ready = time.monotonic()

    password = (Path(make_run.env["WORKBENCH_DATA_DIR"]) / "postgres-password").read_text().strip()
    database_url = f"postgres://postgres:{password}@127.0.0.1:{make_run.env['POSTGRES_PORT']}/workbench"
    made = subprocess.run(
        [sys.executable, "manage.py", "createapikey", "--name", "make-run-test"],
        cwd=ROOT,
        env={**make_run.env, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    api = Api(make_run.url, made.stdout.strip().splitlines()[-1], make_run.tail)
    environment = api.retrying(
        lambda: api.sdk.beta.environments.create(name="make-run", config={"type": "cloud"}).id,
        "an environment",
    )
    kept = api.new_session(environment, tools=docker_ok)
    deleted = api.new_session(environment, tools=docker_ok)
    if docker_ok:
        for session_id in (kept, deleted):
            events = api.turn(session_id, "/bash echo hello from $(whoami)")
            assert "hello from sandbox" in reply(events), events
    else:
        api.turn(kept, "hello")

    victims = ["worker", "pool process", "redis", "web", "beat", "postgres", "model"]
    victims += ["egress"] if started(make_run.output(), "egress") else []
    measured = []
    for victim in victims:
        if victim == "pool process":
            worker = make_run.pid("worker")
            pool = children_of(worker)
            assert pool, make_run.tail()
            killed_at = time.monotonic()
            os.kill(pool[0], signal.SIGKILL)
            wait_for(
                lambda: pool[0] not in children_of(worker) and len(children_of(worker)) == len(pool),  # noqa: B023
                timeout=RESTART_SECONDS,
                what="the worker to replace its pool process",
                on_timeout=make_run.tail,
            )
        else:
            old = make_run.pid(victim)
            group = group_members(old)  # the worker's pool processes, PostgreSQL's backends...
            killed_at = time.monotonic()
            os.kill(old, signal.SIGKILL)
            make_run.restarted(victim, old)
            # None of it outlives its leader: it would hold leases (a brain) or the server's shared memory.
            assert all(process_state(pid) in (None, "Z") for pid in group), make_run.tail()
        restarted_in = time.monotonic() - killed_at
        text = f"hello after the {victim} was killed"
        assert reply(api.turn(kept, text)) == f"You said: {text}"
        measured.append((victim, restarted_in, time.monotonic() - killed_at))
    output = make_run.output()
    for victim in victims:
        if victim != "pool process":
            assert re.search(rf"\| {victim} \(pid \d+\) was killed by SIGKILL after [\d.]+ s", output), output

    if docker_ok:
        kept_container, deleted_container = container_of(api, kept), container_of(api, deleted)
        api.retrying(lambda: api.sdk.beta.sessions.delete(deleted), "the session's deletion")
    stopping = time.monotonic()
    output = make_run.interrupt()
    stopped_in = time.monotonic() - stopping
    assert "SIGINT: stopping every process" in output
    assert "stopped: every process has exited (exit code 0)" in output, make_run.tail()
    assert not left_running(output), f"processes of make run left after Ctrl-C: {left_running(output)}"
    if docker_ok:
        assert sandbox_containers(deployment) == {kept_container, deleted_container}
        listed = ", ".join(sorted([kept_container, deleted_container]))
        assert (
            f"Sandboxes left (deployment {deployment}): 2 sandboxes kept for their sessions (docker: {listed})."
            in output
        ), make_run.tail()

        # The next start reaps the sandbox of the deleted session, and keeps the live one's.
        make_run.start()
        make_run.wait_for_line(r"^  Sandboxes an earlier run left", START_SECONDS)
        assert (
            f"Sandboxes an earlier run left (deployment {deployment}): 2 found, 1 reaped (no live session held "
            "them, or they were idle past their TTL), 1 kept for its session." in make_run.output()
        ), make_run.tail()
        assert sandbox_containers(deployment) == {kept_container}
        make_run.wait_for_line(r"\| worker started", START_SECONDS)
        output = make_run.interrupt()
        assert not left_running(output), f"processes of make run left after Ctrl-C: {left_running(output)}"
        assert f"): 1 sandbox kept for its session (docker: {kept_container})." in output, make_run.tail()
    else:
        assert f"Sandboxes left (deployment {deployment}): none." in output

    print(
        f"\nmake run: ready {ready - began:.0f} s after `make run`; stopped {stopped_in:.1f} s after Ctrl-C"
    )
    print(f"{'killed':<14}{'restarted (s)':>14}{'turn done (s)':>15}")
    for victim, restarted_in, turn_done in measured:
        print(f"{victim:<14}{restarted_in:>14.1f}{turn_done:>15.1f}")
    print(f"the whole test: {time.monotonic() - began:.0f} s")
