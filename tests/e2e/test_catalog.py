"""Agents, environments and API keys from the browser, and who may see any of it."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from harness.models import Agent
from tests.e2e.conftest import PASSWORD, log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_api_key_is_shown_once_works_and_stops_working_when_revoked(page, live_server_url, operator):
    base = live_server_url
    log_in(page, base, then="/keys/")
    expect(page.locator("#keys tbody")).to_contain_text("No API keys in default yet")
    page.fill("#keys input[name=name]", "ci")
    page.click("#keys button:has-text('Create key')")
    raw = page.locator("#new-key").input_value()
    assert raw.startswith("wbk_") and len(raw) > 40
    expect(page.locator("#keys tbody")).to_contain_text(raw[:12])
    screenshot(page, "keys-created")
    assert httpx.get(f"{base}/v1/agents", headers={"x-api-key": raw}).status_code == 200

    page.reload()
    expect(page.locator("#keys tbody")).to_contain_text(raw[:12])
    assert page.locator("#new-key").count() == 0
    assert raw not in page.content(), "the key was shown a second time"
    page.goto(f"{base}/keys/")
    assert raw not in page.content()

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#keys button:has-text('Revoke')")
    expect(page.locator("#keys tbody")).to_contain_text("revoked")
    assert httpx.get(f"{base}/v1/agents", headers={"x-api-key": raw}).status_code == 401
    screenshot(page, "keys")

    page.fill("#keys input[name=name]", "dashboard")
    page.check("#keys input[name=read_only]")
    page.click("#keys button:has-text('Create key')")
    reader = page.locator("#new-key").input_value()
    expect(page.locator("#keys tbody tr", has_text=reader[:12])).to_contain_text("read-only")
    assert httpx.get(f"{base}/v1/agents", headers={"x-api-key": reader}).status_code == 200
    refused = httpx.post(f"{base}/v1/agents", headers={"x-api-key": reader}, json={"name": "a", "model": "m"})
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"


def test_agents_and_environments_are_created_edited_and_archived_with_the_problem_named(
    page, live_server_url, operator
):
    base = live_server_url
    log_in(page, base, then="/agents/")
    expect(page.locator("tbody")).to_contain_text("No agents yet")
    screenshot(page, "agents-empty")
    page.click("text=New agent")
    page.fill("#id_name", "reviewer")
    page.fill("#id_tools", '[{"type": "agent_toolset_20260401"')
    page.click("button:has-text('Create agent')")
    expect(page.locator(".field.has-error")).to_contain_text("not valid JSON")
    page.fill("#id_tools", '[{"type": "agent_toolset_20260401"}, {"type": "custom", "name": "bad name!"}]')
    page.click("button:has-text('Create agent')")
    expect(page.locator("#agent-form .error")).to_contain_text("tools[1]")
    screenshot(page, "agent-form-error")
    page.fill("#id_tools", '[{"type": "agent_toolset_20260401"}]')
    page.click("button:has-text('Create agent')")
    page.wait_for_url(f"{base}/agents/")
    expect(page.locator(".messages")).to_contain_text("Created agent reviewer")
    agent = Agent.objects.get()

    page.click("tbody a:has-text('reviewer')")
    page.fill("#id_system", "Review carefully.")
    page.click("button:has-text('Save as a new version')")
    page.wait_for_url(f"{base}/agents/")
    expect(page.locator(".messages")).to_contain_text(f"Saved {agent.id} as version 2")
    expect(page.locator("tbody tr", has_text="reviewer")).to_contain_text("v2")
    screenshot(page, "agents")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("tbody button:has-text('Archive')")
    expect(page.locator(".messages")).to_contain_text(f"Archived {agent.id}")
    expect(page.locator("tbody")).to_contain_text("No agents yet")

    page.goto(f"{base}/environments/new")
    page.fill("#id_name", "big")
    page.fill("#id_config", '{"type": "cloud", "sandbox": {"cpus": 999}}')
    page.click("button:has-text('Create environment')")
    expect(page.locator("#environment-form .error")).to_contain_text("'config.sandbox.cpus' must be a number")
    page.fill("#id_config", '{"type": "cloud", "sandbox": {"cpus": 2}}')
    page.click("button:has-text('Create environment')")
    page.wait_for_url(f"{base}/environments/")
    expect(page.locator("tbody tr", has_text="big")).to_contain_text("2 CPU")
    screenshot(page, "environments")


def test_only_operators_get_in(page, live_server_url, operator):
    from django.contrib.auth.models import User

    User.objects.create_user("visitor", password=PASSWORD)
    base = live_server_url
    page.goto(f"{base}/sandboxes/")
    page.wait_for_url(f"{base}/login/?next=%2Fsandboxes%2F")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("Please enter a correct username and password")
    page.fill("#id_username", "visitor")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("not an operator account")
    screenshot(page, "login")
    log_in(page, base, then="/sandboxes/")
    expect(page.locator("tbody")).to_contain_text("No live sandboxes")
    page.click("button:has-text('Log out')")
    page.wait_for_url(f"{base}/login/")
    assert httpx.get(f"{base}/sessions/nope/events", follow_redirects=False).status_code == 302


def test_every_page_fits_a_narrow_screen_and_says_when_it_is_empty(page, live_server_url, operator):
    from tests.e2e.test_replay_fork import recorded_session

    base = live_server_url
    page.set_viewport_size({"width": 390, "height": 800})
    log_in(page, base, then="/")
    expect(page.locator("#session-rows")).to_contain_text("No sessions yet")
    expect(page.locator("#start-form")).to_contain_text(
        "To start a session you need an agent and an environment"
    )
    session_id = recorded_session(turns=3)
    pages = {
        "sessions": "/",
        "session": f"/sessions/{session_id}/",
        "replay": f"/sessions/{session_id}/replay?slice=0:12",
        "fork": f"/sessions/{session_id}/fork?at=4",
        "sandboxes": "/sandboxes/",
        "agents": "/agents/",
        "agent-new": "/agents/new",
        "environments": "/environments/",
        "environment-new": "/environments/new",
        "keys": "/keys/",
    }
    for name, path in pages.items():
        page.goto(f"{base}{path}")
        width = page.evaluate("document.documentElement.scrollWidth")
        screenshot(page, f"narrow-{name}", full_page=True)
        assert width <= 390, f"{path} is {width} px wide on a 390 px screen"
