"""`python -m workbench.startup`: what `make run` does once the database and Redis are started and before the rest
(the supervisor's `--then`): waits for the database, migrates it, makes the vault's key and the operator's login,
and reaps the sandboxes an earlier run left, then says how to log in and what was reaped.

One process for all of it: Django takes seconds to start on a small machine, and each `manage.py` starts it anew.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from collections.abc import Sequence
from typing import Any

import django
from django.conf import settings
from django.core.management import call_command
from django.db import OperationalError, connection

from sandboxes.leftovers import said_at_start


def wait_for_the_database(seconds: float) -> None:
    """A PostgreSQL the supervisor has just started takes a moment to accept connections."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            connection.ensure_connection()
            return
        except OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def said(command: str, *args: Any, **options: Any) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, **options)
    return out.getvalue().strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.startup", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="where the web server will answer, for the login line")
    parser.add_argument("--vault-key-file", required=True, help="the vault's private keyring (made once)")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the database")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")
    django.setup()
    from sandboxes.reaper import reap_leftovers  # its models load once the apps are set up

    wait_for_the_database(args.wait)
    said("migrate", interactive=False, verbosity=0)
    said("vault_key", "init", "--key-file", args.vault_key_file)
    login = said("ensureoperator", url=args.url)
    try:
        leftovers = said_at_start(settings.WORKBENCH_DEPLOYMENT, *reap_leftovers())
    except Exception as error:  # noqa: BLE001 - the rest can start: beat's reaper tries again
        leftovers = f"Sandboxes an earlier run left: not reaped ({type(error).__name__}: {error})."
    print(f"\n  {login}\n  {leftovers}\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
