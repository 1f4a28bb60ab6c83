"""The `/v1` edge: django-ninja routes with declared schemas, and the one place errors become the envelope.

`Edge` is the project's NinjaAPI. It authenticates the API key (Bearer or `x-api-key`), reads a POST body
as one JSON object within the size and nesting limits, and refuses text that is not text (a NUL, an
unpaired surrogate) in the body, the path or the query before a handler or the database sees it. Every
failure, whoever raised it (ninja's validation, a service's domain error, Django's host check, a bug),
leaves in the envelope the official SDK parses (reference §1.5), with a `request-id` header. Handlers are
one line: they take the parsed schema, call one service and return its result's JSON.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from inspect import iscoroutinefunction
from typing import Any, Literal, get_args, get_origin

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import (
    DisallowedHost,
    ImproperlyConfigured,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.db import connections
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError, ValidationErrorContext
from ninja.parser import Parser
from ninja.security import APIKeyHeader

from kernel.api.errors import (
    ApiError,
    AuthenticationFailed,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    from_domain,
)
from kernel.api.idempotency import idempotent
from kernel.api.schemas import UNION_TAGS
from kernel.api.validation import MAX_BODY_DEPTH, check_body, check_text, describe
from kernel.auth import Principal, api_key_from_headers, principal_from_token, raw_bearer
from kernel.errors import DomainError
from kernel.models import ApiKey
from kernel.tenancy import Caller, check_path, unruled

logger = logging.getLogger(__name__)


def error_response(error: ApiError, request_id: str) -> JsonResponse:
    response = JsonResponse(error.envelope(), status=error.status)
    response["request-id"] = request_id
    if 400 <= error.status < 500 and error.status not in (408, 409, 429):
        response["x-should-retry"] = "false"
    return response


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


class ApiKeyAuth(APIKeyHeader):
    """An API key as `Authorization: Bearer <key>` or `x-api-key: <key>` (the SDK sends the latter)."""

    param_name = "x-api-key"

    def _get_key(self, request: HttpRequest) -> str | None:
        return None  # `authenticate` reads both headers itself

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        method = request.method or "GET"
        found = credential(request.headers, method, request.path)
        if found is None:
            return None
        request.api_key = found if isinstance(found, ApiKey) else None  # type: ignore[attr-defined]
        request.principal = None if isinstance(found, ApiKey) else found  # type: ignore[attr-defined]
        caller = caller_of(found)
        asked = request.headers.get(WORKSPACE_HEADER)
        if asked and asked != caller.workspace_id:
            raise PermissionDenied(
                f"This credential belongs to workspace {caller.workspace_id}, not {asked!r}: send that "
                f"workspace's key, or leave out the {WORKSPACE_HEADER} header."
            )
        if caller.read_only and method not in READ_METHODS:
            raise PermissionDenied(
                f"This API key is read-only: it may read, not {method} {request.path}. Use a full key of "
                "the workspace to change anything."
            )
        check_path(caller, request.resolver_match.kwargs if request.resolver_match else {})
        request.caller = caller  # type: ignore[attr-defined]
        return found


WORKSPACE_HEADER = "anthropic-workspace-id"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def caller_of(found: ApiKey | Principal) -> Caller:
    if isinstance(found, ApiKey):
        return Caller(
            workspace_id=found.workspace_id,
            actor=f"api key {found.name} ({found.prefix}…)",
            read_only=found.read_only,
        )
    return Caller(workspace_id=found.workspace_id, actor=found.actor)


def caller(request: HttpRequest) -> Caller:
    """The authenticated caller of a /v1 request (set by `ApiKeyAuth`)."""
    return request.caller  # type: ignore[attr-defined,no-any-return]


_NO_KEY = (
    "No valid API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'; "
    "create one with `manage.py createapikey --name NAME` or on the API keys page."
)


def credential(headers: Mapping[str, str], method: str, path: str) -> ApiKey | Principal | None:
    """The API key or narrower principal these headers carry, if it may make this request; None if they carry
    none. A credential of ours that no longer works, or does not reach this path, raises why."""
    found = api_key_from_headers(headers)
    if found is not None:
        return found
    raw = raw_bearer(headers)
    principal = principal_from_token(raw) if raw else None
    if principal is None:
        return None
    why = principal.allows(method, path)
    if why is not None:
        raise PermissionDenied(why)
    return principal


def credential_recheck(request: HttpRequest) -> Callable[[], Awaitable[dict[str, Any] | None]]:
    """For a response that outlives its request (a stream): asks again whether the request's credential still
    makes it, and answers None while it does, else the error envelope that says why not (the key was revoked,
    the work item its sessions token belongs to stopped or moved to another worker)."""
    headers = {name.lower(): value for name, value in request.headers.items()}
    method, path = request.method or "GET", request.path

    def check() -> dict[str, Any] | None:
        try:
            if credential(headers, method, path) is None:
                raise AuthenticationFailed(_NO_KEY)
        except ApiError as error:
            return error.envelope()
        return None

    return database_sync_to_async(check, thread_sensitive=False)


class BodyParser(Parser):
    """A POST body is one JSON object (an empty body is `{}`, as the SDK sends for archive)."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        limit = settings.API_MAX_BODY_BYTES
        if int(request.headers.get("Content-Length") or 0) > limit or len(raw := request.body) > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes (1 MiB).")
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
            raise InvalidRequest(f"The request body must be a JSON object, not {describe(body)}.")
        check_body(body)
        return body


def _where(source: str, loc: tuple[Any, ...]) -> str:
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).removeprefix(".")
    if source == "query":
        return f"Query parameter '{path}'"
    if source == "path":
        return f"The path parameter '{path}'"
    return f"'{path}'"


_PHRASES: dict[str, Callable[[dict[str, Any]], str]] = {
    "missing": lambda e: "is required",
    "union_tag_not_found": lambda e: "is required",
    "union_tag_invalid": lambda e: f"must be one of {e['ctx']['expected_tags']}, not {e['ctx']['tag']!r}",
    "value_error": lambda e: str(e.get("ctx", {}).get("error") or e["msg"]),
    "extra_forbidden": lambda e: (
        "is an unknown field; remove it (the schema at /v1/openapi.json lists the fields)"
    ),
    "int_type": lambda e: f"must be an integer, not {describe(e.get('input'))}",
    "int_parsing": lambda e: f"must be an integer, not {e.get('input')!r}",
    "int_from_float": lambda e: f"must be an integer, not {e.get('input')!r}",
    "string_type": lambda e: f"must be a string, not {describe(e.get('input'))}",
    "bool_type": lambda e: f"must be a boolean, not {describe(e.get('input'))}",
    "bool_parsing": lambda e: f"must be true or false, not {e.get('input')!r}",
    "list_type": lambda e: f"must be an array, not {describe(e.get('input'))}",
    "dict_type": lambda e: f"must be an object, not {describe(e.get('input'))}",
    "model_type": lambda e: f"must be an object, not {describe(e.get('input'))}",
    "model_attributes_type": lambda e: f"must be an object, not {describe(e.get('input'))}",
    "greater_than_equal": lambda e: _range(e) or f"must be at least {e['ctx']['ge']}, not {e.get('input')!r}",
    "less_than_equal": lambda e: _range(e) or f"must be at most {e['ctx']['le']}, not {e.get('input')!r}",
    "string_too_short": lambda e: (
        "must not be empty"
        if e["ctx"]["min_length"] == 1
        else f"must be at least {e['ctx']['min_length']} characters"
    ),
    "string_too_long": lambda e: (
        f"must be at most {e['ctx']['max_length']} characters, not {len(e.get('input') or '')}"
    ),
    "too_long": lambda e: (
        f"may hold at most {e['ctx']['max_length']} items, not {e['ctx'].get('actual_length')}"
    ),
    "too_short": lambda e: (
        "must hold at least one item"
        if e["ctx"]["min_length"] == 1
        else f"must hold at least {e['ctx']['min_length']} items"
    ),
    "literal_error": lambda e: (
        f"must be one of {', '.join(map(str, e.get('choices') or ()))}, not {e.get('input')!r}"
        if e.get("choices")
        else f"must be {e['ctx']['expected']}, not {e.get('input')!r}"
    ),
    "enum": lambda e: f"must be {e['ctx']['expected']}, not {e.get('input')!r}",
    "datetime_from_date_parsing": lambda e: f"must be an RFC 3339 date-time, not {e.get('input')!r}",
    "datetime_parsing": lambda e: f"must be an RFC 3339 date-time, not {e.get('input')!r}",
    "datetime_type": lambda e: f"must be an RFC 3339 date-time, not {e.get('input')!r}",
}


def _range(error: dict[str, Any]) -> str | None:
    low, high = error.get("bounds", (None, None))
    if low is None or high is None:
        return None
    return f"must be between {low} and {high}, not {error.get('input')!r}"


def _field(model: Any, loc: tuple[Any, ...]) -> Any:
    """The pydantic field at `loc` in `model` (through nested schemas), or None."""
    field = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(part, str) or not fields:
            return field if isinstance(part, int) else None
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            return None
        model = field.annotation
    return field


def _annotate(error: dict[str, Any], field: Any) -> dict[str, Any]:
    """What a message needs from the field's declaration: both bounds of a range, a literal's choices."""
    if field is None:
        return error
    bounds = (
        [getattr(m, "ge", None) for m in field.metadata],
        [getattr(m, "le", None) for m in field.metadata],
    )
    low = next((b for b in bounds[0] if b is not None), None)
    high = next((b for b in bounds[1] if b is not None), None)
    choices = next(
        (
            get_args(arg)
            for arg in (field.annotation, *get_args(field.annotation))
            if get_origin(arg) is Literal
        ),
        (),
    )
    return {**error, "bounds": (low, high), "choices": choices}


def validation_message(errors: list[dict[str, Any]]) -> str:
    """Pydantic's findings in the API's words: the first few, each naming its field."""
    said = []
    for error in errors[:3]:
        source, *loc = error["loc"]
        if loc[:1] == [source]:  # the handler's parameter (`body`, `query`), not a field of the request
            loc = loc[1:]
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
        loc = [part for i, part in enumerate(loc) if not (i and part in UNION_TAGS and i < len(loc) - 1)]
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc = [*loc, error["ctx"]["discriminator"].strip("'")]
        phrase = _PHRASES.get(error["type"], lambda e: e["msg"].rstrip(".").lower())(error)
        said.append(f"{_where(source, tuple(loc))} {phrase}.")
    more = len(errors) - len(said)
    return " ".join(said) + (
        f" ({more} more problem{'s' if more > 1 else ''} in this request.)" if more else ""
    )


def api_error(error: Exception) -> ApiError | None:
    """What the client is told of `error`; None for a failure nobody planned for (a 500, logged)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, DomainError):
        return from_domain(error)
    if isinstance(error, ValidationError):
        return InvalidRequest(validation_message(error.errors))
    if isinstance(error, HttpError) and isinstance(error.__cause__, ApiError | DomainError):
        return api_error(error.__cause__)  # ninja wraps what the body parser raised
    if isinstance(error, AuthenticationError):
        return AuthenticationFailed(_NO_KEY)
    if isinstance(error, Http404):  # ninja's root, `/v1/`, has no docs to show
        return NotFound("There is no API endpoint here; the routes are listed at /v1/openapi.json.")
    if isinstance(error, DisallowedHost):
        return InvalidRequest(str(error))  # Django says which host, and to add it to ALLOWED_HOSTS
    if isinstance(error, RequestDataTooBig):
        return PayloadTooLarge(
            f"The request body is over the limit of {settings.API_MAX_BODY_BYTES} bytes (1 MiB)."
        )
    if isinstance(error, SuspiciousOperation):
        return InvalidRequest(f"The request was refused: {error}.")
    return None


def _check_params(request: HttpRequest, path_kwargs: dict[str, Any]) -> None:
    """Path and query parameters hold text: a NUL or an unpaired surrogate is a 400, not a database error."""
    for name, value in path_kwargs.items():
        if isinstance(value, str):
            check_text(value, f"The path parameter '{name}'")
    for name, values in request.GET.lists():
        check_text(name, f"The query parameter name {json.dumps(name)}")
        for value in values:
            check_text(value, f"Query parameter '{name}'")


def _answer(request: HttpRequest, error: Exception) -> HttpResponse:
    known = api_error(error)
    request_id = request.request_id  # type: ignore[attr-defined]
    return internal_error(request_id) if known is None else error_response(known, request_id)


def _finish(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if response.status_code == 405 and not response.get("Content-Type", "").startswith("application/json"):
        allowed = ", ".join(sorted(method.strip() for method in response.get("Allow", "").split(",")))
        error = MethodNotAllowed(f"{request.method} is not allowed on {request.path}; use {allowed}.")
        response = error_response(error, request.request_id)  # type: ignore[attr-defined]
    response["request-id"] = request.request_id  # type: ignore[attr-defined]
    if (known := getattr(request, "caller", None)) is not None:
        response[WORKSPACE_HEADER] = known.workspace_id  # the SDK reads it into an error's `workspace_id`
    return response


def _give_back_connections() -> None:
    """Close this thread's database connections, except one inside a transaction: that one is its owner's (a
    test's, or a caller's atomic block) and closing it would end their transaction under them."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


def _guarded(view: Callable[..., Any]) -> Callable[..., Any]:
    """Around ninja's view for one path: a request id, the host and parameter checks, the envelope for all."""

    def begin(request: HttpRequest, kwargs: dict[str, Any]) -> None:
        request.request_id = f"req_{uuid.uuid4().hex}"  # type: ignore[attr-defined]
        request.get_host()  # ALLOWED_HOSTS: /v1 runs without CommonMiddleware (workbench/asgi.py)
        _check_params(request, kwargs)

    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def guarded_async(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            try:
                begin(request, kwargs)
                response = await view(request, **kwargs)
                if response.streaming:
                    # The stream outlives the request, whose thread would keep the pooled connection its
                    # authentication and view used until the stream ends: some 35 open streams emptied the
                    # pool and every other request of the process waited and failed (bench/load.py). The
                    # stream reads through connections of its own, each returned after its read.
                    await sync_to_async(_give_back_connections)()
            except Exception as error:
                response = _answer(request, error)
            return _finish(request, response)

        return guarded_async

    @functools.wraps(view)
    def guarded(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        try:
            begin(request, kwargs)
            response = view(request, **kwargs)
        except Exception as error:
            response = _answer(request, error)
        return _finish(request, response)

    return guarded


class Edge(NinjaAPI):
    def __init__(self, **options: Any) -> None:
        super().__init__(
            title="Workbench API",
            version="v1",
            urls_namespace="v1",
            docs_url=None,
            auth=ApiKeyAuth(),
            parser=BodyParser(),
            **options,
        )
        self.add_decorator(answers)

    def set_default_exception_handlers(self) -> None:
        self.add_exception_handler(Exception, _answer)  # type: ignore[arg-type]  # ninja's own hint is too narrow

    def validation_error_from_error_contexts(
        self, error_contexts: list[ValidationErrorContext]
    ) -> ValidationError:
        """As ninja's, keeping each error's input: the message says what was sent."""
        errors = []
        for context in error_contexts:
            model = context.model
            for error in context.pydantic_validation_error.errors(include_url=False):
                loc = model.__ninja_flatten_map_reverse__.get(error["loc"], error["loc"])
                annotated = _annotate(dict(error), _field(model, tuple(error["loc"])))
                errors.append({**annotated, "loc": (model.__ninja_param_source__, *loc)})
        return ValidationError(errors)

    @property
    def urls(self) -> tuple[list[Any], str, str]:
        patterns, app_name, namespace = super().urls
        for pattern in patterns:
            if isinstance(pattern, URLPattern) and pattern.name != "openapi-json":
                pattern.callback = _guarded(pattern.callback)
                if missing := unruled(_PATH_PARAM.findall(str(pattern.pattern))):
                    raise ImproperlyConfigured(
                        f"/v1/{pattern.pattern} names {', '.join(missing)}, which no workspace rule covers: "
                        "register its owner (kernel.tenancy.add_owner) or its parent (CHILD_PARAMS)."
                    )
        return _lookup_order(patterns), app_name, namespace


_PATH_PARAM = re.compile(r"<(?:\w+:)?(\w+)>")
_HOT = ("sessions/<session_id>/events", "sessions/<session_id>", "sessions", "")


def _lookup_order(patterns: list[Any]) -> list[Any]:
    """The patterns as Django should try them: one per path (ninja adds one per method, all to the same
    view), and a session's events first, then its other routes: a turn's requests are those. Django tries patterns one by one
    (a regex each), and no two of these paths match one URL, so the order changes nothing but time."""
    seen: set[str] = set()
    unique = []
    for pattern in patterns[:-1]:  # the last is ninja's root, which stays last
        if str(pattern.pattern) not in seen:
            seen.add(str(pattern.pattern))
            unique.append(pattern)
    unique.sort(key=lambda p: _HOT.index(next((h for h in _HOT if str(p.pattern).startswith(h)), "")))
    return [*unique, patterns[-1]]


def answers(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A handler's dict as the JSON response, and a POST run once per `Idempotency-Key`. `Edge` applies it to
    every sync handler; an async one (the SSE stream) returns its own response and takes no body."""
    if iscoroutinefunction(handler):
        return handler

    @functools.wraps(handler)
    def answer(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        def render() -> HttpResponse:
            result = handler(request, *args, **kwargs)
            return result if isinstance(result, HttpResponse) else JsonResponse(result, safe=False)

        return idempotent(request, render) if request.method == "POST" else render()

    return answer
