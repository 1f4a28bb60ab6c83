"""The reaper ends the sandboxes of sessions that ended, deleted ones included, and free ones idle past their
TTL, but never one a session took since it looked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from harness.services.lifecycle import session_delete
from sandboxes import reaper
from sandboxes.hands import sandbox_attach, sandbox_detach, sandbox_provision
from sandboxes.models import Sandbox
from sandboxes.provisioning import provider_of
from sandboxes.reaper import reap_idle
from sessions.models import Event, Session
from tests.conftest import make_environment, make_session


@pytest.mark.django_db
def test_reap_idle_ends_a_deleted_sessions_sandbox_though_its_log_takes_no_more_events():
    """Beat's reaper, and `make run` as it starts, used to stop at the first such sandbox with SessionNotFound."""
    session_id = make_session()
    environment_id = Session.objects.values_list("environment_id", flat=True).get(id=session_id)
    sandbox = Sandbox.objects.create(
        environment_id=environment_id, session_id=session_id, provider="docker", status=Sandbox.Status.READY
    )
    session_delete(session_id)
    logged = Event.objects.filter(session_id=session_id).count()

    assert reap_idle() == [sandbox.id]
    assert Sandbox.objects.get(id=sandbox.id).status == Sandbox.Status.TERMINATED
    assert Event.objects.filter(session_id=session_id).count() == logged


def _long_idle_free_sandbox(docker_engine: Any) -> tuple[Sandbox, str]:
    """A sandbox detached from its session and idle past its environment's TTL, and a session to take it."""
    environment_id = make_environment(config={"type": "cloud", "sandbox": {"idle_ttl_seconds": 60}})
    sandbox = sandbox_provision(make_session(environment_id=environment_id))
    sandbox_detach(sandbox.id)
    Sandbox.objects.filter(id=sandbox.id).update(last_used_at=timezone.now() - timedelta(minutes=5))
    return sandbox, make_session(environment_id=environment_id)


@pytest.mark.django_db(transaction=True)
def test_a_free_sandbox_idle_past_its_ttl_is_reaped_unless_it_was_attached_since(docker_engine):
    sandbox, taker = _long_idle_free_sandbox(docker_engine)
    sandbox_attach(sandbox.id, taker)
    assert reap_idle() == [], (
        "an attach starts the idle time again: the taker has not had its chance to use it"
    )
    assert Sandbox.objects.get(id=sandbox.id).status == Sandbox.Status.READY

    other, _ = _long_idle_free_sandbox(docker_engine)
    assert reap_idle() == [other.id]
    assert Sandbox.objects.get(id=other.id).status == Sandbox.Status.TERMINATED


@pytest.mark.django_db(transaction=True)
def test_an_attach_landing_while_the_reaper_judges_a_free_sandbox_wins(docker_engine, monkeypatch):
    """The round reads the free sandboxes first and judges them one by one: an operator's attach between
    the two must not have the sandbox ended under the session that just took it."""
    sandbox, taker = _long_idle_free_sandbox(docker_engine)
    judged = reaper.idle_seconds

    def attach_then_judge(seen: Sandbox) -> int:
        if seen.id == sandbox.id:
            sandbox_attach(sandbox.id, taker)  # after the round's read, before its verdict
        return judged(seen)

    monkeypatch.setattr(reaper, "idle_seconds", attach_then_judge)
    assert reap_idle() == []
    assert Sandbox.objects.get(id=sandbox.id).status == Sandbox.Status.READY
    assert Sandbox.objects.get(id=sandbox.id).session_id == taker
    assert "hello" in provider_of(sandbox).execute(
        sandbox.handle, "bash", {"command": "echo hello"}, timeout_s=60
    )
