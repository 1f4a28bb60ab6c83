"""A self-hosted environment from the browser: its queue and workers, its keys (shown once, revoked), the
worker command it shows, and the worker holding a session on that session's hands panel."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from django.utils.html import escape
from playwright.sync_api import expect

from harness.services.lifecycle import session_create
from sandboxes.models import EnvironmentKey, WorkItem, WorkPoller
from sandboxes.work import work_ensure
from sandboxes.work_keys import environment_key_create
from tests.conftest import ROOT, make_agent, make_environment
from tests.e2e.conftest import TOOLSET, log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_ID = "lab-worker-1"


class Worker:
    """A worker's calls to the live server with one bearer credential, as the SDK's worker makes them."""

    def __init__(self, base: str, environment_id: str, key: str):
        self.work = f"{base}/v1/environments/{environment_id}/work"
        self.headers = {"Authorization": f"Bearer {key}", "Anthropic-Worker-ID": WORKER_ID}

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.work}{path}", headers=self.headers)

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return httpx.post(f"{self.work}{path}", headers=self.headers, json=body)


def test_an_operator_sees_the_queue_issues_and_revokes_a_key_and_sees_the_worker_on_the_hands_panel(
    page, live_server_url, operator
):
    base = live_server_url
    environment_id = make_environment(name="lab", config={"type": "self_hosted"})
    session = session_create(
        agent=make_agent(tools=TOOLSET), environment_id=environment_id, title="on the lab"
    )
    pages: list[str] = []
    page.on("dialog", lambda dialog: dialog.accept())

    log_in(page, base, then=f"/environments/{environment_id}/")
    expect(page.locator("#queue-depth")).to_have_text("0")
    expect(page.locator("#queue-workers")).to_have_text("0")
    expect(page.locator("#work-items tbody")).to_contain_text("No work items yet")
    expect(page.locator("#environment-keys tbody")).to_contain_text("No environment keys yet")
    command = page.locator("#worker-command").input_value()
    assert f"environment_id='{environment_id}'" in command and f"base_url='{base}'" in command
    assert "os.environ['ANTHROPIC_ENVIRONMENT_KEY']" in command and ".work.worker(" in command

    # Issue a key: it is shown this once.
    page.fill("#environment-keys input[name=name]", "lab machine")
    page.click("#environment-keys button:has-text('Issue key')")
    raw = page.locator("#new-environment-key").input_value()
    assert raw.startswith("wbek_") and len(raw) > 40
    expect(page.locator("#environment-keys")).to_contain_text(
        "it is not stored, so it will not be shown again"
    )
    expect(page.locator("#environment-keys tbody")).to_contain_text(raw[:12])
    expect(page.locator("#environment-keys tbody")).to_contain_text("never")
    screenshot(page, "self-hosted-key-issued")

    page.reload()
    assert page.locator("#new-environment-key").count() == 0
    expect(page.locator("#environment-keys tbody")).to_contain_text(raw[:12])
    pages.append(page.content())

    # The key works: its poll (no work yet: JSON null) is counted as a worker polling.
    worker = Worker(base, environment_id, raw)
    empty = worker.get("/poll")
    assert empty.status_code == 200 and empty.json() is None
    page.reload()
    expect(page.locator("#queue-workers")).to_have_text("1")
    expect(page.locator("#queue-pollers")).to_contain_text(WORKER_ID)
    expect(page.locator("#environment-keys tbody tr", has_text="lab machine")).not_to_contain_text("never")
    pages.append(page.content())

    # A session that needs hands queues an item; the queue and the environments list show it.
    work_id = work_ensure(session.id)
    page.reload()
    expect(page.locator("#queue-depth")).to_have_text("1")
    expect(page.locator("#queue-oldest")).to_contain_text("ago")
    row = page.locator(f"#work-items tr[data-work='{work_id}']")
    expect(row).to_contain_text("queued")
    expect(row.locator("a")).to_have_text("on the lab")
    screenshot(page, "self-hosted-queue")
    pages.append(page.content())
    page.goto(f"{base}/environments/")
    lab = page.locator("tbody tr", has_text="lab")
    expect(lab.locator(".queue-depth")).to_have_text("1 waiting")
    expect(lab.locator(".queue-workers")).to_have_text("1 worker polling")
    screenshot(page, "environments-self-hosted")
    pages.append(page.content())

    # A worker claims it: poll, ack, the first heartbeat.
    item = worker.get("/poll").json()
    assert item["id"] == work_id and item["secret"]
    assert worker.post(f"/{work_id}/ack").status_code == 200
    beat = worker.post(f"/{work_id}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT")
    assert beat.status_code == 200, beat.text
    page.goto(f"{base}/environments/{environment_id}/")
    expect(page.locator("#queue-depth")).to_have_text("0")
    row = page.locator(f"#work-items tr[data-work='{work_id}']")
    expect(row).to_contain_text("active")
    expect(row.locator("td[data-label=Worker]")).to_have_text(WORKER_ID)
    expect(row.locator("td[data-label=Acknowledged]")).to_contain_text("ago")
    expect(row.locator("td[data-label='Last heartbeat']")).to_contain_text("ago")
    expect(row.locator("td[data-label='Lease until']")).to_contain_text("in ")
    pages.append(page.content())

    # The session's hands panel names the worker and since when; it offers terminate only.
    row.locator("a", has_text="on the lab").click()
    page.wait_for_url(f"{base}/sessions/{session.id}/")
    hand = page.locator("#panel .hand[data-worker]")
    expect(hand).to_have_attribute("data-worker", WORKER_ID)
    expect(hand).to_contain_text(f"worker {WORKER_ID}")
    expect(hand).to_contain_text("holding this session since")
    expect(hand).to_contain_text(work_id)
    expect(hand.locator("button")).to_have_text(["Terminate"])
    screenshot(page, "self-hosted-hands")
    pages.append(page.content())

    # Terminating the hand asks the worker to stop: its next heartbeat is told the lease is not extended.
    hand.locator("button:has-text('Terminate')").click()
    expect(page.locator("#panel-status.notice")).to_contain_text("Terminated")
    expect(page.locator("#panel .hand[data-worker]")).to_have_count(0)
    assert WorkItem.objects.get(id=work_id).state == WorkItem.State.STOPPING
    last = beat.json()["last_heartbeat"]
    stopping = worker.post(f"/{work_id}/heartbeat?{urlencode({'expected_last_heartbeat': last})}")
    assert stopping.status_code == 200 and stopping.json()["lease_extended"] is False
    pages.append(page.content())

    # Revoke the key (after the confirmation): the next poll is refused.
    page.goto(f"{base}/environments/{environment_id}/")
    expect(page.locator(f"#work-items tr[data-work='{work_id}']")).to_contain_text("stopping")
    page.locator("#environment-keys tr", has_text="lab machine").locator("button:has-text('Revoke')").click()
    expect(page.locator("#environment-keys .notice")).to_contain_text("Revoked lab machine")
    expect(page.locator("#environment-keys tr", has_text="lab machine")).to_contain_text("revoked")
    expect(page.locator("#environment-keys button:has-text('Revoke')")).to_have_count(0)
    refused = worker.get("/poll")
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    assert raw not in refused.text
    screenshot(page, "self-hosted-key-revoked")
    pages.append(page.content())
    page.reload()
    pages.append(page.content())

    secret = item["secret"]
    for html in pages:
        assert raw not in html, "the environment key was shown again"
        assert secret not in html, "a work item's secret reached a page"


def test_the_worker_command_the_page_shows_runs_a_worker_the_page_then_counts(
    page, live_server_url, operator
):
    base = live_server_url
    environment_id = make_environment(name="laptop", config={"type": "self_hosted"})
    _, raw = environment_key_create(environment_id, name="laptop")
    log_in(page, base, then=f"/environments/{environment_id}/")
    expect(page.locator("#queue-workers")).to_have_text("0")
    command = page.locator("#worker-command").input_value()
    python_line = next(line for line in command.splitlines() if line.startswith("python -c "))

    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(ANTHROPIC_ENVIRONMENT_KEY=raw, PATH=f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}")
    worker = subprocess.Popen(
        ["bash", "-c", python_line], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while not WorkPoller.objects.filter(environment_id=environment_id).exists():
            assert worker.poll() is None, f"the worker exited: {worker.communicate()[0].decode()[-2000:]}"
            assert time.monotonic() < deadline, "the worker never polled"
            time.sleep(0.2)
        page.reload()
        expect(page.locator("#queue-workers")).to_have_text("1")
        poller = WorkPoller.objects.get(environment_id=environment_id)
        expect(page.locator("#queue-pollers")).to_contain_text(poller.worker_id)
        expect(page.locator("#environment-keys tbody tr", has_text="laptop")).not_to_contain_text("never")
        screenshot(page, "self-hosted-worker-polling")
        assert raw not in page.content()
    finally:
        worker.kill()
        output = worker.communicate()[0].decode()
    assert "Traceback" not in output, output[-2000:]


def test_bad_key_and_page_requests_on_the_environment_page_are_refused_with_the_reason_and_change_nothing(
    client, operator
):
    """No browser: the views' answers to what the page's own forms never send."""
    environment_id = make_environment(name="lab", config={"type": "self_hosted"})
    other_id = make_environment(name="other lab", config={"type": "self_hosted"})
    cloud_id = make_environment(name="cloud")
    other_key, _ = environment_key_create(other_id, name="theirs")
    client.force_login(operator)
    keys = f"/environments/{environment_id}/keys"

    unnamed = client.post(f"{keys}/new", {"name": ""}, HTTP_HX_REQUEST="true")
    assert unnamed.status_code == 400 and b"This field is required." in unnamed.content
    nul = client.post(f"{keys}/new", {"name": "a\x00b"}, HTTP_HX_REQUEST="true")
    assert nul.status_code == 400 and b"Null characters are not allowed." in nul.content
    assert client.get(f"{keys}/new").status_code == 405

    theirs = client.post(f"{keys}/{other_key.id}/revoke", HTTP_HX_REQUEST="true")
    assert theirs.status_code == 404
    assert escape(f"Environment {environment_id} has no key {other_key.id!r}.") in theirs.content.decode()
    other_key.refresh_from_db()
    assert other_key.revoked_at is None

    for path in (f"/environments/{cloud_id}/keys/new", "/environments/env_nope/keys/new"):
        assert client.post(path, {"name": "x"}).status_code == 404
    cloud_page = client.get(f"/environments/{cloud_id}/")
    assert cloud_page.status_code == 200 and b"work-queue" not in cloud_page.content

    forged = client.get(f"/environments/{environment_id}/", {"page": "not-a-cursor"})
    assert forged.status_code == 200
    assert b"The &#x27;page&#x27; cursor is not valid" in forged.content
    assert b"Showing the newest items." in forged.content

    archive = client.post(f"/environments/{environment_id}/archive")
    assert archive.status_code == 302
    archived = client.post(f"{keys}/new", {"name": "late"}, HTTP_HX_REQUEST="true")
    assert archived.status_code == 400 and b"it takes no new keys" in archived.content
    assert not EnvironmentKey.objects.filter(environment_id=environment_id).exists()
    assert (
        b"This environment is archived: it takes no new keys."
        in client.get(f"/environments/{environment_id}/").content
    )
