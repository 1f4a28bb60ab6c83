"""/v1/vaults and their credentials: the SDK's shapes, write-only secrets, the audit trail, bad input."""

from __future__ import annotations

import json

import pytest

from sessions.models import Session
from tests.api.test_api import assert_error
from tests.conftest import make_agent, make_environment
from vault.models import Credential, CredentialUse, Vault

pytestmark = pytest.mark.django_db

CANARY = "canary-7d1c2a-never-shown"
MCP = "https://mcp.example.com/mcp"


def new_vault(api, name="ops") -> str:
    return api.post("/v1/vaults", {"display_name": name, "metadata": {"team": "ops"}}).json()["id"]


def add(api, vault_id: str, auth: dict, **fields) -> dict:
    response = api.post(f"/v1/vaults/{vault_id}/credentials", {"auth": auth, **fields})
    assert response.status_code == 200, response.content
    return response.json()


BEARER = {"type": "static_bearer", "mcp_server_url": MCP, "token": CANARY}
OAUTH = {
    "type": "mcp_oauth",
    "mcp_server_url": "https://oauth.example.com/mcp/",
    "access_token": CANARY,
    "expires_at": "2099-01-01T00:00:00Z",
    "refresh": {
        "client_id": "client-1",
        "refresh_token": CANARY + "-refresh",
        "token_endpoint": "https://auth.example.com/token",
        "token_endpoint_auth": {"type": "client_secret_post", "client_secret": CANARY + "-client"},
        "scope": "tools",
    },
}
VARIABLE = {
    "type": "environment_variable",
    "secret_name": "API_TOKEN",
    "secret_value": CANARY,
    "networking": {"type": "limited", "allowed_hosts": ["api.example.com", "*.Example.org"]},
}


def test_a_vault_is_created_read_changed_listed_archived_and_deleted(api):
    vault_id = new_vault(api)
    vault = api.get(f"/v1/vaults/{vault_id}").json()
    assert vault_id.startswith("vlt_") and vault["type"] == "vault" and vault["display_name"] == "ops"
    assert vault["metadata"] == {"team": "ops"} and vault["archived_at"] is None
    changed = api.post(f"/v1/vaults/{vault_id}", {"display_name": "ops 2", "metadata": {"team": None}}).json()
    assert changed["display_name"] == "ops 2" and changed["metadata"] == {}
    other = new_vault(api, "other")
    assert [v["id"] for v in api.get("/v1/vaults").json()["data"]] == [other, vault_id]
    assert api.post(f"/v1/vaults/{vault_id}/archive").json()["archived_at"] is not None
    assert [v["id"] for v in api.get("/v1/vaults").json()["data"]] == [other]
    assert len(api.get("/v1/vaults", include_archived="true").json()["data"]) == 2
    assert_error(
        api.post(f"/v1/vaults/{vault_id}", {"display_name": "x"}),
        400,
        "invalid_request_error",
        mentions="archived",
    )
    assert api.delete(f"/v1/vaults/{vault_id}").json() == {"id": vault_id, "type": "vault_deleted"}
    assert_error(api.get(f"/v1/vaults/{vault_id}"), 404, "not_found_error", mentions=vault_id)


def test_each_kind_of_credential_is_stored_sealed_and_shown_without_its_secrets(api):
    vault_id = new_vault(api)
    bearer = add(api, vault_id, BEARER, display_name="search")
    assert bearer["type"] == "vault_credential" and bearer["vault_id"] == vault_id
    assert bearer["auth"] == {"type": "static_bearer", "mcp_server_url": MCP}
    oauth = add(api, vault_id, OAUTH)
    assert oauth["auth"] == {
        "type": "mcp_oauth",
        "mcp_server_url": "https://oauth.example.com/mcp/",
        "expires_at": "2099-01-01T00:00:00Z",
        "refresh": {
            "client_id": "client-1",
            "token_endpoint": "https://auth.example.com/token",
            "token_endpoint_auth": {"type": "client_secret_post"},
            "scope": "tools",
        },
    }
    variable = add(api, vault_id, VARIABLE)
    assert variable["auth"] == {
        "type": "environment_variable",
        "secret_name": "API_TOKEN",
        "networking": {"type": "limited", "allowed_hosts": ["api.example.com", "*.example.org"]},
        "injection_location": {"header": True, "body": False},
    }
    listed = api.get(f"/v1/vaults/{vault_id}/credentials").json()
    assert [c["id"] for c in listed["data"]] == [variable["id"], oauth["id"], bearer["id"]]
    everything = json.dumps(listed) + json.dumps(
        [api.get(f"/v1/vaults/{vault_id}/credentials/{c['id']}").json() for c in listed["data"]]
    )
    assert CANARY not in everything
    # In the database only the sealed form: no row, in any column, holds the canary.
    rows = json.dumps([{k: str(v) for k, v in row.items()} for row in Credential.objects.values()])
    assert CANARY not in rows
    fields = {c.id: set(c.sealed) for c in Credential.objects.all()}
    assert fields == {
        bearer["id"]: {"token"},
        oauth["id"]: {"access_token", "refresh_token", "client_secret"},
        variable["id"]: {"secret_value"},
    }
    assert [u.action for u in CredentialUse.objects.order_by("id")] == ["create"] * 3
    assert CANARY not in json.dumps(list(CredentialUse.objects.values("detail", "actor", "host")))


def test_the_proxy_opens_what_was_sealed_and_each_field_is_bound_to_its_record(api, vault_keyring):
    vault_id = new_vault(api)
    credential = Credential.objects.get(id=add(api, vault_id, OAUTH)["id"])
    assert credential.unseal(vault_keyring) == {
        "access_token": CANARY,
        "refresh_token": CANARY + "-refresh",
        "client_secret": CANARY + "-client",
    }
    other = Credential.objects.get(id=add(api, vault_id, BEARER)["id"])
    other.sealed = {"token": credential.sealed["access_token"]}  # a sealed value copied to another row
    with pytest.raises(Exception, match="belongs to another record"):
        other.unseal(vault_keyring)


def test_an_update_replaces_only_the_secrets_it_sends(api, vault_keyring):
    vault_id = new_vault(api)
    oauth = add(api, vault_id, OAUTH)
    url = f"/v1/vaults/{vault_id}/credentials/{oauth['id']}"
    changed = api.post(
        url, {"auth": {"type": "mcp_oauth", "access_token": "new-access", "refresh": {"scope": ""}}}
    ).json()
    assert (
        "scope" not in changed["auth"]["refresh"] and changed["auth"]["expires_at"] == "2099-01-01T00:00:00Z"
    )
    row = Credential.objects.get(id=oauth["id"])
    assert row.unseal(vault_keyring) == {
        "access_token": "new-access",
        "refresh_token": CANARY + "-refresh",
        "client_secret": CANARY + "-client",
    }
    assert row.secret_version == 2
    variable = add(api, vault_id, VARIABLE)
    vurl = f"/v1/vaults/{vault_id}/credentials/{variable['id']}"
    moved = api.post(
        vurl,
        {
            "auth": {
                "type": "environment_variable",
                "networking": {"type": "unrestricted"},
                "injection_location": {"body": True},
            }
        },
    ).json()
    assert moved["auth"]["networking"] == {"type": "unrestricted"}
    assert moved["auth"]["injection_location"] == {"header": True, "body": True}
    assert_error(
        api.post(
            vurl,
            {
                "auth": {
                    "type": "environment_variable",
                    "injection_location": {"header": False, "body": False},
                }
            },
        ),
        400,
        "invalid_request_error",
        mentions="'header' or 'body'",
    )
    assert_error(
        api.post(vurl, {"auth": {"type": "static_bearer", "token": "x"}}),
        400,
        "invalid_request_error",
        mentions="cannot change",
    )
    assert_error(
        api.post(vurl, {"auth": {"type": "environment_variable", "secret_name": "OTHER"}}),
        400,
        "invalid_request_error",
        mentions="secret_name",
    )
    assert [u.detail for u in CredentialUse.objects.filter(action="update").order_by("id")][
        0
    ] == "updated: new access_token, auth settings"


BAD_CREDENTIALS = [
    ({"type": "static_bearer", "mcp_server_url": MCP}, "token"),
    ({"type": "static_bearer", "mcp_server_url": "ftp://x/mcp", "token": "t"}, "https:// URL"),
    (
        {"type": "static_bearer", "mcp_server_url": "http://mcp.example.com/", "token": "t"},
        "EGRESS_PLAIN_HOSTS",
    ),
    (
        {"type": "static_bearer", "mcp_server_url": "https://u:p@mcp.example.com/", "token": "t"},
        "credentials in the URL",
    ),
    (
        {
            "type": "mcp_oauth",
            "mcp_server_url": MCP,
            "access_token": "t",
            "expires_at": "2001-01-01T00:00:00Z",
        },
        "in the future",
    ),
    ({"type": "mcp_oauth", "mcp_server_url": MCP, "access_token": "t", "expires_at": "tomorrow"}, "RFC 3339"),
    ({"type": "password", "value": "x"}, "auth"),
    ({**VARIABLE, "secret_name": "1BAD"}, "environment variable name"),
    (
        {**VARIABLE, "networking": {"type": "limited", "allowed_hosts": ["https://api.example.com/x"]}},
        "bare hostnames",
    ),
    ({**VARIABLE, "networking": {"type": "limited", "allowed_hosts": ["::1"]}}, "IPv6"),
    (
        {
            **VARIABLE,
            "networking": {"type": "limited", "allowed_hosts": [f"h{i}.example.com" for i in range(17)]},
        },
        "16",
    ),
    ({**VARIABLE, "networking": {"type": "limited", "allowed_hosts": ["*.10.0.0.1"]}}, "wildcard"),
    ({**VARIABLE, "secret_value": ""}, "secret_value"),
]


@pytest.mark.parametrize(("auth", "mentions"), BAD_CREDENTIALS)
def test_a_bad_credential_is_a_400_that_says_why_and_stores_nothing(api, auth, mentions):
    vault_id = new_vault(api)
    body = assert_error(
        api.post(f"/v1/vaults/{vault_id}/credentials", {"auth": auth}),
        400,
        "invalid_request_error",
        mentions=mentions,
    )
    assert "canary" not in json.dumps(body)
    assert not Credential.objects.exists() and not CredentialUse.objects.exists()


def test_a_second_credential_for_one_server_or_variable_is_a_conflict(api):
    vault_id = new_vault(api)
    add(api, vault_id, BEARER)
    assert_error(
        api.post(
            f"/v1/vaults/{vault_id}/credentials",
            {"auth": {**BEARER, "mcp_server_url": "https://MCP.example.com:443/mcp/"}},
        ),
        409,
        "invalid_request_error",
        mentions="already has a credential for",
    )
    add(api, vault_id, VARIABLE)
    assert_error(
        api.post(f"/v1/vaults/{vault_id}/credentials", {"auth": VARIABLE}),
        409,
        "invalid_request_error",
        mentions="API_TOKEN",
    )


def test_archiving_and_deleting_a_credential(api):
    vault_id = new_vault(api)
    credential = add(api, vault_id, BEARER)
    url = f"/v1/vaults/{vault_id}/credentials/{credential['id']}"
    assert api.post(f"{url}/archive").json()["archived_at"] is not None
    assert api.get(f"/v1/vaults/{vault_id}/credentials").json()["data"] == []
    assert_error(api.post(url, {"display_name": "x"}), 400, "invalid_request_error", mentions="archived")
    add(api, vault_id, BEARER)  # an archived credential frees its server
    assert api.delete(url).json() == {"id": credential["id"], "type": "vault_credential_deleted"}
    assert Credential.objects.get(id=credential["id"]).sealed == {}  # the secret is destroyed
    assert_error(api.get(url), 404, "not_found_error")
    assert_error(api.get("/v1/vaults/vlt_nope/credentials"), 404, "not_found_error", mentions="vlt_nope")
    actions = list(
        CredentialUse.objects.filter(credential_id=credential["id"])
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["create", "archive", "delete"]
    assert (
        CredentialUse.objects.filter(credential_id=credential["id"]).last().actor.startswith("api key test")
    )


def test_validation_without_the_egress_proxy_is_a_503_that_says_so(api):
    vault_id = new_vault(api)
    credential = add(api, vault_id, BEARER)
    assert_error(
        api.post(f"/v1/vaults/{vault_id}/credentials/{credential['id']}/mcp_oauth_validate"),
        503,
        "api_error",
        mentions="EGRESS_CONTROL_URL",
    )
    variable = add(api, vault_id, VARIABLE)
    assert_error(
        api.post(f"/v1/vaults/{vault_id}/credentials/{variable['id']}/mcp_oauth_validate"),
        400,
        "invalid_request_error",
        mentions="only MCP credentials",
    )


def test_sessions_take_vault_ids_that_exist_and_are_not_archived(api):
    agent, environment = make_agent(), make_environment()
    vault_id, archived = new_vault(api), new_vault(api, "old")
    api.post(f"/v1/vaults/{archived}/archive")
    body = {"agent": agent, "environment_id": environment}
    session = api.post("/v1/sessions", {**body, "vault_ids": [vault_id, vault_id]}).json()
    assert session["vault_ids"] == [vault_id]
    assert_error(
        api.post("/v1/sessions", {**body, "vault_ids": ["vlt_nope"]}),
        404,
        "not_found_error",
        mentions="vault_ids[0]",
    )
    assert_error(
        api.post("/v1/sessions", {**body, "vault_ids": [archived]}),
        400,
        "invalid_request_error",
        mentions="archived",
    )
    assert Session.objects.count() == 1
    assert api.post(f"/v1/sessions/{session['id']}", {"vault_ids": []}).json()["vault_ids"] == []
    assert Vault.objects.count() == 2
