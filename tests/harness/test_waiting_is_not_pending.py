"""A session idle in requires_action, waiting for its listed calls to be answered, is not work for a brain:
a releasing brain does not go round again on it, so an answer that arrives meanwhile is not left for the
sweeper; the answer itself makes it pending."""

from __future__ import annotations

from harness.fold import fold
from harness.harnesses.base import pending
from sessions.selectors import get_events
from tests.harness.test_self_hosted import env_id, new_session, result_for, say, send, turn  # noqa: F401


def test_waiting_on_a_worker_is_not_pending_and_its_result_is(model_url, env_id):  # noqa: F811
    session_id = new_session(env_id)
    log = turn(session_id, say("/bash echo hello"))
    assert log[-1].payload["stop_reason"]["type"] == "requires_action"
    assert not pending(fold(get_events(session_id))), "nothing for a brain while the worker has the call"
    [use] = [e for e in log if e.type == "agent.tool_use"]
    send(session_id, result_for(use.uid, "hello"))
    assert pending(fold(get_events(session_id))), "the worker's answer is work for a brain"
