"""`endpoint(GET=..., POST=...)` turns handlers into one Django view per path.

The view authenticates the API key, dispatches on the method, parses a JSON object body (an empty body
is `{}`, as the SDK sends for archive and similar), renders the handler's return value as JSON and any
`ApiError` in the error envelope, as it does any other exception (a 500, logged). A POST with an
`Idempotency-Key` runs once per key (`kernel/api/idempotency.py`). Handlers receive `(request, **path_kwargs)` and read `request.json`.

A body nested too deeply, and a path or query parameter, key or string that is not text (a NUL, an
unpaired surrogate), are a 400 that says where, before any handler or the database sees them.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from kernel.api.errors import (
    ApiError,
    AuthenticationFailed,
    InvalidRequest,
    MethodNotAllowed,
    PayloadTooLarge,
    from_domain,
)
from kernel.api.idempotency import idempotent
from kernel.api.validation import MAX_BODY_DEPTH, check_body, check_text
from kernel.auth import api_key_from_headers
from kernel.errors import DomainError

logger = logging.getLogger(__name__)

Handler = Callable[..., Any]


def error_response(error: ApiError, request_id: str) -> JsonResponse:
    response = JsonResponse(error.envelope(), status=error.status)
    response["request-id"] = request_id
    if error.status >= 400 and error.status < 500 and error.status not in (408, 409, 429):
        response["x-should-retry"] = "false"
    return response


def _parse_body(request: HttpRequest) -> dict[str, Any]:
    length = int(request.headers.get("Content-Length") or 0)
    if length > settings.API_MAX_BODY_BYTES:
        raise PayloadTooLarge(
            f"The request body is {length} bytes; the limit is {settings.API_MAX_BODY_BYTES} bytes (1 MiB)."
        )
    raw = request.body
    if len(raw) > settings.API_MAX_BODY_BYTES:
        raise PayloadTooLarge(
            f"The request body is over the limit of {settings.API_MAX_BODY_BYTES} bytes (1 MiB)."
        )
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.") from None
    except RecursionError:  # the parser's own limit, near 1000 levels
        raise InvalidRequest(
            f"The request body nests too deeply to read; at most {MAX_BODY_DEPTH} levels are allowed."
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {type(body).__name__}.")
    check_body(body)
    return body


def _check_params(request: HttpRequest, path_kwargs: dict[str, Any]) -> None:
    """Path and query parameters hold text: a NUL or an unpaired surrogate is a 400, not a database error."""
    for name, value in path_kwargs.items():
        if isinstance(value, str):
            check_text(value, f"The path parameter '{name}'")
    for name, values in request.GET.lists():
        check_text(name, f"The query parameter name {json.dumps(name)}")
        for value in values:
            check_text(value, f"Query parameter '{name}'")


def _authenticate(request: HttpRequest) -> None:
    key = api_key_from_headers(request.headers)
    if key is None:
        raise AuthenticationFailed(
            "No valid API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'; "
            "create one with `manage.py createapikey --name NAME` or on the API keys page."
        )
    request.api_key = key  # type: ignore[attr-defined]


def _bad_host(error: DisallowedHost) -> InvalidRequest:
    return InvalidRequest(str(error))  # Django says which host, and to add it to ALLOWED_HOSTS


def _suspicious(error: SuspiciousOperation) -> ApiError:
    """Django's refusals of a request's shape (a body over its read limit, too many fields)."""
    if isinstance(error, RequestDataTooBig):
        return PayloadTooLarge(
            f"The request body is over the limit of {settings.API_MAX_BODY_BYTES} bytes (1 MiB)."
        )
    return InvalidRequest(f"The request was refused: {error}.")


def _allowed(handlers: dict[str, Handler], request: HttpRequest) -> Handler:
    handler = handlers.get(request.method or "")
    if handler is None:
        raise MethodNotAllowed(
            f"{request.method} is not allowed on {request.path}; use {', '.join(sorted(handlers))}."
        )
    return handler


def internal_error(request_id: str, *, log: bool = True) -> JsonResponse:
    """The envelope of a 5xx nobody planned for; the exception being handled is logged with the request id."""
    if log:
        logger.exception("unhandled error in %s", request_id)
    return error_response(
        ApiError(
            f"An internal error occurred; it is logged with request id {request_id}. "
            "Retry later, or report it with that id."
        ),
        request_id,
    )


def _render(result: Any) -> HttpResponse:
    return result if isinstance(result, HttpResponse) else JsonResponse(result, safe=False)


def endpoint(**handlers: Handler) -> Callable[..., HttpResponse]:
    @csrf_exempt
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        request_id = f"req_{uuid.uuid4().hex}"
        try:
            request.get_host()  # ALLOWED_HOSTS: /v1 runs without CommonMiddleware (workbench/asgi.py)
            handler = _allowed(handlers, request)
            _authenticate(request)
            _check_params(request, kwargs)
            request.json = _parse_body(request) if request.method == "POST" else {}  # type: ignore[attr-defined]
            response = idempotent(request, lambda: _render(handler(request, **kwargs)))
        except ApiError as error:
            return error_response(error, request_id)
        except DomainError as error:
            return error_response(from_domain(error), request_id)
        except DisallowedHost as error:
            return error_response(_bad_host(error), request_id)
        except SuspiciousOperation as error:
            return error_response(_suspicious(error), request_id)
        except Exception:
            return internal_error(request_id)
        response["request-id"] = request_id
        return response

    return view


def async_endpoint(
    **handlers: Callable[..., Awaitable[HttpResponse]],
) -> Callable[..., Awaitable[HttpResponse]]:
    """The same contract for async handlers (the SSE stream)."""

    @csrf_exempt
    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        request_id = f"req_{uuid.uuid4().hex}"
        try:
            request.get_host()
            handler = _allowed(handlers, request)
            await sync_to_async(_authenticate)(request)
            _check_params(request, kwargs)
            response = await handler(request, **kwargs)
        except ApiError as error:
            return error_response(error, request_id)
        except DomainError as error:
            return error_response(from_domain(error), request_id)
        except DisallowedHost as error:
            return error_response(_bad_host(error), request_id)
        except SuspiciousOperation as error:
            return error_response(_suspicious(error), request_id)
        except Exception:
            return internal_error(request_id)
        response["request-id"] = request_id
        return response

    return view
