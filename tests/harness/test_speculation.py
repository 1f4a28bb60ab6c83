"""A provisioning ahead begins once the model has answered its turn's request, not before: in the brain's own
process, its first queries would take the interpreter from the thread sending that request."""

from __future__ import annotations

import threading
import time

import pytest

from harness import model, speculation
from harness.brain import run_brain
from harness.services.lifecycle import session_create, session_send_events
from harness.speculation import Ahead
from tests.conftest import make_agent, make_environment

pytestmark = pytest.mark.django_db(transaction=True)
TOOLSET = [{"type": "agent_toolset_20260401"}]


@pytest.fixture
def provisioning(monkeypatch):
    """sandbox_provision_ahead, recorded instead of run: the moment each began."""
    began: list[float] = []
    called = threading.Event()

    def record(session_id, *, always, emit):
        began.append(time.monotonic())
        called.set()

    monkeypatch.setattr(speculation, "sandbox_provision_ahead", record)
    return began, called


def test_a_provisioning_ahead_waits_for_the_answer(provisioning, monkeypatch):
    began, called = provisioning
    monkeypatch.setattr(speculation, "AHEAD_GATE_SECONDS", 30.0)
    ahead = Ahead("sesn_x", epoch=1, always=True)
    assert not called.wait(0.3)
    ahead.answered()
    assert called.wait(10)
    ahead.wait(10)
    assert len(began) == 1


def test_without_an_answer_it_begins_after_the_gate(provisioning, monkeypatch):
    """A request that fails before any answer (the model down) does not hold the sandbox back for long."""
    began, called = provisioning
    monkeypatch.setattr(speculation, "AHEAD_GATE_SECONDS", 0.2)
    Ahead("sesn_x", epoch=1, always=True).wait(10)
    assert len(began) == 1


def test_a_turn_provisions_ahead_after_its_model_request_was_answered(model_url, provisioning, monkeypatch):
    began, _ = provisioning
    answered: list[float] = []
    real = model._create_stream

    def create(request):
        stream = real(request)
        answered.append(time.monotonic())
        return stream

    monkeypatch.setattr(model, "_create_stream", create)
    monkeypatch.setattr(speculation, "AHEAD_GATE_SECONDS", 30.0)  # only the answer lets it begin
    environment = make_environment(config={"type": "cloud", "sandbox": {"speculative": "always"}})
    session_id = session_create(agent=make_agent(tools=TOOLSET), environment_id=environment).id
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    )
    assert run_brain(session_id) == "idle"
    assert len(answered) == 1 and len(began) == 1
    # After the answer, and because of it: the gate alone would have held it 30 s from the request.
    assert answered[0] <= began[0] < answered[0] + speculation.AHEAD_GATE_SECONDS / 2
