"""Replaying a slice of the log, and forking a session from one of its events."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from harness.services.lifecycle import session_create
from sessions.models import Session
from sessions.services import emit_event
from tests.conftest import make_agent, make_environment, make_session
from tests.e2e.conftest import TOOLSET, log_in, screenshot, send

pytestmark = pytest.mark.django_db(transaction=True)

SHOWN = "#timeline > .ev"


def recorded_session(turns: int = 6) -> str:
    """A session with a few recorded turns, each a message, a tool call, its result and an answer."""
    session_id = make_session()
    for turn in range(turns):
        emit_event(
            session_id, {"type": "user.message", "content": [{"type": "text", "text": f"question {turn}"}]}
        )
        call = emit_event(
            session_id,
            {
                "type": "agent.tool_use",
                "name": "bash",
                "input": {"command": f"echo {turn}"},
                "evaluated_permission": "allow",
            },
        )
        emit_event(
            session_id,
            {
                "type": "agent.tool_result",
                "tool_use_id": call.uid,
                "is_error": False,
                "content": [{"type": "text", "text": f"answer {turn}"}],
            },
        )
        emit_event(
            session_id, {"type": "agent.message", "content": [{"type": "text", "text": f"it is {turn}"}]}
        )
    return session_id


def test_a_replayed_slice_steps_and_plays_as_the_timeline_shows_it_and_forks_at_the_cursor(
    page, live_server_url, operator
):
    base = live_server_url
    session_id = recorded_session()
    log_in(page, base, then=f"/sessions/{session_id}/")
    live_html = page.locator("#seq-9").evaluate("node => node.outerHTML")
    page.fill("#timeline-view .range input[name=start]", "4")
    page.fill("#timeline-view .range input[name=stop]", "20")
    page.click("#timeline-view .range button")
    page.wait_for_url(f"{base}/sessions/{session_id}/replay?start=4&stop=20")
    page.goto(f"{base}/sessions/{session_id}/replay?slice=4:20")

    expect(page.locator("[data-position]")).to_have_text("0 of 16 shown · next #4")
    expect(page.locator(SHOWN)).to_have_count(0)
    page.click("[data-act=step]")
    expect(page.locator("#seq-4")).to_be_visible()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    expect(page.locator(SHOWN)).to_have_count(3)
    # The call (#5) and its result (#6) fold together, as on the timeline; stepping back unfolds them.
    expect(page.locator("#seq-5 .call-result")).to_contain_text("answer 1")
    page.click("[data-act=back]")
    expect(page.locator(SHOWN)).to_have_count(2)
    expect(page.locator("#seq-5 .call-result")).not_to_contain_text("answer 1")

    page.select_option("[data-speed]", "0")
    page.click("[data-act=play]")
    expect(page.locator(SHOWN)).to_have_count(16)
    expect(page.locator("[data-act=play]")).to_have_text("▶ Play")
    expect(page.locator("[data-position]")).to_have_text("16 of 16 shown · next #20")
    assert page.locator("#seq-9").evaluate("node => node.outerHTML") == live_html
    screenshot(page, "replay")

    page.keyboard.press("Home")
    expect(page.locator(SHOWN)).to_have_count(0)
    for _ in range(8):
        page.keyboard.press("ArrowRight")
    expect(page.locator("#fork-form input[name=at_seq]")).to_have_value("12")
    page.click("#fork-form button:has-text('Fork')")
    page.wait_for_url(re.compile(rf"{base}/sessions/sesn_\w+/$"))
    fork = Session.objects.get(forked_from_id=session_id)
    assert fork.forked_at_seq == 12
    expect(page.locator(SHOWN)).to_have_count(13)
    expect(page.locator('#timeline > .ev[data-type="fork.created"]')).to_contain_text("copying events [0:12]")


def test_a_fork_from_an_event_copies_the_log_before_it_and_a_brain_answers_in_the_fork(
    page, live_server_url, brain_worker, operator
):
    base = live_server_url
    origin = session_create(
        **{"agent": make_agent(tools=TOOLSET), "environment_id": make_environment(), "title": "origin"}
    ).id
    log_in(page, base, then=f"/sessions/{origin}/")
    send(page, "first question")
    expect(page.locator(f'{SHOWN}[data-type="agent.message"]')).to_contain_text("You said: first question")
    expect(page.locator("#session-status")).to_have_text("idle")
    send(page, "second question")
    expect(page.locator(f'{SHOWN}[data-type="agent.message"]').last).to_contain_text(
        "You said: second question"
    )

    second = page.locator(f'{SHOWN}[data-type="user.message"]', has_text="second question")
    at = int(second.get_attribute("data-seq"))
    second.hover()
    second.locator(".ev-menu a:has-text('fork')").click()
    page.wait_for_url(f"{base}/sessions/{origin}/fork?at={at}")
    expect(page.locator("main")).to_contain_text("second question")
    screenshot(page, "fork")
    page.select_option("select[name=harness]", "bash-only")
    page.click("#fork-form button:has-text('Fork')")
    page.wait_for_url(re.compile(rf"{base}/sessions/sesn_\w+/$"))
    fork_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    assert fork_id != origin

    expect(page.locator(f'{SHOWN}[data-type="fork.created"]')).to_contain_text(f"copying events [0:{at}]")
    assert page.locator(f"{SHOWN}").first.get_attribute("data-seq") == "0"
    expect(page.locator(SHOWN, has_text="second question")).to_have_count(0)
    expect(page.locator("#panel dl").first).to_contain_text(origin)
    expect(page.locator("#panel .brain")).to_contain_text("bash-only")
    send(page, "a different second question")
    expect(page.locator(f'{SHOWN}[data-type="agent.message"]').last).to_contain_text(
        "You said: a different second question"
    )
    screenshot(page, "fork-continued")
