"""The browser tests' fixtures: real Chromium through Playwright, an operator account, and helpers.

Chromium is Debian's /usr/bin/chromium. Outside CI a missing browser skips these tests with the reason;
under CI=true it fails them (tests/conftest.py's `require`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, operator_of, require

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
PASSWORD = "a-long-operator-password"
TOOLSET = [{"type": "agent_toolset_20260401"}]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, for one test module; Playwright's event loop lives exactly as long, so the suites that run
    after these tests in the same process never see it."""
    require(os.path.exists(CHROMIUM), f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=20_000)
    # Playwright's sync API keeps an asyncio loop in this thread, which Django's async-safety check takes
    # for async code, refusing the tests' own synchronous ORM calls and database flushes. This variable is
    # Django's documented way out; it is set only while the browser runs.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    report = yield
    if report.when == "call":
        item.failed_call = report.failed
    return report


@pytest.fixture
def page(browser: Any, request: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies) with one page; page errors fail the test, and a failed
    test leaves a screenshot of where it stood."""
    (SCREENSHOTS / f"FAILED-{request.node.name}.png").unlink(missing_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(20_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    if getattr(request.node, "failed_call", False):
        screenshot(page, f"FAILED-{request.node.name}", full_page=True)
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def operator(transactional_db: Any) -> Any:
    from django.contrib.auth.models import User

    return operator_of(User.objects.create_user("operator", password=PASSWORD, is_staff=True))


def log_in(
    page: Any, base_url: str, *, username: str = "operator", password: str = PASSWORD, then: str = "/"
) -> None:
    """Log in through the UI's own login page, landing on `then`."""
    page.goto(f"{base_url}{then}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}{then}")


def screenshot(page: Any, name: str, *, full_page: bool = False) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def send(page: Any, text: str) -> None:
    """Type into the composer and press Enter, as an operator would."""
    page.fill("#composer-text", text)
    page.press("#composer-text", "Enter")
