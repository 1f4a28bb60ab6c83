"""`manage.py environment_key create ENV_ID [--name N] | revoke KEY_ID | list [ENV_ID]`: the keys a
self-hosted environment's workers poll its work queue with (sandboxes/work_keys.py).

create  a new key for the self_hosted environment ENV_ID; the key is printed once, as the last line
revoke  revoke the key KEY_ID (its id, `envkey_…`, as `list` shows it): its next request is refused
list    the keys (never the keys themselves) of ENV_ID, or of every environment
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from kernel.errors import DomainError
from sandboxes.models import EnvironmentKey
from sandboxes.work_keys import environment_key_create, environment_key_revoke


class Command(BaseCommand):
    help = __doc__.split("\n\n")[0] if __doc__ else ""

    def add_arguments(self, parser: Any) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="a new key for a self_hosted environment")
        create.add_argument("environment_id")
        create.add_argument("--name", default="", help="what the key is for, e.g. 'lab worker 3'")
        revoke = actions.add_parser("revoke", help="revoke a key by its id")
        revoke.add_argument("key_id")
        listing = actions.add_parser("list", help="the keys of an environment, or of all")
        listing.add_argument("environment_id", nargs="?")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            if action == "create":
                self._create(options["environment_id"], options["name"].strip())
            elif action == "revoke":
                self._revoke(options["key_id"])
            else:
                self._list(options.get("environment_id"))
        except DomainError as error:
            raise CommandError(error.message) from None

    def _create(self, environment_id: str, name: str) -> None:
        key, raw = environment_key_create(environment_id, name=name)
        self.stdout.write(
            f"Created environment key {key.id}{f' ({name!r})' if name else ''} for {environment_id}. "
            "It is shown only now, on the next line; give it to the environment's workers."
        )
        self.stdout.write(raw)

    def _revoke(self, key_id: str) -> None:
        found = EnvironmentKey.objects.filter(id=key_id).first()
        if found is None:
            raise CommandError(f"No environment key with id {key_id!r}; `environment_key list` shows them.")
        key = environment_key_revoke(found.environment_id, key_id)
        self.stdout.write(
            f"Environment key {key.id} of {key.environment_id} is revoked (at {key.revoked_at})."
        )

    def _list(self, environment_id: str | None) -> None:
        keys = EnvironmentKey.objects.order_by("environment_id", "created_at", "id")
        if environment_id:
            keys = keys.filter(environment_id=environment_id)
        for key in keys:
            state = f"revoked {key.revoked_at.isoformat()}" if key.revoked_at else "active"
            used = key.last_used_at.isoformat() if key.last_used_at else "never"
            self.stdout.write(
                f"{key.id}  {key.environment_id}  {key.prefix}…  {key.name or '-'}  {state}  last used {used}"
            )
        if not keys:
            self.stdout.write("No environment keys.")
