"""API errors, rendered in the envelope the official SDK parses (reference §1.5)."""

from __future__ import annotations

from typing import Any

from kernel import errors


class ApiError(Exception):
    status = 500
    error_type = "api_error"

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})
        if code:
            self.details["error_code"] = code

    def envelope(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.error_type, "message": self.message}
        if self.details:
            error["details"] = self.details
        return {"type": "error", "error": error}


class InvalidRequest(ApiError):
    status = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(ApiError):
    status = 401
    error_type = "authentication_error"


class PermissionDenied(ApiError):
    status = 403
    error_type = "permission_error"


class NotFound(ApiError):
    status = 404
    error_type = "not_found_error"


class MethodNotAllowed(ApiError):
    status = 405
    error_type = "invalid_request_error"


class Conflict(ApiError):
    """A 409; the service reports it as `invalid_request_error` (reference §13), which the SDK maps by status."""

    status = 409
    error_type = "invalid_request_error"


class PayloadTooLarge(ApiError):
    status = 413
    error_type = "request_too_large"


class ServiceUnavailable(ApiError):
    status = 503
    error_type = "api_error"


_BY_DOMAIN: tuple[tuple[type[errors.DomainError], type[ApiError]], ...] = (
    (errors.NotFound, NotFound),
    (errors.Conflict, Conflict),
    (errors.Invalid, InvalidRequest),  # a Closed object too: the service answers 400 (reference §6)
    (errors.Unavailable, ServiceUnavailable),
)


def from_domain(error: errors.DomainError) -> ApiError:
    """The one mapping of a service's refusal to the `/v1` envelope."""
    kind = next((api for domain, api in _BY_DOMAIN if isinstance(error, domain)), ApiError)
    return kind(error.message, code=error.code, details=error.details)
