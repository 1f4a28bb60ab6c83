"""The vault page: create a vault, add and replace credentials, archive, and never a secret on a page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import log_in, screenshot
from vault.models import Credential, CredentialUse

pytestmark = pytest.mark.django_db(transaction=True)

CANARY = "canary-ui-41d7-never-on-a-page"


def test_an_operator_manages_a_vault_and_no_page_ever_shows_a_secret(
    page, live_server_url, operator, vault_keyring
):
    base = live_server_url
    pages: list[str] = []
    log_in(page, base, then="/vaults/")
    expect(page.locator("tbody")).to_contain_text("No vaults yet")
    page.fill("#vault-new input[name=display_name]", "deploy keys")
    page.click("#vault-new button:has-text('Create vault')")
    expect(page.locator(".messages")).to_contain_text("Created vault deploy keys")
    vault_url = page.url

    # A bad credential: the rule is named, nothing is stored, and the typed secret is not sent back.
    page.select_option("#id_kind", "static_bearer")
    page.fill("#id_display_name", "search")
    page.fill("#id_mcp_server_url", "http://mcp.example.com/mcp")
    page.fill("#id_token", CANARY)
    page.click("button:has-text('Add credential')")
    expect(page.locator("#credential-new .error")).to_contain_text("must be an https:// URL")
    pages.append(page.content())
    assert not Credential.objects.exists()
    screenshot(page, "vault-credential-error")

    page.fill("#id_mcp_server_url", "https://mcp.example.com/mcp")
    page.fill("#id_token", CANARY)
    page.click("button:has-text('Add credential')")
    expect(page.locator(".messages")).to_contain_text("Added search")
    expect(page.locator("#credentials")).to_contain_text("https://mcp.example.com/mcp")
    pages.append(page.content())

    page.select_option("#id_kind", "environment_variable")
    page.fill("#id_secret_name", "SERVICE_TOKEN")
    page.fill("#id_secret_value", CANARY + "-env")
    page.fill("#id_allowed_hosts", "api.example.com\n*.example.org")
    page.click("button:has-text('Add credential')")
    expect(page.locator("#credentials")).to_contain_text("$SERVICE_TOKEN to api.example.com, *.example.org")
    pages.append(page.content())

    bearer = Credential.objects.get(kind="static_bearer")
    assert bearer.unseal(vault_keyring) == {"token": CANARY}
    page.fill(f"#replace-{bearer.id}", "rotated-" + CANARY)
    page.click(f"form:has(#replace-{bearer.id}) button:has-text('Replace')")
    expect(page.locator(".messages")).to_contain_text("Replaced the secret of search")
    bearer.refresh_from_db()
    assert bearer.unseal(vault_keyring) == {"token": "rotated-" + CANARY}
    pages.append(page.content())

    page.on("dialog", lambda dialog: dialog.accept())
    page.click(f"#credentials tr:has-text('{bearer.id}') button:has-text('Archive')")
    expect(page.locator(".messages")).to_contain_text("Archived search")
    expect(page.locator(f"#credentials tr:has-text('{bearer.id}')")).to_contain_text("archived")
    expect(page.locator("#audit")).to_contain_text("operator")
    actions = set(CredentialUse.objects.values_list("action", flat=True))
    assert actions == {"create", "update", "archive"}
    screenshot(page, "vault")
    pages.append(page.content())

    operator.is_superuser = True  # the admin's own permissions
    operator.save()
    page.goto(f"{base}/admin/vault/credential/{bearer.id}/change/")
    expect(page.locator("body")).to_contain_text("New secret")  # write-only: the field is empty
    assert page.locator("input[name=new_secret]").input_value() == ""
    pages.append(page.content())
    page.goto(f"{base}/vaults/")
    expect(page.locator("tbody")).to_contain_text("deploy keys")
    pages.append(page.content())
    page.goto(vault_url)
    page.click("button:has-text('Archive vault')")
    page.wait_for_url(f"{base}/vaults/")
    expect(page.locator("tbody")).to_contain_text("No vaults yet")
    for html in pages:
        assert CANARY not in html, "a secret reached a page"
