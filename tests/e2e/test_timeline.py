"""A long session in the browser: slices load as the operator scrolls, the page stays bounded, permalinks work."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from kernel.ids import new_id
from sessions.models import Event, Session
from sessions.services import emit_event
from tests.conftest import make_session
from tests.e2e.conftest import log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

LENGTH = 10_000
MAX_NODES = 600
FOLLOW_MOST = 60 + 5  # timeline.js: FOLLOW_NODES + FOLLOW_SLACK, the nodes kept while following the tail
FIRST = "document.querySelector('#timeline > .ev').dataset.seq"
LAST = "document.querySelector('#timeline > .ev:last-child').dataset.seq"


def long_session(length: int = LENGTH) -> str:
    """A session of `length` events, bulk-inserted: messages, and every tenth pair a tool call and its
    result. The first half is written under lease epoch 1, the second under epoch 2."""
    session_id = make_session()
    start = timezone.now() - timedelta(seconds=length)
    events = []
    for seq in range(length):
        epoch = 1 if seq < length // 2 else 2
        if seq % 10 == 3:
            kind, payload = (
                "agent.tool_use",
                {"name": "bash", "input": {"command": f"echo {seq}"}, "evaluated_permission": "allow"},
            )
        elif seq % 10 == 4:
            kind, payload = (
                "agent.tool_result",
                {
                    "tool_use_id": f"sevt_call{seq - 1}",
                    "is_error": False,
                    "content": [{"type": "text", "text": f"output of {seq - 1}"}],
                },
            )
        else:
            kind = "user.message" if seq % 2 else "agent.message"
            payload = {"content": [{"type": "text", "text": f"event {seq}"}]}
        events.append(
            Event(
                uid=f"sevt_call{seq}" if kind == "agent.tool_use" else new_id("sevt"),
                session_id=session_id,
                seq=seq,
                type=kind,
                payload=payload,
                processed_at=start + timedelta(seconds=seq),
                lease_epoch=epoch,
            )
        )
    Event.objects.bulk_create(events, batch_size=2000)
    Session.objects.filter(id=session_id).update(next_seq=length)
    return session_id


def seq_of(page, expression: str) -> int:
    return int(page.evaluate(expression))


def test_scrolling_up_a_10000_event_session_loads_earlier_slices_and_keeps_the_page_bounded(
    page, live_server_url, operator
):
    session_id = long_session()
    log_in(page, live_server_url, then=f"/sessions/{session_id}/")
    expect(page.locator(f"#seq-{LENGTH - 1}")).to_be_in_viewport()
    assert seq_of(page, FIRST) == LENGTH - 100
    scroller = page.locator("#timeline-view .timeline-scroll")

    counts = []
    for _ in range(12):
        first = seq_of(page, FIRST)
        scroller.evaluate("scroller => { scroller.scrollTop = 0; }")
        page.wait_for_function(f"Number({FIRST}) < {first}")
        counts.append(page.locator("#timeline > .ev").count())
    assert seq_of(page, FIRST) == LENGTH - 13 * 100
    assert max(counts) <= MAX_NODES, counts
    assert page.locator(f"#seq-{LENGTH - 1}").count() == 0, "the far end of the log was not dropped"
    # A call and its result loaded in the same slice fold together.
    call = page.locator(f"#seq-{LENGTH - 1200 + 3}")
    expect(call.locator(".call-result")).to_contain_text(f"output of {LENGTH - 1200 + 3}")
    expect(page.locator(f"#seq-{LENGTH - 1200 + 4}")).to_have_class("ev ev-result folded")
    screenshot(page, "timeline-long-scrolled-up")

    # Scrolling back down fetches the dropped slices again, up to the tail.
    for _ in range(20):
        if page.locator(f"#seq-{LENGTH - 1}").count():
            break
        last = seq_of(page, LAST)
        scroller.evaluate("scroller => { scroller.scrollTop = scroller.scrollHeight; }")
        page.wait_for_function(f"Number({LAST}) > {last}")
        assert page.locator("#timeline > .ev").count() <= MAX_NODES
    expect(page.locator(f"#seq-{LENGTH - 1}")).to_be_attached()

    # A permalink to an old event loads its slice and shows it; the lease change there is marked.
    page.goto(f"{live_server_url}/sessions/{session_id}/#seq-5000")
    # Wait for the node with a plain selector poll: while an `expect` finds no element, Playwright takes an
    # aria snapshot of the whole page on every retry, which on a page holding 600 events starves the page's
    # own work (parsing the slice it is loading) on a loaded machine.
    page.wait_for_selector("#seq-5000", state="attached")
    target = page.locator("#seq-5000")
    expect(target).to_be_in_viewport()
    expect(target).to_have_class("ev ev-agent highlight")
    expect(target.locator(".lease-change")).to_have_text("Lease changed hands: epoch 1 → 2")
    assert page.locator("#timeline > .ev").count() <= MAX_NODES
    screenshot(page, "timeline-permalink")


def test_following_a_live_session_keeps_few_nodes_and_scrolling_up_brings_the_rest_back(
    page, live_server_url, operator
):
    session_id = make_session()
    log_in(page, live_server_url, then=f"/sessions/{session_id}/")
    page.wait_for_function("window.workbenchTimeline?.socket?.readyState === 1")
    counts = []
    for i in range(150):
        emit_event(session_id, {"type": "agent.message", "content": [{"type": "text", "text": f"live {i}"}]})
        if i % 10 == 9:
            page.wait_for_selector(f"#seq-{i}", state="attached")
            counts.append(page.locator("#timeline > .ev").count())
    expect(page.locator("#seq-149")).to_be_in_viewport()
    assert max(counts) <= FOLLOW_MOST, counts
    assert page.locator("#seq-0").count() == 0, "following the tail, the oldest nodes were not dropped"

    scroller = page.locator("#timeline-view .timeline-scroll")
    for _ in range(10):
        if page.locator("#seq-0").count():
            break
        first = seq_of(page, FIRST)
        scroller.evaluate("scroller => { scroller.scrollTop = 0; }")
        page.wait_for_function(f"Number({FIRST}) < {first}")
    expect(page.locator("#seq-0")).to_be_attached()
    assert page.locator("#timeline > .ev").count() == 150, "scrolled up, the page keeps up to 600 again"
