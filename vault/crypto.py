"""Envelope encryption for the vault's secrets.

Each secret (a credential's token, a repository's token) is sealed with AES-256-GCM under a random data key
of its own, with the record's ids as associated data, so a sealed value copied onto another record does not
open. The data key is in turn sealed to a key-encryption key (KEK): an X25519 key pair. Sealing needs only
the public half (`VAULT_PUBLIC_KEYS` or `VAULT_PUBLIC_KEY_FILE`), which the web server and workers have;
opening needs the private half (`VAULT_KEYS` or `VAULT_KEY_FILE`), which only the egress proxy and the key
rotation command are given. The data key is wrapped by AES-256-GCM under a key derived (HKDF-SHA256) from an
ephemeral X25519 exchange with the KEK: an ECIES construction, so a process that can add credentials
still cannot read one back.

A keyring holds several KEKs by id; `current` is the one new secrets are sealed to. Rotating the KEK
(`manage.py vault_rotate_key`) adds a key, makes it current, and rewraps each data key: the secrets
themselves are not re-encrypted, and every key stays readable throughout.

The keyring files are JSON:
    private: {"current": "kek_…", "keys": {"kek_…": "<base64 of the 32-byte X25519 private key>", …}}
    public:  {"current": "kek_…", "keys": {"kek_…": "<base64 of the 32-byte X25519 public key>", …}}
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from kernel.ids import new_id

FORMAT = b"\x01"
_NONCE = 12
_RAW = serialization.Encoding.Raw
_WRAP_INFO = b"workbench vault data key wrap v1"


class VaultKeyError(Exception):
    """The keyring is missing, malformed, or does not hold the key a secret was sealed to; or a sealed value
    does not open (tampered, or moved to another record). The message never holds key material."""


@dataclass(frozen=True)
class Sealed:
    """A secret as it is stored: its ciphertext, its data key sealed to the KEK `key_id`."""

    ciphertext: bytes
    wrapped_key: bytes
    key_id: str

    def as_json(self) -> dict[str, str]:
        return {"kid": self.key_id, "key": _b64(self.wrapped_key), "ct": _b64(self.ciphertext)}

    @classmethod
    def from_json(cls, value: dict[str, str]) -> Sealed:
        try:
            return cls(base64.b64decode(value["ct"]), base64.b64decode(value["key"]), value["kid"])
        except (KeyError, TypeError, ValueError):
            raise VaultKeyError("A stored secret is not in the vault's sealed form.") from None


@dataclass(frozen=True)
class PublicKeyring:
    current: str
    keys: dict[str, X25519PublicKey]


@dataclass(frozen=True)
class Keyring:
    current: str
    keys: dict[str, X25519PrivateKey]

    def public(self) -> PublicKeyring:
        return PublicKeyring(self.current, {kid: key.public_key() for kid, key in self.keys.items()})


# --- Sealing and opening --------------------------------------------------------------------------------


def seal(secret: str, aad: str, public: PublicKeyring | None = None) -> Sealed:
    """`secret` sealed under a new data key, that key sealed to the current KEK."""
    public = public or public_keyring()
    data_key = AESGCM.generate_key(bit_length=256)
    nonce = os.urandom(_NONCE)
    plaintext = secret.encode()
    ciphertext = FORMAT + nonce + AESGCM(data_key).encrypt(nonce, plaintext, aad.encode())
    return Sealed(
        ciphertext, _wrap(data_key, aad, public.current, public.keys[public.current]), public.current
    )


def unseal(sealed: Sealed, aad: str, keyring: Keyring) -> str:
    """The secret, given the private keyring; VaultKeyError if it does not open."""
    data_key = _unwrap(sealed.wrapped_key, aad, sealed.key_id, keyring)
    blob = bytes(sealed.ciphertext)
    if blob[:1] != FORMAT or len(blob) < 1 + _NONCE + 16:
        raise VaultKeyError("A sealed secret is not in a format this version reads.")
    try:
        plaintext = AESGCM(data_key).decrypt(blob[1 : 1 + _NONCE], blob[1 + _NONCE :], aad.encode())
    except InvalidTag:
        raise VaultKeyError(
            "A sealed secret does not open: it was altered or belongs to another record."
        ) from None
    return plaintext.decode()


def rewrap(sealed: Sealed, aad: str, keyring: Keyring, public: PublicKeyring) -> Sealed:
    """The same ciphertext with its data key sealed to `public`'s current KEK instead."""
    data_key = _unwrap(sealed.wrapped_key, aad, sealed.key_id, keyring)
    return Sealed(
        bytes(sealed.ciphertext),
        _wrap(data_key, aad, public.current, public.keys[public.current]),
        public.current,
    )


def _wrap_key(shared: bytes, ephemeral: bytes, kek: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral + kek, info=_WRAP_INFO).derive(shared)


def _wrap(data_key: bytes, aad: str, key_id: str, kek: X25519PublicKey) -> bytes:
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)
    kek_public = kek.public_bytes(_RAW, serialization.PublicFormat.Raw)
    wrapping = _wrap_key(ephemeral.exchange(kek), ephemeral_public, kek_public)
    nonce = os.urandom(_NONCE)
    return (
        FORMAT
        + ephemeral_public
        + nonce
        + AESGCM(wrapping).encrypt(nonce, data_key, f"{key_id}|{aad}".encode())
    )


def _unwrap(wrapped: bytes, aad: str, key_id: str, keyring: Keyring) -> bytes:
    private = keyring.keys.get(key_id)
    if private is None:
        raise VaultKeyError(
            f"The vault keyring has no key {key_id!r}, which this secret is sealed to; give the egress proxy "
            "the keyring that holds it (VAULT_KEY_FILE)."
        )
    blob = bytes(wrapped)
    if blob[:1] != FORMAT or len(blob) != 1 + 32 + _NONCE + 32 + 16:
        raise VaultKeyError("A sealed data key is not in a format this version reads.")
    ephemeral_public, nonce, body = blob[1:33], blob[33 : 33 + _NONCE], blob[33 + _NONCE :]
    kek_public = private.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)
    wrapping = _wrap_key(
        private.exchange(X25519PublicKey.from_public_bytes(ephemeral_public)), ephemeral_public, kek_public
    )
    try:
        return AESGCM(wrapping).decrypt(nonce, body, f"{key_id}|{aad}".encode())
    except InvalidTag:
        raise VaultKeyError(
            "A sealed data key does not open: it was altered or belongs to another record."
        ) from None


# --- Keyrings: from the environment or a file ------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _parse(text: str, where: str) -> tuple[str, dict[str, bytes]]:
    try:
        document = json.loads(text)
        current, keys = document["current"], document["keys"]
        raw = {str(kid): base64.b64decode(value, validate=True) for kid, value in keys.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise VaultKeyError(
            f'{where} is not a vault keyring: expected JSON {{"current": id, "keys": {{id: base64 key}}}}.'
        ) from None
    if current not in raw or any(len(value) != 32 for value in raw.values()):
        raise VaultKeyError(f"{where} is not a vault keyring: 'current' must name one of its 32-byte keys.")
    return current, raw


def _source(inline: str, file: str, names: str) -> tuple[str, str]:
    if inline:
        return inline, names.split(" or ")[0]
    if file:
        try:
            return Path(file).read_text(), f"{names.split(' or ')[1]} ({file})"
        except OSError as error:
            raise VaultKeyError(f"The vault keyring file {file} cannot be read: {error.strerror}.") from None
    raise VaultKeyError(f"No vault key is configured: set {names}.")


def keyring(file: Path | None = None) -> Keyring:
    """The private keyring (`file`, else VAULT_KEYS or VAULT_KEY_FILE): only the egress proxy and key
    rotation have it."""
    if file is not None:
        text, where = _source("", str(file), "VAULT_KEYS or VAULT_KEY_FILE")
    else:
        text, where = _source(settings.VAULT_KEYS, settings.VAULT_KEY_FILE, "VAULT_KEYS or VAULT_KEY_FILE")
    current, raw = _parse(text, where)
    return Keyring(current, {kid: X25519PrivateKey.from_private_bytes(value) for kid, value in raw.items()})


def public_keyring() -> PublicKeyring:
    """The public keyring (VAULT_PUBLIC_KEYS or VAULT_PUBLIC_KEY_FILE), read afresh each time, so a rotation
    reaches running processes without a restart."""
    text, where = _source(
        settings.VAULT_PUBLIC_KEYS,
        settings.VAULT_PUBLIC_KEY_FILE,
        "VAULT_PUBLIC_KEYS or VAULT_PUBLIC_KEY_FILE",
    )
    current, raw = _parse(text, where)
    return PublicKeyring(
        current, {kid: X25519PublicKey.from_public_bytes(value) for kid, value in raw.items()}
    )


def new_key(ring: Keyring | None = None) -> Keyring:
    """`ring` with a new KEK added and made current (a new keyring of one key without `ring`)."""
    kid = new_id("kek")
    keys = dict(ring.keys) if ring else {}
    keys[kid] = X25519PrivateKey.generate()
    return Keyring(kid, keys)


def dump(ring: Keyring | PublicKeyring) -> str:
    if isinstance(ring, Keyring):
        keys = {
            kid: _b64(k.private_bytes(_RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption()))
            for kid, k in ring.keys.items()
        }
    else:
        keys = {
            kid: _b64(k.public_bytes(_RAW, serialization.PublicFormat.Raw)) for kid, k in ring.keys.items()
        }
    return json.dumps({"current": ring.current, "keys": keys}, indent=2) + "\n"


def write_atomically(path: Path, text: str, mode: int) -> None:
    """Replace `path` with `text` (mode `mode`), so a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, mode)
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
