"""/v1/environments (reference §5), and a session's hands: /v1/sessions/{id}/sandboxes and /v1/sandboxes
(Workbench's own)."""

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import field_validator

from kernel.api.edge import caller
from kernel.api.pagination import keyset_page
from kernel.api.schemas import ERRORS, Body, Deleted, Metadata, MetadataPatch, Page, Timestamp
from kernel.errors import NotFound, Unavailable
from sandboxes.environments import (
    Scope,
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
from sandboxes.models import Environment as EnvironmentRow
from sandboxes.models import Sandbox as SandboxRow
from sandboxes.providers import SandboxError
from sessions.models import Session

router = Router(tags=["environments"])


class EnvironmentCreate(Body):
    name: str = Field(..., min_length=1, max_length=255)
    config: dict[str, Any] | None = Field(
        None, description='{"type": "cloud", networking, packages, sandbox} or {"type": "self_hosted"}.'
    )
    description: str | None = None
    metadata: Metadata | None = None
    scope: Scope = "organization"


class EnvironmentUpdate(Body):
    name: str | None = Field(None, min_length=1, max_length=255)
    config: dict[str, Any] | None = None
    description: str | None = None
    metadata: MetadataPatch | None = None
    scope: Scope | None = None

    @field_validator("name", "config", "metadata", "scope", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("may be left out, but not null")
        return value


class EnvironmentsQuery(Page):
    limit: int = Field(20, ge=1, le=100)
    include_archived: bool = False


class Environment(Schema):
    id: str
    type: Literal["environment"]
    name: str
    description: str | None
    metadata: dict[str, str]
    scope: str
    config: dict[str, Any]
    created_at: Timestamp
    updated_at: Timestamp
    archived_at: Timestamp | None


class EnvironmentList(Schema):
    data: list[Environment]
    next_page: str | None


@router.post("/environments", response={200: Environment, **ERRORS})
def environments_create(request: HttpRequest, body: EnvironmentCreate) -> dict[str, Any]:
    return environment_json(environment_create(workspace_id=caller(request).workspace_id, **body.given()))


@router.get("/environments", response={200: EnvironmentList, **ERRORS})
def environments_list(request: HttpRequest, query: Query[EnvironmentsQuery]) -> dict[str, Any]:
    environments = EnvironmentRow.objects.live().filter(workspace_id=caller(request).workspace_id)
    if not query.include_archived:
        environments = environments.filter(archived_at__isnull=True)
    page = keyset_page(environments, query.page, order="desc", limit=query.limit)
    return {"data": [environment_json(e) for e in page["rows"]], "next_page": page["next_page"]}


@router.get("/environments/{environment_id}", response={200: Environment, **ERRORS})
def environments_retrieve(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(get_environment(environment_id))


@router.post("/environments/{environment_id}", response={200: Environment, **ERRORS})
def environments_update(request: HttpRequest, environment_id: str, body: EnvironmentUpdate) -> dict[str, Any]:
    return environment_json(environment_update(environment_id, **body.given()))


@router.delete("/environments/{environment_id}", response={200: Deleted, **ERRORS})
def environments_delete(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_delete(environment_id)


@router.post("/environments/{environment_id}/archive", response={200: Environment, **ERRORS})
def environments_archive(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(environment_archive(environment_id))


# -- hands


class Sandbox(Schema):
    id: str
    type: Literal["sandbox"]
    name: str
    status: str
    provider: str
    environment_id: str
    session_id: str | None
    created_at: Timestamp
    last_used_at: Timestamp


class SandboxList(Schema):
    data: list[Sandbox]
    next_page: str | None


class SandboxAdd(Body):
    name: str | None = Field(None, min_length=1, max_length=MAX_NAME_LENGTH)
    sandbox_id: str | None = Field(
        None, min_length=1, description="Attach this free sandbox instead of provisioning one."
    )


class SandboxTransfer(Body):
    to_session: str = Field(..., min_length=1)


class SandboxesQuery(Schema):
    limit: int = Field(100, ge=1, le=1000)
    include_terminated: bool = False
    free: bool = False


def _session_or_404(session_id: str) -> None:
    if not Session.objects.live().filter(id=session_id).exists():
        raise NotFound("session", session_id)


def _held_by(session_id: str, sandbox_id: str) -> None:
    _session_or_404(session_id)
    if not SandboxRow.objects.filter(id=sandbox_id, session_id=session_id).exists():
        raise NotFound("sandbox", sandbox_id, f"Session {session_id} holds no sandbox {sandbox_id!r}.")


@router.get("/sessions/{session_id}/sandboxes", response={200: SandboxList, **ERRORS}, tags=["sandboxes"])
def session_sandboxes_list(request: HttpRequest, session_id: str) -> dict[str, Any]:
    _session_or_404(session_id)
    sandboxes = SandboxRow.objects.filter(session_id=session_id).exclude(status=SandboxRow.Status.TERMINATED)
    return {"data": [sandbox_json(s) for s in sandboxes.order_by("created_at")], "next_page": None}


@router.post("/sessions/{session_id}/sandboxes", response={200: Sandbox, **ERRORS}, tags=["sandboxes"])
def session_sandboxes_add(request: HttpRequest, session_id: str, body: SandboxAdd) -> dict[str, Any]:
    """`{"name"}` provisions a new hand; `{"sandbox_id", "name"?}` attaches a free one."""
    _session_or_404(session_id)
    if body.sandbox_id is not None:
        return sandbox_json(
            sandbox_attach(body.sandbox_id, session_id, name=body.name, actor=caller(request).actor)
        )
    try:
        return sandbox_json(sandbox_provision(session_id, name=body.name or "main"))
    except SandboxError as error:
        raise Unavailable(f"The sandbox provider could not provision: {error}") from None


@router.post(
    "/sessions/{session_id}/sandboxes/{sandbox_id}/detach",
    response={200: Sandbox, **ERRORS},
    tags=["sandboxes"],
)
def session_sandbox_detach(request: HttpRequest, session_id: str, sandbox_id: str) -> dict[str, Any]:
    _held_by(session_id, sandbox_id)
    return sandbox_json(sandbox_detach(sandbox_id))


@router.post(
    "/sessions/{session_id}/sandboxes/{sandbox_id}/transfer",
    response={200: Sandbox, **ERRORS},
    tags=["sandboxes"],
)
def session_sandbox_transfer(
    request: HttpRequest, session_id: str, sandbox_id: str, body: SandboxTransfer
) -> dict[str, Any]:
    _held_by(session_id, sandbox_id)
    return sandbox_json(sandbox_transfer(sandbox_id, body.to_session, actor=caller(request).actor))


@router.delete(
    "/sessions/{session_id}/sandboxes/{sandbox_id}", response={200: Sandbox, **ERRORS}, tags=["sandboxes"]
)
def session_sandbox_terminate(request: HttpRequest, session_id: str, sandbox_id: str) -> dict[str, Any]:
    _held_by(session_id, sandbox_id)
    return sandbox_json(sandbox_terminate(sandbox_id, actor=caller(request).actor))


@router.get("/sandboxes", response={200: SandboxList, **ERRORS}, tags=["sandboxes"])
def sandboxes_list(request: HttpRequest, query: Query[SandboxesQuery]) -> dict[str, Any]:
    sandboxes = SandboxRow.objects.filter(environment__workspace_id=caller(request).workspace_id)
    if not query.include_terminated:
        sandboxes = sandboxes.exclude(status=SandboxRow.Status.TERMINATED)
    if query.free:
        sandboxes = sandboxes.filter(session__isnull=True)
    return {
        "data": [sandbox_json(s) for s in sandboxes.order_by("-created_at")[: query.limit]],
        "next_page": None,
    }
