"""/v1/environments/{id}/work: the self-hosted work queue as the SDK's worker calls it (reference §3.3, §5),
and /v1/environments/{id}/keys, Workbench's own routes for environment keys.

Who may call what: an environment key polls, acks, heartbeats, stops, lists and counts its environment's
items (sandboxes/work_keys.py's principal refuses the rest with a 403); a work item's sessions token acks,
heartbeats and stops that item; an API key retrieves, updates, stops and counts items and manages keys,
and is refused where the SDK documents it is (list) and where a worker's credential is the point (poll).
"""

from __future__ import annotations

from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from kernel.api.edge import caller
from kernel.api.errors import ApiError, PermissionDenied
from kernel.api.pagination import keyset_page
from kernel.api.schemas import ERRORS, Body, Empty, ErrorEnvelope, MetadataPatch, Page, Timestamp
from sandboxes.models import WorkItem
from sandboxes.work_keys import (
    EnvironmentKeyPrincipal,
    SessionsTokenPrincipal,
    environment_key_create,
    environment_key_json,
    environment_key_revoke,
    environment_keys,
    self_hosted_environment,
)
from sandboxes.work_queue import (
    RECLAIM_DEFAULT_MS,
    LeaseNotHeld,
    get_work,
    work_ack,
    work_heartbeat,
    work_json,
    work_poll,
    work_stats,
    work_stop,
    work_update,
)

router = Router(tags=["work"])
WORK_ERRORS: dict[Any, Any] = {**ERRORS, frozenset({403, 412}): ErrorEnvelope}
WorkState = Literal["queued", "starting", "active", "stopping", "stopped"]


class PreconditionFailed(ApiError):
    status = 412
    error_type = "invalid_request_error"


# -- schemas


class WorkData(Schema):
    type: Literal["session", "healthcheck"]
    id: str


class Work(Schema):
    id: str
    type: Literal["work"]
    environment_id: str
    data: WorkData
    state: WorkState
    metadata: dict[str, str]
    secret: str | None
    created_at: Timestamp
    acknowledged_at: Timestamp | None
    started_at: Timestamp | None
    latest_heartbeat_at: Timestamp | None
    stop_requested_at: Timestamp | None
    stopped_at: Timestamp | None


class WorkList(Schema):
    data: list[Work]
    next_page: str | None


class WorkHeartbeat(Schema):
    type: Literal["work_heartbeat"]
    last_heartbeat: str
    lease_extended: bool
    state: WorkState
    ttl_seconds: int


class WorkQueueStats(Schema):
    type: Literal["work_queue_stats"]
    depth: int
    pending: int
    oldest_queued_at: Timestamp | None
    workers_polling: int | None


class PollQuery(Schema):
    block_ms: int | None = Field(
        None, ge=1, le=999, description="Wait up to this long for work (1-999 ms); omitted: answer at once."
    )
    reclaim_older_than_ms: int = Field(
        RECLAIM_DEFAULT_MS,
        ge=0,
        le=86_400_000,
        description="Hand out again items a poll handed out this long ago that nobody acked.",
    )


class HeartbeatQuery(Schema):
    expected_last_heartbeat: str | None = Field(
        None,
        max_length=64,
        description="NO_HEARTBEAT for the first heartbeat (the claim); then the last answer's last_heartbeat.",
    )
    desired_ttl_seconds: int | None = Field(
        None,
        ge=settings.WORK_MIN_TTL_SECONDS,
        le=settings.WORK_MAX_TTL_SECONDS,
        description="The lease's length from this heartbeat; omitted: WORK_LEASE_TTL_SECONDS.",
    )


class WorkListQuery(Page):
    limit: int = Field(20, ge=1, le=100)


class WorkStop(Body):
    force: bool = Field(False, description="Stop at once, without waiting for the worker to finish.")


class WorkUpdate(Body):
    metadata: MetadataPatch


class KeyCreate(Body):
    name: str = Field("", max_length=200)


class EnvironmentKey(Schema):
    id: str
    type: Literal["environment_key"]
    environment_id: str
    name: str
    prefix: str
    created_at: Timestamp
    last_used_at: Timestamp | None
    revoked_at: Timestamp | None
    key: str | None = Field(None, description="The key itself: only in the answer that created it.")


class EnvironmentKeyList(Schema):
    data: list[EnvironmentKey]
    next_page: str | None


# -- who is calling


def _principal(request: HttpRequest) -> Any:
    return getattr(request, "principal", None)


def _worker_credential_only(request: HttpRequest, environment_id: str, what: str) -> None:
    if not isinstance(_principal(request), EnvironmentKeyPrincipal):
        self_hosted_environment(environment_id)  # a missing one is a 404 first, as another workspace's is
        raise PermissionDenied(
            f"{what} takes the environment's key (Authorization: Bearer wbek_...), not an API key; create one with "
            "`manage.py environment_key create ENV_ID` or POST /v1/environments/{id}/keys."
        )


def _api_key_only(request: HttpRequest, what: str) -> None:
    if getattr(request, "api_key", None) is None:
        raise PermissionDenied(
            f"{what} takes an API key; an environment key or a work item's secret is refused."
        )


# -- the queue (poll and stats before {work_id}: Django tries these paths in order)


@router.get("/environments/{environment_id}/work/poll", response={200: Work | None, **WORK_ERRORS})
def work_poll_route(request: HttpRequest, environment_id: str, query: Query[PollQuery]) -> Any:
    """A work item for this worker with its `secret`, or JSON `null` when none arrived within `block_ms`."""
    _worker_credential_only(request, environment_id, "Polling")
    worker_id = (request.headers.get("Anthropic-Worker-ID") or "")[:200]
    handed = work_poll(
        environment_id,
        worker_id=worker_id,
        block_ms=query.block_ms,
        reclaim_older_than_ms=query.reclaim_older_than_ms,
    )
    return None if handed is None else work_json(handed.item, secret=handed.secret)


@router.get("/environments/{environment_id}/work/stats", response={200: WorkQueueStats, **WORK_ERRORS})
def work_stats_route(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return work_stats(environment_id)


@router.get("/environments/{environment_id}/work", response={200: WorkList, **WORK_ERRORS})
def work_list_route(request: HttpRequest, environment_id: str, query: Query[WorkListQuery]) -> dict[str, Any]:
    """The environment's work items, newest first (the environment key only, as the SDK documents)."""
    _worker_credential_only(request, environment_id, "Listing work items")
    work_stats(environment_id)  # a 404 or 400 for an environment that is not a self-hosted one
    items = WorkItem.objects.filter(environment_id=environment_id)
    page = keyset_page(items, query.page, order="desc", limit=query.limit)
    return {"data": [work_json(item) for item in page["rows"]], "next_page": page["next_page"]}


@router.get("/environments/{environment_id}/work/{work_id}", response={200: Work, **WORK_ERRORS})
def work_retrieve_route(request: HttpRequest, environment_id: str, work_id: str) -> dict[str, Any]:
    _api_key_only(request, "Retrieving a work item")
    return work_json(get_work(environment_id, work_id))


@router.post("/environments/{environment_id}/work/{work_id}", response={200: Work, **WORK_ERRORS})
def work_update_route(
    request: HttpRequest, environment_id: str, work_id: str, body: WorkUpdate
) -> dict[str, Any]:
    """Merge `metadata` into the item's: a string sets a key, null removes it."""
    _api_key_only(request, "Updating a work item")
    return work_json(work_update(environment_id, work_id, metadata=body.metadata))


@router.post("/environments/{environment_id}/work/{work_id}/ack", response={200: Work, **WORK_ERRORS})
def work_ack_route(
    request: HttpRequest, environment_id: str, work_id: str, body: Empty | None = None
) -> dict[str, Any]:
    return work_json(work_ack(environment_id, work_id))


@router.post(
    "/environments/{environment_id}/work/{work_id}/heartbeat", response={200: WorkHeartbeat, **WORK_ERRORS}
)
def work_heartbeat_route(
    request: HttpRequest,
    environment_id: str,
    work_id: str,
    query: Query[HeartbeatQuery],
    body: Empty | None = None,
) -> dict[str, Any]:
    """Extend the lease; 412 `heartbeat_precondition_failed` (with `current_state`) when
    `expected_last_heartbeat` is not the stored one."""
    principal = _principal(request)
    expected = query.expected_last_heartbeat
    if expected is not None:
        expected = expected.replace(" ", "+")  # a zone's "+" sent unencoded arrives as a space
    try:
        return work_heartbeat(
            environment_id,
            work_id,
            expected_last_heartbeat=expected,
            desired_ttl_seconds=query.desired_ttl_seconds,
            token_hash=principal.token_hash if isinstance(principal, SessionsTokenPrincipal) else None,
        )
    except LeaseNotHeld as refused:
        raise PreconditionFailed(refused.message, code=refused.code, details=refused.details) from None


@router.post("/environments/{environment_id}/work/{work_id}/stop", response={200: Work, **WORK_ERRORS})
def work_stop_route(
    request: HttpRequest, environment_id: str, work_id: str, body: WorkStop
) -> dict[str, Any]:
    """Stop the item (409 when it is already stopped): with `force` at once, else once its worker finishes."""
    return work_json(work_stop(environment_id, work_id, force=body.force))


# -- environment keys (a Workbench extension: the SDK has no route that issues them)

_KEYS = "A Workbench extension (the SDK has no route for it); takes an API key."


@router.post(
    "/environments/{environment_id}/keys",
    response={200: EnvironmentKey, **WORK_ERRORS},
    tags=["environment keys"],
    description=f"Create a key for a self-hosted environment; the answer's `key` is shown this once. {_KEYS}",
)
def keys_create(request: HttpRequest, environment_id: str, body: KeyCreate) -> dict[str, Any]:
    _api_key_only(request, "Creating an environment key")
    key, raw = environment_key_create(environment_id, name=body.name, actor=caller(request).actor)
    return environment_key_json(key, raw=raw)


@router.get(
    "/environments/{environment_id}/keys",
    response={200: EnvironmentKeyList, **WORK_ERRORS},
    tags=["environment keys"],
    description=f"The environment's keys (never the keys themselves), revoked ones too. {_KEYS}",
)
def keys_list(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    _api_key_only(request, "Listing environment keys")
    return {"data": [environment_key_json(k) for k in environment_keys(environment_id)], "next_page": None}


@router.post(
    "/environments/{environment_id}/keys/{key_id}/revoke",
    response={200: EnvironmentKey, **WORK_ERRORS},
    tags=["environment keys"],
    description=f"Revoke a key: its next request is refused. {_KEYS}",
)
def keys_revoke(
    request: HttpRequest, environment_id: str, key_id: str, body: Empty | None = None
) -> dict[str, Any]:
    _api_key_only(request, "Revoking an environment key")
    return environment_key_json(environment_key_revoke(environment_id, key_id, actor=caller(request).actor))
