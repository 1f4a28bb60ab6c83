"""`/healthz` and `/readyz` against real PostgreSQL, Redis, the offline model and the Docker engine, and with
each of them unreachable (a closed loopback port): `/readyz` answers 503 and names what failed and where."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.test import override_settings

from tests.conftest import ROOT, child_env, free_port


def closed_port() -> int:
    """A loopback port nothing listens on (free a moment ago)."""
    return free_port()


def readyz(client: Any, query: str = "") -> tuple[int, dict[str, Any]]:
    response = client.get(f"/readyz{query}")
    assert response["Cache-Control"] == "no-store"
    return response.status_code, json.loads(response.content)


@pytest.fixture
def everything_up(db: Any, redis_url: str, offline_model: Any, docker_engine: Any) -> Any:
    with override_settings(ANTHROPIC_BASE_URL=offline_model.base_url, SANDBOX_PROVIDER="docker"):
        yield


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_is_200_when_the_database_redis_the_model_and_docker_answer(client, everything_up):
    status, body = readyz(client)
    assert status == 200, body
    assert body == {
        "ready": True,
        "failed": [],
        "checks": {name: {"ok": True} for name in ("database", "redis", "model", "docker")},
    }


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_names_redis_when_it_does_not_answer(client, everything_up):
    port = closed_port()
    down = f"redis://127.0.0.1:{port}/0"
    with override_settings(REDIS_URL=down, CELERY_BROKER_URL=down):
        status, body = readyz(client)
    assert status == 503, body
    assert body["ready"] is False and body["failed"] == ["redis"]
    error = body["checks"]["redis"]["error"]
    assert error.startswith(f"no answer from Redis at {down}: ") and str(port) in error
    assert all(body["checks"][name] == {"ok": True} for name in ("database", "model", "docker"))


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_checks_the_broker_too_when_it_is_another_redis(client, everything_up):
    down = f"redis://:hunter2@127.0.0.1:{closed_port()}/3"
    with override_settings(CELERY_BROKER_URL=down):
        status, body = readyz(client)
    assert status == 503 and body["failed"] == ["broker"], body
    assert body["checks"]["redis"] == {"ok": True}
    error = body["checks"]["broker"]["error"]
    assert "hunter2" not in error and error.startswith(
        f"no answer from Redis at redis://127.0.0.1:{down.rsplit(':', 1)[1]}"
    )


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_names_the_model_when_its_endpoint_does_not_answer(client, everything_up):
    down = f"http://127.0.0.1:{closed_port()}"
    with override_settings(ANTHROPIC_BASE_URL=down):
        status, body = readyz(client)
    assert status == 503 and body["failed"] == ["model"], body
    assert body["checks"]["model"]["error"].startswith(f"no answer from the model's endpoint {down}: ")


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_names_docker_when_the_engine_does_not_answer_and_exclude_leaves_it_out(
    client, everything_up, monkeypatch
):
    engine = f"tcp://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("DOCKER_HOST", engine)
    status, body = readyz(client)
    assert status == 503 and body["failed"] == ["docker"], body
    assert body["checks"]["docker"]["error"].startswith(f"no answer from the Docker engine at {engine}: ")

    status, body = readyz(client, "?exclude=docker")
    assert status == 200, body
    assert sorted(body["checks"]) == ["database", "model", "redis"]


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_does_not_check_docker_where_sandboxes_do_not_run_on_it(client, everything_up, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{closed_port()}")
    with override_settings(SANDBOX_PROVIDER="local"):
        status, body = readyz(client)
    assert status == 200 and "docker" not in body["checks"], body


def test_readyz_refuses_an_exclude_it_has_no_check_for_and_checks_nothing(client):
    response = client.get("/readyz?exclude=docker&exclude=dokcer")
    assert response.status_code == 400
    assert json.loads(response.content) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "/readyz has no check named dokcer: exclude one of database, redis, broker, model, docker.",
        },
    }


def test_the_health_endpoints_answer_only_get_and_head(client):
    assert client.head("/healthz").status_code == 200
    for path in ("/healthz", "/readyz"):
        assert client.post(path).status_code == 405
        assert client.delete(path).status_code == 405


@pytest.mark.server
def test_a_server_whose_dependencies_are_all_down_is_alive_but_not_ready(tmp_path):
    """A real Daphne pointed at a closed port for each dependency: /healthz answers 200 (it touches none of
    them), /readyz 503 naming all four, each with the address it tried."""
    from bench.common.processes import daphne

    ports = {name: closed_port() for name in ("database", "redis", "model", "docker")}
    env = child_env(
        DATABASE_URL=f"postgres://workbench:secret@127.0.0.1:{ports['database']}/workbench",
        REDIS_URL=f"redis://127.0.0.1:{ports['redis']}/0",
        CELERY_BROKER_URL=f"redis://127.0.0.1:{ports['redis']}/0",
        ANTHROPIC_API_KEY="",
        ANTHROPIC_BASE_URL=f"http://127.0.0.1:{ports['model']}",
        DOCKER_HOST=f"tcp://127.0.0.1:{ports['docker']}",
        SANDBOX_PROVIDER="docker",
    )
    with daphne(env, tmp_path / "daphne.log", timeout=90, cwd=ROOT) as url:
        alive = httpx.get(f"{url}/healthz", timeout=10)
        assert alive.status_code == 200 and alive.json() == {"ok": True}
        ready = httpx.get(f"{url}/readyz", timeout=10)
    assert ready.status_code == 503
    body = ready.json()
    assert body["ready"] is False and body["failed"] == ["database", "redis", "model", "docker"], body
    checks = body["checks"]
    assert checks["database"]["error"].startswith(
        f"no answer from the PostgreSQL at 127.0.0.1:{ports['database']}/workbench: "
    )
    assert "secret" not in json.dumps(body)
    for name in ("redis", "model", "docker"):
        assert str(ports[name]) in checks[name]["error"], checks[name]


@pytest.mark.postgres
@pytest.mark.redis
def test_the_health_command_exits_1_naming_a_celery_node_that_does_not_answer(db, redis_url, offline_model):
    """`python -m workbench.health`, the containers' health check: 0 when every check passes, 1 and the
    failed check's reason on stderr when one does not (here a ping to a Celery node nobody runs)."""
    import subprocess
    import sys

    env = child_env(
        REDIS_URL=redis_url, CELERY_BROKER_URL=redis_url, ANTHROPIC_BASE_URL=offline_model.base_url
    )
    command = [sys.executable, "-m", "workbench.health", "--exclude", "docker"]
    ready = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.strip() == "ready: database, redis, model"

    node = "worker@nobody-runs-this"
    down = subprocess.run(
        [*command, "--ping", node], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 1
    assert down.stderr.strip() == f"celery: the Celery node {node} did not answer a ping within 2 s"
