"""What a service refuses, said for the person who asked.

Services raise these and nothing of the wire: the `/v1` edge maps each to the API's error envelope
(`kernel.api.errors.from_domain`), the operator UI to a message on the page (`workbench.ui.http`).
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A refusal with a message a user can act on; `code` and `details` travel to the API's envelope."""

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = dict(details or {})


class Invalid(DomainError):
    """The input breaks a rule: a field's shape, a value out of range, a reference to the wrong kind."""


class NotFound(DomainError):
    """No such object (or not one the caller may see)."""

    def __init__(self, kind: str, ident: str, message: str | None = None, **kwargs: Any):
        super().__init__(message or f"No {kind} with id {ident!r}.", **kwargs)
        self.kind = kind
        self.ident = ident


class Conflict(DomainError):
    """The object changed under the caller (a stale version) or the name is taken."""


class Closed(Invalid):
    """The object is archived or terminated and takes no more changes."""


class Unavailable(DomainError):
    """A backend the service needs (a sandbox provider, the broker) could not do it just now; retry later."""
