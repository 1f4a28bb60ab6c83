"""vault/crypto.py: envelope encryption, sealing with the public half only, and keyrings."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from vault import crypto

CANARY = "canary-0f3e9b1c-do-not-leak"


def test_a_sealed_secret_opens_with_the_private_keyring_and_holds_no_plaintext(vault_keyring):
    sealed = crypto.seal(CANARY, "credential|vlt_a|vcrd_a|static_bearer|token")
    assert CANARY.encode() not in sealed.ciphertext + sealed.wrapped_key
    assert sealed.key_id == vault_keyring.current
    assert crypto.unseal(sealed, "credential|vlt_a|vcrd_a|static_bearer|token", vault_keyring) == CANARY
    # The JSON form the rows store round-trips.
    assert crypto.Sealed.from_json(json.loads(json.dumps(sealed.as_json()))) == sealed


def test_two_seals_of_one_value_differ(vault_keyring):
    one, two = crypto.seal(CANARY, "x"), crypto.seal(CANARY, "x")
    assert one.ciphertext != two.ciphertext and one.wrapped_key != two.wrapped_key


def test_a_secret_moved_to_another_record_or_altered_does_not_open(vault_keyring):
    sealed = crypto.seal(CANARY, "credential|vlt_a|vcrd_a|static_bearer|token")
    with pytest.raises(crypto.VaultKeyError, match="belongs to another record"):
        crypto.unseal(sealed, "credential|vlt_b|vcrd_a|static_bearer|token", vault_keyring)
    flipped = bytearray(sealed.ciphertext)
    flipped[-1] ^= 1
    with pytest.raises(crypto.VaultKeyError, match="altered"):
        crypto.unseal(
            crypto.Sealed(bytes(flipped), sealed.wrapped_key, sealed.key_id),
            "credential|vlt_a|vcrd_a|static_bearer|token",
            vault_keyring,
        )


def test_a_process_with_the_public_key_alone_seals_but_cannot_open():
    assert crypto.seal(CANARY, "x")  # the suite's processes hold only VAULT_PUBLIC_KEYS
    with pytest.raises(
        crypto.VaultKeyError, match="No vault key is configured: set VAULT_KEYS or VAULT_KEY_FILE"
    ):
        crypto.keyring()


def test_without_a_public_key_sealing_says_what_to_set():
    missing = override_settings(VAULT_PUBLIC_KEYS="", VAULT_PUBLIC_KEY_FILE="/nonexistent/public.json")
    with missing, pytest.raises(crypto.VaultKeyError, match="cannot be read"):
        crypto.seal(CANARY, "x")
    garbled = override_settings(VAULT_PUBLIC_KEYS="{not json", VAULT_PUBLIC_KEY_FILE="")
    with garbled, pytest.raises(crypto.VaultKeyError, match="VAULT_PUBLIC_KEYS is not a vault keyring"):
        crypto.seal(CANARY, "x")


def test_rewrap_moves_the_data_key_to_a_new_key_and_keeps_the_ciphertext(vault_keyring):
    sealed = crypto.seal(CANARY, "aad")
    rotated = crypto.new_key(vault_keyring)
    moved = crypto.rewrap(sealed, "aad", rotated, rotated.public())
    assert moved.key_id == rotated.current != sealed.key_id and moved.ciphertext == sealed.ciphertext
    only_new = crypto.Keyring(rotated.current, {rotated.current: rotated.keys[rotated.current]})
    assert crypto.unseal(moved, "aad", only_new) == CANARY
    with pytest.raises(crypto.VaultKeyError, match="has no key"):
        crypto.unseal(sealed, "aad", only_new)


def test_keyring_files_are_written_whole_and_private(tmp_path):
    ring = crypto.new_key()
    private = tmp_path / "keys" / "keyring.json"
    crypto.write_atomically(private, crypto.dump(ring), 0o600)
    assert private.stat().st_mode & 0o777 == 0o600
    loaded = crypto.keyring(private)
    assert loaded.current == ring.current
    assert crypto.unseal(crypto.seal(CANARY, "a", ring.public()), "a", loaded) == CANARY
    assert [p.name for p in private.parent.iterdir()] == ["keyring.json"]
