"""The reaper ends the sandboxes of sessions that ended, deleted ones included."""

from __future__ import annotations

import pytest

from harness.services.lifecycle import session_delete
from sandboxes.models import Sandbox
from sandboxes.reaper import reap_idle
from sessions.models import Event, Session
from tests.conftest import make_session


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
