from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from kernel.errors import DomainError
from kernel.keys import api_key_create
from kernel.models import DEFAULT_WORKSPACE_SLUG
from kernel.tenancy import workspace_by_slug


class Command(BaseCommand):
    help = (
        "Create an API key for the /v1 API, in a workspace (made if missing; the default one without "
        "--workspace), full or --read-only. The key is printed once, as the last line."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", required=True, help="What the key is for, e.g. 'ci' or 'alice laptop'.")
        parser.add_argument(
            "--workspace", default=DEFAULT_WORKSPACE_SLUG, help="The workspace's slug (created when missing)."
        )
        parser.add_argument("--read-only", action="store_true", help="A key that may read but not write.")

    def handle(self, *args: Any, name: str, workspace: str, read_only: bool, **options: Any) -> None:
        try:
            with transaction.atomic():
                space = workspace_by_slug(workspace, create=True)
                _, raw = api_key_create(
                    name=name, workspace_id=space.id, read_only=read_only, actor="manage.py createapikey"
                )
        except DomainError as error:
            raise CommandError(error.message) from None
        kind = "read-only API key" if read_only else "API key"
        self.stdout.write(
            f"Created {kind} {name.strip()!r} in workspace {space.slug!r} ({space.id}). It is shown only now, "
            "on the next line; store it safely."
        )
        self.stdout.write(raw)
