"""The database tells the egress proxy what changed at commit, and the proxy forgets exactly the policies read
from it: the triggers (on a real PostgreSQL), the listening thread (its connection ended under it), and the
cache's rules (a load that straddles a notice is not kept)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.utils import timezone

from harness.services.lifecycle import session_update
from sandboxes.hands import sandbox_detach, sandbox_transfer
from sandboxes.models import Environment, Sandbox
from sessions import events
from sessions.services.log import emit_event
from tests.conftest import make_environment, make_session, on_postgres, require
from vault.egress.notices import CHANNEL, EVERYTHING, Notices
from vault.egress.policy import SandboxPolicy, SessionPolicy
from vault.egress.state import SESSION_KEY, Policies
from vault.models import Credential, RepositorySecret
from vault.services import credential_archive, credential_create, vault_archive, vault_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@contextlib.contextmanager
def listening() -> Iterator[list[str]]:
    """The keys the database sends on the proxy's channel while the block runs, read after it."""
    require(on_postgres(), "the notices are PostgreSQL's; run with DATABASE_URL=postgres://…")
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    keys: list[str] = []
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        yield keys
        keys.extend(n.payload for n in listener.notifies(timeout=0.5))


def _sandbox(session_id: str | None, environment_id: str) -> Sandbox:
    return Sandbox.objects.create(
        environment_id=environment_id, session_id=session_id, provider="docker", handle="h", status="ready"
    )


def _credential(vault_id: str) -> Credential:
    return credential_create(
        vault_id,
        auth={
            "type": "environment_variable",
            "secret_name": "TOKEN",
            "secret_value": "s3cret",
            "networking": {"type": "unrestricted"},
        },
        actor="test",
    )


def test_a_hand_moving_tells_the_proxy_and_its_everyday_writes_do_not():
    environment = make_environment()
    giver, taker = make_session(environment_id=environment), make_session(environment_id=environment)
    sandbox = _sandbox(giver, environment)
    with listening() as keys:
        Sandbox.objects.filter(id=sandbox.id).update(last_used_at=timezone.now(), labels={"x": 1})
        emit_event(giver, events.session_updated(title="a log line"))
    assert keys == [], "a sandbox's use and a session's log say nothing to the proxy"
    with listening() as keys:
        sandbox_transfer(sandbox.id, taker)
    # Twice: at the transfer's commit, and when the taker's reset of this containerless row marks it dead.
    assert keys == [f"sandbox:{sandbox.id}"] * 2
    other = _sandbox(giver, environment)
    with listening() as keys:
        sandbox_detach(other.id)
    assert keys == [f"sandbox:{other.id}"]
    with listening() as keys:
        Sandbox.objects.filter(id=other.id).update(status=Sandbox.Status.TERMINATED)
    assert keys == [f"sandbox:{other.id}"]


def test_a_change_rolled_back_says_nothing():
    environment = make_environment()
    sandbox = _sandbox(make_session(environment_id=environment), environment)
    taker = make_session(environment_id=environment)
    with listening() as keys, contextlib.suppress(RuntimeError):
        from django.db import transaction

        with transaction.atomic():
            sandbox_transfer(sandbox.id, taker)
            raise RuntimeError("rolled back")
    assert keys == []
    assert Sandbox.objects.get(id=sandbox.id).session_id != taker


def test_vaults_credentials_repository_tokens_and_networking_tell_the_proxy():
    vault = vault_create(display_name="v")
    environment = make_environment()
    session = make_session(environment_id=environment)
    with listening() as keys:
        credential = _credential(vault.id)
    assert keys == [f"vault:{vault.id}"], "a credential added"
    with listening() as keys:
        Credential.objects.filter(id=credential.id).update(last_used_at=timezone.now())
    assert keys == [], "a credential's use is not a change of it"
    with listening() as keys:
        credential_archive(vault.id, credential.id, actor="test")
    assert keys == [f"vault:{vault.id}"]
    with listening() as keys:
        session_update(session, vault_ids=[vault.id])
    assert keys == [f"session:{session}"]
    with listening() as keys:
        session_update(session, title="renamed")
    assert keys == [], "a session's title is not in a policy"
    with listening() as keys:
        secret = RepositorySecret(session_id=session, resource_id="res_1", url="https://git.example/r.git")
        secret.seal({"token": "ghp_x"})
        secret.save()
    assert keys == [f"session:{session}"]
    with listening() as keys:
        Environment.objects.filter(id=environment).update(
            config={"type": "cloud", "networking": {"type": "limited", "allowed_hosts": []}}
        )
    assert keys == [f"environment:{environment}"]
    with listening() as keys:
        vault_archive(vault.id, actor="test")
    assert f"vault:{vault.id}" in keys


class Loader:
    """Stands for the database: the policy each key has now; the next load can be held after its read."""

    def __init__(self) -> None:
        self.now: dict[str, Any] = {}
        self.loads: list[str] = []
        self.hold_next = False
        self.held = threading.Event()

    def load(self, key: str) -> Any:
        self.loads.append(key)
        value = self.now.get(key)
        if self.hold_next:
            self.hold_next = False
            self.held.wait(5)
        return value


def _sandbox_policy(sandbox: str, session: str, *, vaults: tuple[str, ...] = (), environment: str = "env_1"):
    return SandboxPolicy(sandbox, "hash", session, {}, vault_ids=vaults, environment_id=environment)


@pytest.mark.django_db(transaction=False)
async def test_each_notice_forgets_the_policies_read_from_what_it_names_and_only_those():
    loader = Loader()
    policies = Policies(loader, ttl=3600)  # type: ignore[arg-type]
    loader.now = {
        "sbx_a": _sandbox_policy("sbx_a", "ses_1", vaults=("vlt_1",)),
        "sbx_b": _sandbox_policy("sbx_b", "ses_2", vaults=("vlt_2",), environment="env_2"),
        SESSION_KEY + "ses_1": SessionPolicy("ses_1", vault_ids=("vlt_1",)),
        SESSION_KEY + "ses_2": SessionPolicy("ses_2", vault_ids=("vlt_2",)),
    }
    keys = list(loader.now)

    async def read_all() -> list[str]:
        loader.loads.clear()
        for key in keys:
            await policies.of(key)
        return sorted(loader.loads)

    assert await read_all() == sorted(keys)
    assert await read_all() == [], "kept"
    for notice, forgotten in [
        ("sandbox:sbx_a", ["sbx_a"]),
        ("session:ses_1", [SESSION_KEY + "ses_1", "sbx_a"]),
        ("vault:vlt_2", [SESSION_KEY + "ses_2", "sbx_b"]),
        ("environment:env_2", ["sbx_b"]),
        ("sandbox:sbx_unknown", []),
        (EVERYTHING, sorted(keys)),
    ]:
        policies.notice(notice)
        assert await read_all() == sorted(forgotten), notice


@pytest.mark.django_db(transaction=False)
async def test_a_load_under_way_when_its_notice_comes_is_not_kept_and_later_requests_read_afresh():
    loader = Loader()
    policies = Policies(loader, ttl=3600)  # type: ignore[arg-type]
    loader.now = {"sbx_a": _sandbox_policy("sbx_a", "ses_giver")}
    loader.hold_next = True
    early = asyncio.create_task(policies.of("sbx_a"))
    while not loader.loads:
        await asyncio.sleep(0.01)
    # The hand moves while the proxy reads it: the read saw the giver.
    loader.now = {"sbx_a": _sandbox_policy("sbx_a", "ses_taker")}
    policies.notice("sandbox:sbx_a")
    late = await policies.of("sbx_a")
    assert late is not None and late.session_id == "ses_taker", "a request after the notice reads afresh"
    loader.held.set()  # the old read ends last, and must not replace what the new one kept
    assert (await early).session_id == "ses_giver", "the request that came first gets what its read saw"
    assert len(loader.loads) == 2
    assert (await policies.of("sbx_a")).session_id == "ses_taker", "and the old read was not kept"
    assert len(loader.loads) == 2


def test_the_listening_thread_delivers_and_reads_everything_again_after_its_connection_is_ended():
    require(on_postgres(), "the notices are PostgreSQL's; run with DATABASE_URL=postgres://…")
    loop = asyncio.new_event_loop()
    got: list[str] = []
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    notices = Notices(loop, got.append)

    def wait_for(condition: Any, what: str) -> None:
        deadline = time.monotonic() + 15
        while not condition():
            assert time.monotonic() < deadline, f"{what}; got {got}, state {notices.state}"
            time.sleep(0.05)

    try:
        notices.start()
        wait_for(lambda: notices.state == "listening" and got == [EVERYTHING], "it listens and starts afresh")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, "sandbox:sbx_1"])
        wait_for(lambda: got[-1:] == ["sandbox:sbx_1"], "a notice reaches the loop")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
                [f"LISTEN {CHANNEL}"],
            )
            assert cursor.fetchone() == (True,), "the listener's connection was found and ended"
        wait_for(lambda: got[-1:] == [EVERYTHING] and notices.state == "listening", "it listens again")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, "vault:vlt_1"])
        wait_for(lambda: got[-1:] == ["vault:vlt_1"], "and notices reach the loop again")
    finally:
        notices.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()
        connections.close_all()
