"""`endpoint(GET=..., POST=...)` turns handlers into one Django view per path.

The view authenticates the API key, dispatches on the method, parses a JSON object body (an empty body
is `{}`, as the SDK sends for archive and similar), renders the handler's return value as JSON and any
`ApiError` in the error envelope. Handlers receive `(request, **path_kwargs)` and read `request.json`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from workbench.api.errors import (
    ApiError,
    AuthenticationFailed,
    InvalidRequest,
    MethodNotAllowed,
    PayloadTooLarge,
)
from workbench.auth import api_key_from_headers

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
        raise PayloadTooLarge(f"The request body is over the limit of {settings.API_MAX_BODY_BYTES} bytes (1 MiB).")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {type(body).__name__}.")
    return body


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


def _allowed(handlers: dict[str, Handler], request: HttpRequest) -> Handler:
    handler = handlers.get(request.method or "")
    if handler is None:
        raise MethodNotAllowed(
            f"{request.method} is not allowed on {request.path}; use {', '.join(sorted(handlers))}."
        )
    return handler


def endpoint(**handlers: Handler) -> Callable[..., HttpResponse]:
    @csrf_exempt
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        request_id = f"req_{uuid.uuid4().hex}"
        try:
            request.get_host()  # ALLOWED_HOSTS: /v1 runs without CommonMiddleware (workbench/asgi.py)
            handler = _allowed(handlers, request)
            _authenticate(request)
            request.json = _parse_body(request) if request.method == "POST" else {}  # type: ignore[attr-defined]
            result = handler(request, **kwargs)
        except ApiError as error:
            return error_response(error, request_id)
        except DisallowedHost as error:
            return error_response(_bad_host(error), request_id)
        response = result if isinstance(result, HttpResponse) else JsonResponse(result, safe=False)
        response["request-id"] = request_id
        return response

    return view


def async_endpoint(**handlers: Callable[..., Awaitable[HttpResponse]]) -> Callable[..., Awaitable[HttpResponse]]:
    """The same contract for async handlers (the SSE stream)."""

    @csrf_exempt
    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        request_id = f"req_{uuid.uuid4().hex}"
        try:
            request.get_host()
            handler = _allowed(handlers, request)
            await sync_to_async(_authenticate)(request)
            response = await handler(request, **kwargs)
        except ApiError as error:
            return error_response(error, request_id)
        except DisallowedHost as error:
            return error_response(_bad_host(error), request_id)
        response["request-id"] = request_id
        return response

    return view
