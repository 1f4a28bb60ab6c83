"""An operator's session from the browser: start it, watch the answer stream in, run tools, steer the brain."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from tests.conftest import make_agent, make_environment, make_session
from tests.e2e.conftest import TOOLSET, log_in, screenshot, send

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = "#timeline > .ev"


def event(page, event_type: str):
    return page.locator(f'{EVENTS}[data-type="{event_type}"]')


def streamed_lengths(page, *, until_final: int, timeout: float = 30) -> list[int]:
    """The lengths the streaming preview's text goes through, until the page shows `until_final` answers."""
    lengths: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        length = page.evaluate(
            "document.querySelector('#previews .ev.preview .text')?.textContent.length ?? -1"
        )
        if length > 0 and (not lengths or lengths[-1] != length):
            lengths.append(length)
        if event(page, "agent.message").count() >= until_final:
            return lengths
        page.wait_for_timeout(40)
    raise AssertionError(f"no final answer within {timeout} s; the preview went through {lengths}")


def test_an_operator_starts_a_session_sees_the_answer_stream_in_runs_a_tool_and_steers_the_brain(
    page, live_server_url, brain_worker, offline_model, operator, docker_engine
):
    base = live_server_url
    agent_id = make_agent(name="coder", tools=TOOLSET)
    environment_id = make_environment(name="docker")
    # Slow enough that the answer visibly arrives token by token.
    offline_model.set_latency(ttft_ms=700, tps=25)
    log_in(page, base)
    if not page.locator("details.start[open]").count():
        page.click("summary:has-text('Start a session')")
    page.select_option("#id_agent", agent_id)
    page.select_option("#id_environment", environment_id)
    page.fill("#id_title", "first contact")
    page.fill("#id_message", "/long 40")
    screenshot(page, "sessions-start-form")
    page.click("button:has-text('Start session')")
    page.wait_for_url(re.compile(rf"{base}/sessions/sesn_\w+/$"))

    lengths = streamed_lengths(page, until_final=1)
    assert len(lengths) >= 3, f"the answer did not stream in token by token: preview lengths {lengths}"
    answer = event(page, "agent.message").last
    expect(answer).to_contain_text("alpha bravo charlie")
    expect(page.locator("#previews .ev")).to_have_count(0)
    assert len(answer.locator(".text").inner_text()) >= lengths[-1]
    offline_model.set_latency(ttft_ms=0, tps=0)
    expect(page.locator("#session-status")).to_have_text("idle")

    send(page, "/bash echo hello-from-the-sandbox")
    call = event(page, "agent.tool_use").last
    expect(call.locator(".cmd")).to_have_text("echo hello-from-the-sandbox")
    expect(call.locator(".call-result")).to_contain_text("hello-from-the-sandbox")
    expect(event(page, "agent.tool_result").last).to_have_class(re.compile(r"\bfolded\b"))
    expect(event(page, "sandbox.provisioned")).to_have_count(1)
    expect(page.locator("#panel .hand")).to_contain_text("main")
    expect(page.locator("#session-status")).to_have_text("idle")
    screenshot(page, "session-tool-call")

    # While a turn runs, the harness cannot change; the panel says why. Esc interrupts the turn.
    send(page, "/sleep 3")
    expect(page.locator("#session-status")).to_have_text("running")
    page.select_option("#panel select[name=harness]", "bash-only")
    page.click("#panel button:has-text('Switch')")
    expect(page.locator("#panel-status.error")).to_contain_text("switch its harness between turns")
    page.locator("#timeline-view .timeline-scroll").click()
    page.keyboard.press("Escape")
    expect(event(page, "user.interrupt")).to_have_count(1)
    expect(page.locator("#session-status")).to_have_text("idle", timeout=15_000)

    page.select_option("#panel select[name=harness]", "bash-only")
    page.click("#panel button:has-text('Switch')")
    expect(page.locator("#panel-status.notice")).to_contain_text("bash-only")
    expect(event(page, "brain.harness_switched")).to_have_count(1)
    expect(page.locator("#panel .brain")).to_contain_text("bash-only")

    # A dropped socket shows a banner, reconnects from the last seq seen, and nothing is missed.
    page.evaluate("window.workbenchTimeline.socket.close()")
    expect(page.locator("#live-banner")).to_contain_text("reconnecting")
    expect(page.locator("#live-banner")).to_be_hidden(timeout=10_000)
    send(page, "after the reconnect")
    # The interrupted message had no answer, so the model reads both messages as one turn.
    expect(event(page, "agent.message").last).to_contain_text("after the reconnect")
    seqs = page.eval_on_selector_all(EVENTS, "nodes => nodes.map(n => Number(n.dataset.seq))")
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the timeline has a gap or a duplicate"
    screenshot(page, "session")
    page.set_viewport_size({"width": 390, "height": 800})
    screenshot(page, "session-narrow")

    page.set_viewport_size({"width": 1280, "height": 860})
    page.goto(f"{base}/")
    row = page.locator("#session-rows tr", has_text="first contact")
    expect(row).to_contain_text("idle")
    expect(row).to_contain_text("bash-only")
    expect(row).to_contain_text("main")
    screenshot(page, "sessions")
    page.select_option("select[name=status]", "running")
    expect(page.locator("#session-rows")).to_contain_text("No sessions match these filters")
    page.set_viewport_size({"width": 390, "height": 800})
    page.select_option("select[name=status]", "")
    expect(page.locator("#session-rows tr", has_text="first contact")).to_be_visible()
    screenshot(page, "sessions-narrow", full_page=True)
    # The list follows new sessions without a reload.
    make_session(title="arrived while watching")
    expect(page.locator("#session-rows tr", has_text="arrived while watching")).to_be_visible(timeout=10_000)


def test_a_tool_that_asks_is_allowed_or_denied_and_a_custom_tool_is_answered_from_the_page(
    page, live_server_url, brain_worker, operator, docker_engine
):
    base = live_server_url
    tools = [
        {"type": "agent_toolset_20260401", "default_config": {"permission_policy": {"type": "always_ask"}}},
        {
            "type": "custom",
            "name": "lookup",
            "description": "Look a word up.",
            "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    ]
    agent_id = make_agent(tools=tools)
    from harness.services.lifecycle import session_create

    session = session_create(**{"agent": agent_id, "environment_id": make_environment()})
    log_in(page, base, then=f"/sessions/{session.id}/")

    send(page, "/bash echo allowed-run")
    call = event(page, "agent.tool_use").last
    expect(call.locator("button:has-text('Allow')")).to_be_visible()
    screenshot(page, "session-confirmation")
    call.locator("button:has-text('Allow')").click()
    expect(call.locator(".call-result")).to_contain_text("allowed-run")
    expect(call.locator("button:has-text('Allow')")).to_be_hidden()

    send(page, "/bash echo never-run")
    expect(event(page, "agent.tool_use")).to_have_count(2)
    call = event(page, "agent.tool_use").last
    call.locator("input[name=deny_message]").fill("not today")
    call.locator("button:has-text('Deny')").click()
    expect(call.locator(".call-result")).to_contain_text("not today")
    expect(event(page, "user.tool_confirmation")).to_have_count(2)

    send(page, '/tool lookup {"word": "brain"}')
    custom = event(page, "agent.custom_tool_use").last
    custom.locator("textarea[name=text]").fill("the part that thinks")
    custom.locator("button:has-text('Send result')").click()
    expect(custom.locator(".call-result")).to_contain_text("the part that thinks")
    expect(event(page, "agent.message").last).to_contain_text("Result of lookup: the part that thinks")
