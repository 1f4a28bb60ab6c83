"""`manage.py vault_key init | rotate | status`: the vault's key-encryption keys (vault/crypto.py).

init    make the private keyring (VAULT_KEY_FILE, mode 0600) and its public half (VAULT_PUBLIC_KEY_FILE)
rotate  add a new key and make it current, then reseal every secret's data key to it, row by row,
        while everything keeps running: sealing processes read the public file afresh, and the proxy
        re-reads the private keyring when it meets a key it does not hold. --retire drops the old keys
        from the keyring once nothing is sealed to them.
status  which keys exist, which is current, and how many secrets are sealed to each
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from vault import crypto
from vault.models import Credential, CredentialUse, RepositorySecret, SealedSecret

ACTOR = "manage.py vault_key rotate"


class Command(BaseCommand):
    help = __doc__.split("\n\n")[0] if __doc__ else ""

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["init", "rotate", "status"])
        parser.add_argument("--key-file", default=settings.VAULT_KEY_FILE, help="the private keyring")
        parser.add_argument(
            "--public-key-file", default=settings.VAULT_PUBLIC_KEY_FILE, help="its public half"
        )
        parser.add_argument("--retire", action="store_true", help="rotate: then drop the old keys")

    def handle(
        self, *args: Any, action: str, key_file: str, public_key_file: str, retire: bool, **_: Any
    ) -> None:
        if not key_file:
            raise CommandError("Give the private keyring's path: --key-file or VAULT_KEY_FILE.")
        private, public = Path(key_file), Path(public_key_file)
        if action == "init":
            self._init(private, public)
        elif action == "rotate":
            self._rotate(private, public, retire)
        else:
            self._status(private)

    def _init(self, private: Path, public: Path) -> None:
        if private.exists():
            self.stdout.write(f"The vault keyring {private} exists already; nothing changed.")
            return
        ring = crypto.new_key()
        crypto.write_atomically(private, crypto.dump(ring), 0o600)
        crypto.write_atomically(public, crypto.dump(ring.public()), 0o644)
        self.stdout.write(
            f"Made vault key {ring.current}: private keyring {private}, public keyring {public}."
        )

    def _load(self, private: Path) -> crypto.Keyring:
        try:
            return crypto.keyring(private)
        except crypto.VaultKeyError as error:
            raise CommandError(str(error)) from None

    def _rotate(self, private: Path, public: Path, retire: bool) -> None:
        old = self._load(private)
        ring = crypto.new_key(old)
        crypto.write_atomically(private, crypto.dump(ring), 0o600)
        crypto.write_atomically(public, crypto.dump(ring.public()), 0o644)
        self.stdout.write(f"New current key {ring.current}; resealing data keys to it.")
        moved = 0
        for model in (Credential, RepositorySecret):
            for pk in model.objects.values_list("pk", flat=True).iterator():
                moved += self._rewrap(model, pk, ring)
        self.stdout.write(f"Resealed {moved} secret field(s) to {ring.current}.")
        if retire:
            left = sum(self._counts().get(kid, 0) for kid in old.keys)
            if left:
                raise CommandError(
                    f"{left} secret field(s) are still sealed to old keys; the keyring keeps them."
                )
            kept = crypto.Keyring(ring.current, {ring.current: ring.keys[ring.current]})
            crypto.write_atomically(private, crypto.dump(kept), 0o600)
            crypto.write_atomically(public, crypto.dump(kept.public()), 0o644)
            self.stdout.write(f"Retired {', '.join(sorted(old.keys))}.")

    def _rewrap(self, model: type[SealedSecret], pk: Any, ring: crypto.Keyring) -> int:
        public = ring.public()
        with transaction.atomic():
            record = model.objects.select_for_update().get(pk=pk)  # type: ignore[attr-defined]
            stale = {f: v for f, v in record.sealed.items() if v["kid"] != ring.current}
            if not stale:
                return 0
            record.sealed = {
                **record.sealed,
                **{
                    f: crypto.rewrap(crypto.Sealed.from_json(v), record.aad(f), ring, public).as_json()
                    for f, v in stale.items()
                },
            }
            record.save(update_fields=["sealed"])
            if isinstance(record, Credential):
                CredentialUse.objects.create(
                    action=CredentialUse.Action.REWRAP,
                    actor=ACTOR,
                    credential_id=record.id,
                    vault_id=record.vault_id,
                    detail=f"data keys resealed to {ring.current}",
                )
        return len(stale)

    def _counts(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for model in (Credential, RepositorySecret):
            for sealed in model.objects.values_list("sealed", flat=True):
                counts.update(v["kid"] for v in sealed.values())
        return counts

    def _status(self, private: Path) -> None:
        ring = self._load(private)
        counts = self._counts()
        for kid in ring.keys:
            self.stdout.write(
                f"{kid}{' (current)' if kid == ring.current else ''}: {counts.pop(kid, 0)} field(s)"
            )
        for kid, count in counts.items():
            self.stdout.write(f"{kid}: {count} field(s) sealed to a key this keyring does NOT hold")
