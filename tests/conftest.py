"""Fixtures shared by the whole suite: API keys, rows, and the real services tests stand on."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection

from harness.agents import agent_create
from harness.services.lifecycle import session_create
from kernel.keys import api_key_create
from sandboxes.environments import environment_create
from vault import crypto

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The run's vault key: every process the tests start seals to its public half (the environment carries
# it); only tests that play the egress proxy open secrets, with `vault_keyring`.
VAULT_KEYRING = crypto.new_key()
os.environ["VAULT_PUBLIC_KEYS"] = crypto.dump(VAULT_KEYRING.public())
os.environ.pop("VAULT_KEYS", None)
os.environ.pop("VAULT_KEY_FILE", None)
django_settings.VAULT_PUBLIC_KEYS = os.environ["VAULT_PUBLIC_KEYS"]
django_settings.VAULT_KEYS = django_settings.VAULT_KEY_FILE = ""
# The run's repository cache (sandboxes/mirrors.py): a folder of its own, not the checkout's data folder.
os.environ["REPOSITORY_CACHE_DIR"] = tempfile.mkdtemp(prefix="workbench-test-mirrors-")
django_settings.REPOSITORY_CACHE_DIR = os.environ["REPOSITORY_CACHE_DIR"]


@pytest.fixture(autouse=True)
def _default_workspace(request: pytest.FixtureRequest, _django_db_marker: None) -> None:
    """The default workspace, which a migration makes, for every test with the database: transactional
    tests flush every table after them, that row too."""
    names = request.fixturenames
    if request.node.get_closest_marker("django_db") is None:
        if "transactional_db" in names or "live_server_url" in names:
            request.getfixturevalue("transactional_db")
        elif "db" in names:
            request.getfixturevalue("db")
        else:
            return
    from kernel.models import DEFAULT_WORKSPACE_ID, DEFAULT_WORKSPACE_SLUG, Workspace

    Workspace.objects.get_or_create(
        id=DEFAULT_WORKSPACE_ID, defaults={"slug": DEFAULT_WORKSPACE_SLUG, "name": "Default"}
    )


def require(condition: bool, reason: str) -> None:
    """Skip outside CI when a real service is missing; in CI a missing service is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required service missing in CI: {reason}")
    print(f"SKIP: {reason}", file=sys.stderr)
    pytest.skip(reason)


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


def in_thread(function: Any) -> Any:
    """Run `function` (in a worker thread) and close that thread's database connection afterwards."""
    from django.db import connections

    try:
        return function()
    finally:
        connections.close_all()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def children_database_url() -> str:
    """The URL of the database the tests use now (the test database), for processes tests start."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    return (
        f"postgres://{settings['USER']}:{settings.get('PASSWORD') or ''}@{settings['HOST']}:{settings['PORT']}/"
        f"{settings['NAME']}"
    )


def child_env(**extra: str) -> dict[str, str]:
    from django.conf import settings

    env = dict(
        os.environ,
        DATABASE_URL=children_database_url(),
        PYTHONPATH=str(ROOT),
        DJANGO_SETTINGS_MODULE="workbench.settings",
        WORKBENCH_DEPLOYMENT=settings.WORKBENCH_DEPLOYMENT,
    )
    env.update(extra)
    return env


@pytest.fixture
def docker_engine() -> Iterator[Any]:
    """A client of the Docker engine the sessions' sandboxes run on. The containers this test run's sandboxes
    ran in are removed afterwards: only this run's (its deployment label), as another test run, or `make
    run`, may share the engine."""
    import docker
    from django.conf import settings

    from sandboxes.providers.docker import CHECKOUT_LABEL
    from sandboxes.repositories import checkout_images_made

    try:
        client = docker.from_env(version="auto")
        client.ping()
    except docker.errors.DockerException as error:
        require(False, f"no Docker engine ({error}); `make test` starts one")
    since = time.time() - 1
    yield client
    mine = ["workbench.managed=true", f"workbench.deployment={settings.WORKBENCH_DEPLOYMENT}"]
    for container in client.containers.list(all=True, filters={"label": mine}):
        container.remove(force=True)
    # The checkout images the test's sessions had made (sandboxes/repositories.py), once made.
    checkout_images_made(120)
    for image in client.api.images(filters={"label": CHECKOUT_LABEL}):
        if image["Created"] >= since:
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_image(image["Id"], force=True)


@pytest.fixture
def vault_keyring() -> crypto.Keyring:
    """The private keyring, as the egress proxy holds it."""
    return VAULT_KEYRING


@pytest.fixture
def api_key(db: Any) -> str:
    """A full key of the default workspace."""
    return api_key_create(name="test")[1]


@pytest.fixture
def api(client: Any, api_key: str) -> Any:
    """Django's test client, authenticated with a fresh API key, speaking JSON."""

    class Api:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}

        def get(self, path: str, **params: Any) -> Any:
            return client.get(path, params, **self.headers)

        def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> Any:
            import json

            data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
            return client.post(path, data, content_type="application/json", **self.headers)

        def delete(self, path: str) -> Any:
            return client.delete(path, **self.headers)

    return Api()


def make_agent(**overrides: Any) -> str:
    body = {"name": "tester", "model": "claude-sonnet-5-5", **overrides}
    return agent_create(**body).agent_id


def make_environment(**overrides: Any) -> str:
    """An environment under a fresh name (names are unique)."""
    return environment_create(**{"name": f"env-{uuid.uuid4().hex[:8]}", **overrides}).id


def make_session(**overrides: Any) -> str:
    body = {"agent": make_agent(), "environment_id": make_environment(), **overrides}
    return session_create(**body).id


@pytest.fixture
def session_id(db: Any) -> str:
    return make_session()


@pytest.fixture
def redis_url() -> str:
    import redis
    from django.conf import settings

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as error:
        require(False, f"no Redis at {settings.REDIS_URL} ({error}); run `make test`, which starts one")
    return settings.REDIS_URL


@pytest.fixture
def live_server_url(transactional_db: Any, redis_url: str) -> Iterator[str]:
    """The real ASGI server (Daphne) on a free port, against the test database and Redis."""
    from bench.common.processes import daphne

    env = child_env(STREAM_CATCHUP_SECONDS="0.5", STREAM_PING_SECONDS="1", STREAM_RECHECK_SECONDS="0.5")
    with daphne(env, ROOT / ".pytest-daphne.log", append_log=True, timeout=90) as url:
        yield url


@pytest.fixture
def offline_model() -> Iterator[Any]:
    from offline_model.testing import start_offline_model

    with start_offline_model() as model:
        yield model


def _logged_since(path: Path, offset: int, text: bytes) -> bool:
    with open(path, "rb") as log:
        log.seek(offset)
        return text in log.read()


@contextmanager
def celery_worker(
    env: dict[str, str], *, log_name: str = ".pytest-worker.log"
) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker (the brains) with `env`, yielded once it consumes tasks: on a loaded machine its
    start alone can outlast a test's patience."""
    path = ROOT / log_name
    log = open(path, "ab")  # noqa: SIM115 - closed below
    start = log.tell()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workbench",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not _logged_since(path, start, b" ready."):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not become ready; see {path}")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture
def brain_worker(live_server_url: str, offline_model: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker (the brains) against the test database, Redis and the offline model."""
    env = child_env(ANTHROPIC_BASE_URL=offline_model.base_url, MODEL_RETRY_BASE_SECONDS="0.05")
    with celery_worker(env) as process:
        yield process


def operator_of(user, role: str = "admin", workspace_id: str | None = None):
    """Make `user` (an operator: staff) a member of a workspace, the default one unless told; returns the user."""
    from kernel.models import DEFAULT_WORKSPACE_ID, Membership

    Membership.objects.update_or_create(
        user=user, workspace_id=workspace_id or DEFAULT_WORKSPACE_ID, defaults={"role": role}
    )
    return user
