from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from kernel.models import ApiKey, hash_key


class Command(BaseCommand):
    help = "Create an API key for the /v1 API. The key is printed once, as the last line."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", required=True, help="What the key is for, e.g. 'ci' or 'alice laptop'.")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        if not name.strip():
            raise CommandError("--name must not be empty.")
        raw = ApiKey.generate()
        ApiKey.objects.create(name=name.strip(), prefix=raw[:12], key_hash=hash_key(raw))
        self.stdout.write(
            f"Created API key {name!r}. It is shown only now, on the next line; store it safely."
        )
        self.stdout.write(raw)
