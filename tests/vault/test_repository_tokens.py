"""Repository tokens in the vault: sealed at the API's door into a RepositorySecret (one per session and
resource), audited without the token, destroyed with their session; and the migration that moves tokens
stored in the clear in Session.resources into the vault, or stops, changing nothing, without a key."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings
from django.utils import timezone

from sessions.models import Session
from tests.conftest import make_agent, make_environment, make_session
from vault.models import CredentialUse, RepositorySecret

TOKEN = "ghs_canary_vaulted_91c0d2"
URL = "https://github.com/octo/repo.git"
NO_KEY = {"VAULT_PUBLIC_KEYS": "", "VAULT_PUBLIC_KEY_FILE": "/nonexistent/workbench/public.json"}


def create(api: Any, **repository: Any) -> Any:
    return api.post(
        "/v1/sessions",
        {
            "agent": make_agent(),
            "environment_id": make_environment(),
            "resources": [{"type": "github_repository", "url": URL, **repository}],
        },
    )


@pytest.mark.django_db
def test_a_token_given_at_create_is_sealed_once_per_resource_and_audited_without_it(api, vault_keyring):
    response = create(api, authorization_token=TOKEN)
    assert response.status_code == 200, response.content
    session = response.json()
    [secret] = RepositorySecret.objects.all()
    assert (secret.session_id, secret.resource_id) == (session["id"], session["resources"][0]["id"])
    assert secret.secret_version == 1 and secret.unseal(vault_keyring) == {"token": TOKEN}
    [use] = CredentialUse.objects.filter(session_id=session["id"])
    assert use.action == "create" and use.host == "github.com" and session["resources"][0]["id"] in use.detail
    assert use.actor.startswith("api key ")
    assert TOKEN not in str(CredentialUse.objects.values())


@pytest.mark.django_db
def test_a_public_repository_has_no_secret(api):
    for given in ({}, {"authorization_token": None}, {"authorization_token": ""}):
        assert create(api, **given).status_code == 200
    assert not RepositorySecret.objects.exists()


@pytest.mark.django_db
def test_without_a_public_vault_key_a_token_is_a_503_naming_vault_key_init_and_nothing_is_stored(api):
    with override_settings(**NO_KEY):
        refused = create(api, authorization_token=TOKEN)
        assert refused.status_code == 503, refused.content
        assert "vault_key init" in refused.json()["error"]["message"]
        assert TOKEN not in refused.content.decode()
        assert not Session.objects.exists() and not RepositorySecret.objects.exists()
        # A public repository needs no key.
        assert create(api).status_code == 200


@pytest.mark.django_db
def test_deleting_a_session_destroys_its_repository_tokens(api):
    kept = create(api, authorization_token=TOKEN).json()["id"]
    gone = create(api, authorization_token=TOKEN).json()["id"]
    assert api.delete(f"/v1/sessions/{gone}").json() == {"id": gone, "type": "session_deleted"}
    assert list(RepositorySecret.objects.values_list("session_id", flat=True)) == [kept]
    assert CredentialUse.objects.filter(session_id=gone, action="delete").count() == 1


# --- The migration ------------------------------------------------------------------------------------------

BEFORE = [("vault", "0001_initial")]
AFTER = [("vault", "0002_repository_tokens_to_the_vault")]


def _back_to_latest() -> None:
    latest = MigrationExecutor(connection)
    latest.migrate(latest.loader.graph.leaf_nodes())


def _old_rows() -> dict[str, str]:
    """Sessions as the API stored them before tokens moved: a token in the resource's JSON."""
    live = make_session()
    Session.objects.filter(id=live).update(
        resources=[
            {"type": "github_repository", "id": "sres_a", "url": URL, "authorization_token": TOKEN},
            {
                "type": "file",
                "id": "sres_f",
                "file_id": "file_1",
                "mount_path": "/mnt/session/uploads/file_1",
            },
            {"type": "github_repository", "id": "sres_b", "url": URL, "authorization_token": None},
            {
                "type": "github_repository",
                "url": "https://git.example.com/x.git",
                "authorization_token": TOKEN + "2",
            },
        ]
    )
    deleted = make_session()
    Session.objects.filter(id=deleted).update(
        resources=[{"type": "github_repository", "id": "sres_d", "url": URL, "authorization_token": TOKEN}],
        deleted_at=timezone.now(),
    )
    return {"live": live, "deleted": deleted}


@pytest.mark.django_db(transaction=True)
def test_the_migration_seals_stored_tokens_into_the_vault_and_leaves_the_json_clean(vault_keyring):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        rows = _old_rows()
        MigrationExecutor(connection).migrate(AFTER)
    finally:
        _back_to_latest()
    live = Session.objects.get(id=rows["live"]).resources
    assert TOKEN not in str(live) and all("authorization_token" not in r for r in live)
    assert [r.get("id") for r in live][:3] == ["sres_a", "sres_f", "sres_b"]
    assert live[3]["id"].startswith("sres_"), (
        "a resource without an id gets one, which its secret is keyed by"
    )
    secrets = {s.resource_id: s for s in RepositorySecret.objects.filter(session_id=rows["live"])}
    assert set(secrets) == {"sres_a", live[3]["id"]}
    assert secrets["sres_a"].url == URL and secrets["sres_a"].unseal(vault_keyring) == {"token": TOKEN}
    assert secrets[live[3]["id"]].unseal(vault_keyring) == {"token": TOKEN + "2"}
    # A deleted session's token is destroyed, as deleting a session now does.
    assert TOKEN not in str(Session.objects.get(id=rows["deleted"]).resources)
    assert not RepositorySecret.objects.filter(session_id=rows["deleted"]).exists()


@pytest.mark.django_db(transaction=True)
def test_the_migration_without_a_public_vault_key_stops_and_changes_nothing():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        rows = _old_rows()
        with override_settings(**NO_KEY), pytest.raises(RuntimeError) as stopped:
            MigrationExecutor(connection).migrate(AFTER)
        message = str(stopped.value)
        assert "VAULT_PUBLIC_KEY_FILE" in message and "manage.py vault_key init" in message
        assert "No token was moved or removed" in message and TOKEN not in message
        assert Session.objects.get(id=rows["live"]).resources[0]["authorization_token"] == TOKEN
        assert not RepositorySecret.objects.exists()
        assert ("vault", "0002_repository_tokens_to_the_vault") not in MigrationExecutor(
            connection
        ).loader.applied_migrations
    finally:
        _back_to_latest()
    assert TOKEN not in str(Session.objects.get(id=rows["live"]).resources), "migrated once a key is there"
