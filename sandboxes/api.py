"""/v1/environments."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from kernel.api.endpoint import endpoint
from kernel.api.pagination import keyset_page
from kernel.api.validation import no_unknown_fields, query_bool, query_int, text
from kernel.errors import NotFound, Unavailable
from sandboxes.environments import (
    environment_archive,
    environment_create,
    environment_delete,
    environment_json,
    environment_update,
    get_environment,
)
from sandboxes.hands import (
    MAX_NAME_LENGTH,
    sandbox_attach,
    sandbox_detach,
    sandbox_json,
    sandbox_provision,
    sandbox_terminate,
    sandbox_transfer,
)
from sandboxes.models import Environment, Sandbox
from sandboxes.providers import SandboxError
from sessions.models import Session


def environments_create(request: HttpRequest) -> dict[str, Any]:
    return environment_json(environment_create(request.json))  # type: ignore[attr-defined]


def environments_list(request: HttpRequest) -> dict[str, Any]:
    limit = query_int(request.GET, "limit", default=20, minimum=1, maximum=100)
    environments = Environment.objects.filter(deleted_at__isnull=True)
    if not query_bool(request.GET, "include_archived"):
        environments = environments.filter(archived_at__isnull=True)
    page = keyset_page(environments, request.GET, order="desc", limit=limit)
    return {"data": [environment_json(e) for e in page["rows"]], "next_page": page["next_page"]}


def environments_retrieve(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(get_environment(environment_id))


def environments_update(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(environment_update(environment_id, request.json))  # type: ignore[attr-defined]


def environments_delete(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_delete(environment_id)


def environments_archive(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(environment_archive(environment_id))


collection = endpoint(GET=environments_list, POST=environments_create)
item = endpoint(GET=environments_retrieve, POST=environments_update, DELETE=environments_delete)
archive = endpoint(POST=environments_archive)


# -- hands: /v1/sessions/{id}/sandboxes and /v1/sandboxes (Workbench's own endpoints)


def _session_or_404(session_id: str) -> None:
    if not Session.objects.filter(id=session_id, deleted_at__isnull=True).exists():
        raise NotFound("session", session_id)


def _held_by(session_id: str, sandbox_id: str) -> None:
    if not Sandbox.objects.filter(id=sandbox_id, session_id=session_id).exists():
        raise NotFound("sandbox", sandbox_id, f"Session {session_id} holds no sandbox {sandbox_id!r}.")


def session_sandboxes_list(request: HttpRequest, session_id: str) -> dict[str, Any]:
    _session_or_404(session_id)
    sandboxes = Sandbox.objects.filter(session_id=session_id).exclude(status=Sandbox.Status.TERMINATED)
    return {"data": [sandbox_json(s) for s in sandboxes.order_by("created_at")], "next_page": None}


def session_sandboxes_add(request: HttpRequest, session_id: str) -> dict[str, Any]:
    """`{"name"}` provisions a new hand; `{"sandbox_id", "name"?}` attaches a free one."""
    body = request.json  # type: ignore[attr-defined]
    no_unknown_fields(body, ("name", "sandbox_id"), "sandbox")
    _session_or_404(session_id)
    name = text(body, "name", min_length=1, max_length=MAX_NAME_LENGTH, default=None)
    if "sandbox_id" in body:
        return sandbox_json(sandbox_attach(text(body, "sandbox_id", min_length=1), session_id, name=name))
    try:
        return sandbox_json(sandbox_provision(session_id, name=name or "main"))
    except SandboxError as error:
        raise Unavailable(f"The sandbox provider could not provision: {error}") from None


def session_sandbox_detach(request: HttpRequest, session_id: str, sandbox_id: str) -> dict[str, Any]:
    _held_by(session_id, sandbox_id)
    return sandbox_json(sandbox_detach(sandbox_id))


def session_sandbox_transfer(request: HttpRequest, session_id: str, sandbox_id: str) -> dict[str, Any]:
    body = request.json  # type: ignore[attr-defined]
    no_unknown_fields(body, ("to_session",), "transfer")
    _held_by(session_id, sandbox_id)
    return sandbox_json(sandbox_transfer(sandbox_id, text(body, "to_session", required=True, min_length=1)))


def session_sandbox_terminate(request: HttpRequest, session_id: str, sandbox_id: str) -> dict[str, Any]:
    _held_by(session_id, sandbox_id)
    return sandbox_json(sandbox_terminate(sandbox_id))


def sandboxes_list(request: HttpRequest) -> dict[str, Any]:
    limit = query_int(request.GET, "limit", default=100, minimum=1, maximum=1000)
    sandboxes = Sandbox.objects.exclude(status=Sandbox.Status.TERMINATED)
    if query_bool(request.GET, "include_terminated"):
        sandboxes = Sandbox.objects.all()
    if request.GET.get("free") == "true":
        sandboxes = sandboxes.filter(session__isnull=True)
    return {"data": [sandbox_json(s) for s in sandboxes.order_by("-created_at")[:limit]], "next_page": None}


session_sandboxes = endpoint(GET=session_sandboxes_list, POST=session_sandboxes_add)
session_sandbox = endpoint(DELETE=session_sandbox_terminate)
session_sandbox_detach_view = endpoint(POST=session_sandbox_detach)
session_sandbox_transfer_view = endpoint(POST=session_sandbox_transfer)
sandboxes = endpoint(GET=sandboxes_list)
