"""No public SECRET_KEY outside development: the web server, a worker and beat, started as an installation starts
them, refuse the repository's default (and compose's old placeholder) with a message naming the variable and
how to make one; DEBUG, ALLOW_INSECURE_SECRET_KEY=true or a real key let them start, and commands that only
change the database still run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from typing import Any

import pytest

from bench.common.processes import daphne
from tests.conftest import ROOT, child_env

pytestmark = pytest.mark.django_db(transaction=True)

SERVERS = {
    "web server": [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        "0",
        "workbench.asgi:application",
    ],
    "Celery worker": [sys.executable, "-m", "celery", "-A", "workbench", "worker", "--pool", "solo"],
    # Its schedule in a folder of its own: beat removes a schedule file it cannot read (as root, /dev/null too).
    "Celery beat": [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workbench",
        "beat",
        "-s",
        f"{tempfile.mkdtemp()}/schedule",
    ],
}


def installation_env(**extra: str) -> dict[str, str]:
    """The environment of a process an installation starts: not under pytest, not DEBUG, no key of its own."""
    env = child_env(**{"SECRET_KEY": "", "DEBUG": "false", "ALLOW_INSECURE_SECRET_KEY": "false", **extra})
    env.pop("PYTEST_VERSION", None)
    return env


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("key", ["", "workbench-insecure-dev-key-set-SECRET_KEY-in-production", "change-me"])
@pytest.mark.parametrize("process", list(SERVERS))
def test_a_server_refuses_to_start_with_a_public_secret_key(process, key):
    done = run(SERVERS[process], installation_env(SECRET_KEY=key))
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert f"The {process} will not start: SECRET_KEY is not set" in said
    assert "secrets.token_urlsafe(50)" in said and "ALLOW_INSECURE_SECRET_KEY=true" in said


@pytest.mark.parametrize(
    "setting",
    [
        {"SECRET_KEY": "a-real-key-long-and-random-enough-for-this-test-0123456789"},
        {"DEBUG": "true"},
        {"ALLOW_INSECURE_SECRET_KEY": "true"},
    ],
    ids=["a real key", "DEBUG", "the development opt-in"],
)
def test_the_web_server_starts_with_a_real_key_or_in_development(redis_url, setting: dict[str, Any]):
    with daphne(installation_env(**setting), ROOT / ".pytest-daphne.log", append_log=True, timeout=90) as url:
        assert url.startswith("http://127.0.0.1:")


def test_a_worker_starts_with_a_real_key(redis_url):
    env = installation_env(SECRET_KEY="a-real-key-long-and-random-enough-for-this-test-0123456789")
    command = [*SERVERS["Celery worker"], "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if b" ready." in line:
                break
        else:
            pytest.fail(f"the worker exited with {process.wait()} before it was ready")
    finally:
        process.terminate()
        process.wait(30)


def test_database_commands_run_without_a_key():
    done = run([sys.executable, "manage.py", "migrate", "--check"], installation_env())
    assert done.returncode == 0, done.stderr
