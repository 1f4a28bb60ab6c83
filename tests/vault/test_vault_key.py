"""`manage.py vault_key`: init, rotate while secrets stay readable, retire, status."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from kernel.models import DEFAULT_WORKSPACE_ID
from tests.conftest import make_session
from vault import crypto
from vault.models import Credential, CredentialUse, RepositorySecret, Vault

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("vault_key", *args, stdout=out)
    return out.getvalue()


def test_init_rotate_and_retire(tmp_path, settings):
    private, public = tmp_path / "keyring.json", tmp_path / "public.json"
    files = ["--key-file", str(private), "--public-key-file", str(public)]
    assert "Made vault key" in run("init", *files)
    assert "exists already" in run("init", *files)
    assert private.stat().st_mode & 0o777 == 0o600
    first = crypto.keyring(private)
    settings.VAULT_PUBLIC_KEYS, settings.VAULT_PUBLIC_KEY_FILE = "", str(public)

    vault = Vault.objects.create(display_name="v", workspace_id=DEFAULT_WORKSPACE_ID)
    credential = Credential(vault=vault, kind="static_bearer", auth={"type": "static_bearer"}, mcp_server="x")
    credential.seal({"token": "secret-one"})
    credential.save()
    assert set(credential.sealed["token"]) == {"kid", "key", "ct"}
    assert credential.sealed["token"]["kid"] == first.current

    said = run("rotate", *files)
    assert "Resealed 1 secret field(s)" in said
    ring = crypto.keyring(private)
    assert ring.current != first.current and set(ring.keys) == {first.current, ring.current}
    credential.refresh_from_db()
    assert credential.sealed["token"]["kid"] == ring.current
    assert credential.unseal(ring) == {"token": "secret-one"}
    # A secret sealed after the rotation (the public file is read afresh) goes to the new key.
    assert crypto.seal("x", "y").key_id == ring.current
    assert CredentialUse.objects.filter(action="rewrap", credential_id=credential.id).count() == 1
    assert f"{ring.current} (current): 1 field(s)" in run("status", *files)

    run("rotate", "--retire", *files)
    final = crypto.keyring(private)
    assert list(final.keys) == [final.current]
    credential.refresh_from_db()
    assert credential.unseal(final) == {"token": "secret-one"}


def test_rotate_reseals_repository_tokens_too(tmp_path, settings, vault_keyring):
    private, public = tmp_path / "keyring.json", tmp_path / "public.json"
    files = ["--key-file", str(private), "--public-key-file", str(public)]
    run("init", *files)
    settings.VAULT_PUBLIC_KEYS, settings.VAULT_PUBLIC_KEY_FILE = "", str(public)
    secret = RepositorySecret(session_id=make_session(), resource_id="res_1", url="https://git.example/r.git")
    secret.seal({"token": "ghp-token"})
    secret.save()
    run("rotate", *files)
    secret.refresh_from_db()
    assert secret.unseal(crypto.keyring(private)) == {"token": "ghp-token"}


def test_without_a_keyring_the_command_says_what_to_give(tmp_path, settings):
    settings.VAULT_KEY_FILE = ""
    with pytest.raises(CommandError, match="--key-file or VAULT_KEY_FILE"):
        run("status")
    with pytest.raises(CommandError, match="cannot be read"):
        run("rotate", "--key-file", str(tmp_path / "missing.json"))
