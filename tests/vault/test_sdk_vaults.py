"""The official SDK's `client.beta.vaults` and `vaults.credentials` against the real server (Daphne)."""

from __future__ import annotations

import anthropic
import pytest

from vault.models import Credential

pytestmark = pytest.mark.server

CANARY = "canary-sdk-5e2b-never-returned"


@pytest.fixture
def sdk(live_server_url, api_key):
    return anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=30)


def test_the_sdk_manages_vaults_and_each_kind_of_credential(sdk, vault_keyring):
    vault = sdk.beta.vaults.create(display_name="sdk vault", metadata={"team": "ops"})
    assert vault.id.startswith("vlt_") and vault.type == "vault" and vault.archived_at is None
    assert sdk.beta.vaults.retrieve(vault.id).display_name == "sdk vault"
    assert sdk.beta.vaults.update(vault.id, display_name="renamed", metadata={"team": None}).metadata == {}
    assert [v.id for v in sdk.beta.vaults.list()] == [vault.id]

    bearer = sdk.beta.vaults.credentials.create(
        vault.id,
        auth={"type": "static_bearer", "mcp_server_url": "https://mcp.example.com/mcp", "token": CANARY},
        display_name="search",
    )
    assert bearer.id.startswith("vcrd_") and bearer.vault_id == vault.id
    assert bearer.auth.type == "static_bearer" and bearer.auth.mcp_server_url == "https://mcp.example.com/mcp"
    oauth = sdk.beta.vaults.credentials.create(
        vault.id,
        auth={
            "type": "mcp_oauth",
            "mcp_server_url": "https://oauth.example.com/mcp",
            "access_token": CANARY,
            "expires_at": "2099-06-01T00:00:00Z",
            "refresh": {
                "client_id": "c1",
                "refresh_token": CANARY,
                "token_endpoint": "https://auth.example.com/token",
                "token_endpoint_auth": {"type": "client_secret_basic", "client_secret": CANARY},
            },
        },
    )
    assert oauth.auth.refresh.token_endpoint_auth.type == "client_secret_basic"
    assert oauth.auth.expires_at.year == 2099
    variable = sdk.beta.vaults.credentials.create(
        vault.id,
        auth={
            "type": "environment_variable",
            "secret_name": "SERVICE_TOKEN",
            "secret_value": CANARY,
            "networking": {"type": "limited", "allowed_hosts": ["api.example.com"]},
            "injection_location": {"header": True, "body": True},
        },
    )
    assert variable.auth.networking.allowed_hosts == ["api.example.com"]
    assert variable.auth.injection_location.body is True

    listed = sdk.beta.vaults.credentials.list(vault.id)
    assert [c.id for c in listed] == [variable.id, oauth.id, bearer.id]
    assert CANARY not in str([c.model_dump() for c in listed])

    rotated = sdk.beta.vaults.credentials.update(
        bearer.id, vault_id=vault.id, auth={"type": "static_bearer", "token": "rotated"}
    )
    assert rotated.auth.mcp_server_url == "https://mcp.example.com/mcp"
    assert Credential.objects.get(id=bearer.id).unseal(vault_keyring) == {"token": "rotated"}

    with pytest.raises(anthropic.BadRequestError, match="cannot change"):
        sdk.beta.vaults.credentials.update(
            bearer.id, vault_id=vault.id, auth={"type": "mcp_oauth", "access_token": "x"}
        )
    with pytest.raises(anthropic.APIStatusError, match="EGRESS_CONTROL_URL") as raised:
        sdk.beta.vaults.credentials.mcp_oauth_validate(bearer.id, vault_id=vault.id)
    assert raised.value.status_code == 503

    assert sdk.beta.vaults.credentials.archive(oauth.id, vault_id=vault.id).archived_at is not None
    deleted = sdk.beta.vaults.credentials.delete(variable.id, vault_id=vault.id)
    assert (deleted.id, deleted.type) == (variable.id, "vault_credential_deleted")
    assert [c.id for c in sdk.beta.vaults.credentials.list(vault.id)] == [bearer.id]
    assert [c.id for c in sdk.beta.vaults.credentials.list(vault.id, include_archived=True)] == [
        oauth.id,
        bearer.id,
    ]

    assert sdk.beta.vaults.archive(vault.id).archived_at is not None
    assert sdk.beta.vaults.delete(vault.id).type == "vault_deleted"
    with pytest.raises(anthropic.NotFoundError):
        sdk.beta.vaults.retrieve(vault.id)


def test_sessions_created_through_the_sdk_take_vault_ids(sdk):
    vault = sdk.beta.vaults.create(display_name="for sessions")
    agent = sdk.beta.agents.create(name="a", model="claude-sonnet-5-5")
    environment = sdk.beta.environments.create(name="vault env", config={"type": "cloud"})
    session = sdk.beta.sessions.create(agent=agent.id, environment_id=environment.id, vault_ids=[vault.id])
    assert session.vault_ids == [vault.id]
    with pytest.raises(anthropic.NotFoundError, match="vlt_missing"):
        sdk.beta.sessions.create(agent=agent.id, environment_id=environment.id, vault_ids=["vlt_missing"])
