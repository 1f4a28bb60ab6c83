"""Hands from the browser: a sandbox passed from one session to another keeps its files."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from harness.services.lifecycle import session_create
from sandboxes.hands import held
from tests.conftest import make_agent, make_environment
from tests.e2e.conftest import TOOLSET, log_in, screenshot, send

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_sandbox_passed_to_another_session_is_used_there_with_the_files_the_first_wrote(
    page, live_server_url, brain_worker, operator, docker_engine
):
    base = live_server_url
    agent_id, environment_id = make_agent(tools=TOOLSET), make_environment(name="docker")
    first = session_create(**{"agent": agent_id, "environment_id": environment_id, "title": "writer"}).id
    second = session_create(**{"agent": agent_id, "environment_id": environment_id, "title": "reader"}).id

    log_in(page, base, then=f"/sessions/{first}/")
    send(page, "/bash echo note-from-the-writer > /workspace/note.txt && cat /workspace/note.txt")
    call = page.locator('#timeline > .ev[data-type="agent.tool_use"]').last
    expect(call.locator(".call-result")).to_contain_text("note-from-the-writer")
    expect(page.locator("#session-status")).to_have_text("idle")
    hand = page.locator("#panel .hand", has_text="main")
    expect(hand).to_be_visible()
    sandbox_id = hand.get_attribute("data-sandbox")
    screenshot(page, "session-hands")

    hand.locator("select[name=to_session]").select_option(second)
    hand.locator("button:has-text('Pass')").click()
    expect(page.locator("#panel-status.notice")).to_contain_text(f"Passed {sandbox_id} to session {second}")
    expect(page.locator("#panel .hand")).to_have_count(0)
    detached = page.locator('#timeline > .ev[data-type="sandbox.detached"]')
    expect(detached).to_contain_text(f"passed to {second}")
    assert [hand.id for hand in held(second)] == [sandbox_id]

    page.goto(f"{base}/sessions/{second}/")
    expect(page.locator('#timeline > .ev[data-type="sandbox.attached"]')).to_contain_text(
        f"passed from {first}"
    )
    expect(page.locator("#panel .hand", has_text="main")).to_have_attribute("data-sandbox", sandbox_id)
    send(page, "/bash cat /workspace/note.txt")
    call = page.locator('#timeline > .ev[data-type="agent.tool_use"]').last
    expect(call.locator(".call-result")).to_contain_text("note-from-the-writer")
    # It ran in the passed sandbox: the second session never provisioned one of its own.
    expect(page.locator('#timeline > .ev[data-type="sandbox.provisioned"]')).to_have_count(0)

    page.goto(f"{base}/sandboxes/")
    row = page.locator("tr", has_text=sandbox_id)
    expect(row).to_contain_text("reader")
    expect(row).to_contain_text("ready")
    screenshot(page, "sandboxes")

    # Detach from the second session, then attach it back from the panel's list of free sandboxes.
    page.goto(f"{base}/sessions/{second}/")
    page.locator("#panel .hand", has_text="main").locator("button:has-text('Detach')").click()
    expect(page.locator("#panel-status.notice")).to_contain_text("free for another session")
    page.locator("#panel select[name=sandbox]").select_option(sandbox_id)
    page.click("#panel button:has-text('Attach')")
    expect(page.locator("#panel-status.notice")).to_contain_text(f"Attached {sandbox_id}")
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#panel .hand", has_text="main").locator("button:has-text('Terminate')").click()
    expect(page.locator("#panel-status.notice")).to_contain_text(f"Terminated {sandbox_id}")
    expect(page.locator('#timeline > .ev[data-type="sandbox.terminated"]')).to_have_count(1)
