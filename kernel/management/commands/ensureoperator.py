from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the operator account if it does not exist, and say how to log in."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="operator")
        parser.add_argument("--password", default="", help="Defaults to a new random password.")
        parser.add_argument("--url", default="http://127.0.0.1:8000/")

    def handle(self, *args: Any, username: str, password: str, url: str, **options: Any) -> None:
        users = get_user_model()
        user = users.objects.filter(username=username).first()
        if user is not None and not password:
            self.stdout.write(
                f"Log in at {url} as {username!r} with the password set before "
                f"(reset it with: manage.py changepassword {username})."
            )
            return
        password = password or secrets.token_urlsafe(12)
        if user is None:
            users.objects.create_superuser(username=username, email="", password=password)
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
        self.stdout.write(f"Log in at {url} as {username!r} with password {password!r}.")
