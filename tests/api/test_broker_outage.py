"""A hung or refusing broker never turns a committed message into a retried one (issue 13, item 4).

The official SDK against the live server whose Redis (its own, started here) is stopped with SIGSTOP, or
killed: the send answers once its event is committed, so the SDK's retries never append it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from tests.conftest import ROOT, child_env, free_port, make_agent, make_environment, require

pytestmark = pytest.mark.server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A Redis of this test's own, which it may stop or kill without touching anyone else's."""
    import shutil

    require(
        shutil.which("redis-server") is not None, "redis-server is not installed; `make test` installs it"
    )
    port = free_port()
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    import redis

    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port, socket_connect_timeout=0.2).ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        yield process, f"redis://127.0.0.1:{port}/0"
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
            process.wait(10)


@pytest.fixture
def server_on_own_redis(transactional_db, own_redis) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    from bench.common.processes import daphne

    process, url = own_redis
    with daphne(
        child_env(REDIS_URL=url), ROOT / ".pytest-daphne.log", append_log=True, timeout=90
    ) as base_url:
        yield base_url, process


def _messages(session_id: str) -> list[str]:
    from sessions.models import Event

    return list(
        Event.objects.filter(session_id=session_id, type="user.message").values_list("uid", flat=True)
    )


@pytest.mark.parametrize("outage", ["hung", "refusing"])
def test_a_send_while_the_broker_is_down_answers_and_stores_the_message_once(
    server_on_own_redis, api_key, outage
):
    base_url, redis_process = server_on_own_redis
    # The SDK as a user has it: its default two retries, and a 20 s timeout as in the report.
    sdk = anthropic.Anthropic(base_url=base_url, api_key=api_key, timeout=20)
    session = sdk.beta.sessions.create(agent=make_agent(), environment_id=make_environment())
    if outage == "hung":
        os.kill(redis_process.pid, signal.SIGSTOP)
    else:
        redis_process.kill()
        redis_process.wait(10)
    began = time.monotonic()
    sent = sdk.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    )
    took = time.monotonic() - began
    assert [event.id for event in sent.data] == _messages(session.id), (
        "the log holds the message more than once"
    )
    assert took < 20, f"the send waited {took:.1f} s on the broker"
    assert sdk.beta.sessions.retrieve(session.id).status == "running", "the sweeper needs the session running"
