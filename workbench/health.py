"""`/healthz`: this process answers. `/readyz`: what it needs answers too, and if not, which and why.

Both are outside `/v1`, need no credential and are cheap: `/healthz` touches nothing; `/readyz` opens one
connection to each dependency at once, each given CHECK_TIMEOUT_SECONDS, and answers 503 naming the ones
that failed. As in Kubernetes' `/readyz`, `?exclude=NAME` (repeatable) leaves a check out: the compose file's
web server holds no Docker socket (the workers do, and their own health check covers the engine).

`python -m workbench.health [--ping NODE] [--exclude NAME ...]` runs the same checks in a process of their own,
for the health checks of containers that serve no HTTP (workers, beat): with `--ping`, also that the Celery
node NODE (`worker@<hostname>`, `celerybeat@<hostname>`) answers a remote-control ping through the broker, so
a worker whose consumer is stuck is not healthy. It prints what failed and exits 1 when anything did.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.errors
import httpx
import psycopg
import redis
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe

CHECK_TIMEOUT_SECONDS = 2.0
# What a check may take at most, its own timeouts included, before it counts as not answering.
CHECK_DEADLINE_SECONDS = CHECK_TIMEOUT_SECONDS + 1.0
HOSTED_API = "https://api.anthropic.com"
KNOWN_CHECKS = ("database", "redis", "broker", "model", "docker")
NO_STORE = {"Cache-Control": "no-store"}


class NotReady(Exception):
    """A dependency did not answer; the message says which one, where, and what happened."""


@require_safe
async def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True}, headers=NO_STORE)


@require_safe
async def readyz(request: HttpRequest) -> HttpResponse:
    checks = dependencies()
    excluded = request.GET.getlist("exclude")
    unknown = sorted(set(excluded) - set(KNOWN_CHECKS))
    if unknown:
        # Here, not at the top: `python -m workbench.health` imports this module before Django is set up.
        from kernel.api.edge import error_response
        from kernel.api.errors import InvalidRequest

        return error_response(
            InvalidRequest(
                f"/readyz has no check named {', '.join(unknown)}: exclude one of {', '.join(KNOWN_CHECKS)}."
            ),
            "req_none",
        )
    body = await readiness({name: check for name, check in checks.items() if name not in excluded})
    return JsonResponse(body, status=200 if body["ready"] else 503, headers=NO_STORE)


async def readiness(checks: dict[str, Callable[[], None]]) -> dict[str, Any]:
    """Run the checks at once: `{"ready", "failed": [names], "checks": {name: {"ok"[, "error"]}}}`."""
    names = list(checks)
    errors = await asyncio.gather(*(_run(checks[name]) for name in names))
    results = {
        name: {"ok": True} if error is None else {"ok": False, "error": error}
        for name, error in zip(names, errors, strict=True)
    }
    failed = [name for name, error in zip(names, errors, strict=True) if error is not None]
    return {"ready": not failed, "failed": failed, "checks": results}


async def _run(check: Callable[[], None]) -> str | None:
    """None when the check passed, else why it did not."""
    try:
        await asyncio.wait_for(asyncio.to_thread(check), CHECK_DEADLINE_SECONDS)
    except TimeoutError:
        return f"no answer within {CHECK_DEADLINE_SECONDS:g} s"
    except NotReady as error:
        return str(error)
    return None


def dependencies() -> dict[str, Callable[[], None]]:
    """This process's dependencies by name: the database, Redis (and the Celery broker when it is another
    server), the model's endpoint, and the Docker engine when sandboxes run on it."""
    checks: dict[str, Callable[[], None]] = {"database": check_database, "redis": check_redis}
    if settings.CELERY_BROKER_URL != settings.REDIS_URL:
        checks["broker"] = check_broker
    checks["model"] = check_model
    if settings.SANDBOX_PROVIDER == "docker":
        checks["docker"] = check_docker
    return checks


def check_database() -> None:
    """A new connection (not the pool's, which would wait DATABASE_POOL_TIMEOUT for a server that is down)
    and one query."""
    connection = connections["default"]
    where = f"{connection.vendor} database {connection.settings_dict.get('NAME')}"
    try:
        if connection.vendor == "postgresql":
            where = (
                f"PostgreSQL at {connection.settings_dict.get('HOST') or 'the local socket'}:"
                f"{connection.settings_dict.get('PORT') or 5432}/{connection.settings_dict.get('NAME')}"
            )
            params = connection.get_connection_params()
            params["connect_timeout"] = max(2, round(CHECK_TIMEOUT_SECONDS))  # libpq's least
            with psycopg.connect(**params) as raw:
                raw.execute("SELECT 1")
        else:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            finally:
                connection.close()  # this thread's, which nothing else would close
    except Exception as error:  # noqa: BLE001 - any failure means the database does not answer
        raise NotReady(f"no answer from the {where}: {_first_line(error)}") from error


def check_redis() -> None:
    _ping_redis(settings.REDIS_URL)


def check_broker() -> None:
    _ping_redis(settings.CELERY_BROKER_URL)


def _ping_redis(url: str) -> None:
    client = redis.Redis.from_url(
        url, socket_connect_timeout=CHECK_TIMEOUT_SECONDS, socket_timeout=CHECK_TIMEOUT_SECONDS
    )
    try:
        client.ping()
    except redis.RedisError as error:
        raise NotReady(
            f"no answer from Redis at {_without_credentials(url)}: {_first_line(error)}"
        ) from error
    finally:
        client.close()


def check_model() -> None:
    """The model's server answers HTTP (any status below 500: the hosted API's root is a 404)."""
    url = settings.ANTHROPIC_BASE_URL or HOSTED_API
    try:
        response = httpx.get(url, timeout=CHECK_TIMEOUT_SECONDS)
    except httpx.HTTPError as error:
        raise NotReady(
            f"no answer from the model's endpoint {_without_credentials(url)}: {_first_line(error)}"
        ) from error
    if response.status_code >= 500:
        raise NotReady(f"the model's endpoint {_without_credentials(url)} answered {response.status_code}")


def check_docker() -> None:
    """The engine the docker provider starts sandboxes on (DOCKER_HOST, or the local socket) answers a ping."""
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(version="auto", timeout=round(CHECK_TIMEOUT_SECONDS))
    except docker.errors.DockerException as error:  # the SDK asks the engine its version first
        raise NotReady(f"no answer from the Docker engine at {where}: {_first_line(error)}") from error
    try:
        client.ping()
    except Exception as error:  # noqa: BLE001 - the SDK raises requests' errors as well as its own
        raise NotReady(f"no answer from the Docker engine at {where}: {_first_line(error)}") from error
    finally:
        client.close()


def celery_ping(node: str) -> Callable[[], None]:
    """A check that the Celery node answers a remote-control ping through the broker."""

    def check() -> None:
        from workbench.celery import app

        try:
            replies = app.control.ping(destination=[node], timeout=CHECK_TIMEOUT_SECONDS)
        except Exception as error:  # noqa: BLE001 - kombu raises the transport's errors as they come
            raise NotReady(
                f"could not ask the Celery node {node} for a ping: {_first_line(error)}"
            ) from error
        if not any(node in reply for reply in replies):
            raise NotReady(f"the Celery node {node} did not answer a ping within {CHECK_TIMEOUT_SECONDS:g} s")

    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workbench.health",
        description="Check what this process's dependencies answer (as /readyz does); exit 1 if any does not.",
    )
    parser.add_argument("--ping", metavar="NODE", help="also ping this Celery node, e.g. worker@$HOSTNAME")
    parser.add_argument("--exclude", action="append", default=[], choices=KNOWN_CHECKS, metavar="NAME")
    args = parser.parse_args(argv)
    checks = {name: check for name, check in dependencies().items() if name not in args.exclude}
    if args.ping:
        checks["celery"] = celery_ping(args.ping)
    body = asyncio.run(readiness(checks))
    for name in body["failed"]:
        print(f"{name}: {body['checks'][name]['error']}", file=sys.stderr)
    if body["ready"]:
        print(f"ready: {', '.join(checks)}")
    return 0 if body["ready"] else 1


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


if __name__ == "__main__":
    # The settings, not django.setup(): no check needs the models, and loading every app would cost a
    # container's health check seconds of CPU each time instead of under one.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")
    sys.exit(main())
