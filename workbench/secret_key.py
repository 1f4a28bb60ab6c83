"""The web server, the workers and beat refuse to start with a public `SECRET_KEY` outside development.

Anyone who knows the key can forge a login session or a CSRF token, so a key everybody can read in this
repository must never sign anything an installation serves. Commands that only change the database
(`migrate`, `createapikey`) and the tools that import the settings (mypy) still run without one.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MAKE_ONE = "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"


class InsecureSecretKey(ImproperlyConfigured):
    pass


def in_development() -> bool:
    """DEBUG, the test suite (pytest sets PYTEST_VERSION for its run and the processes it starts), or the
    explicit opt-in ALLOW_INSECURE_SECRET_KEY=true."""
    return bool(settings.DEBUG or settings.ALLOW_INSECURE_SECRET_KEY or os.environ.get("PYTEST_VERSION"))


def refuse_insecure_secret_key(process: str) -> None:
    """Raise `InsecureSecretKey` (its message says what to do) if `process` would start with a public key."""
    if settings.SECRET_KEY not in settings.INSECURE_SECRET_KEYS or in_development():
        return
    raise InsecureSecretKey(
        f"The {process} will not start: SECRET_KEY is not set (or is a placeholder), and the public default "
        "would let anyone forge a login. Set SECRET_KEY in the environment (or .env) to a long random value, "
        f"the same for the web server, workers and beat; make one with: {MAKE_ONE}\n"
        "For development on this machine, set DEBUG=true or ALLOW_INSECURE_SECRET_KEY=true instead "
        "(`make run` makes a key by itself)."
    )
