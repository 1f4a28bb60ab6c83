"""/v1/sessions, /v1/sessions/{id}/resources and /v1/sessions/{id}/events: list, send, and the SSE live tail
(reference §3.6, §6 and §7)."""

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Query, Router

from harness.api.schemas import (
    EventList,
    EventsQuery,
    EventsSend,
    ResourceAdd,
    ResourcesQuery,
    ResourceUpdate,
    Session,
    SessionCreate,
    SessionFork,
    SessionList,
    SessionResource,
    SessionResourceList,
    SessionsQuery,
    SessionUpdate,
    StreamQuery,
)
from harness.services.fork import session_fork
from harness.services.lifecycle import (
    session_archive,
    session_create,
    session_delete,
    session_send_events,
    session_update,
)
from harness.services.resources import (
    session_resource_add,
    session_resource_delete,
    session_resource_get,
    session_resource_update,
    session_resources_list,
)
from kernel.api.edge import caller, credential_recheck
from kernel.api.pagination import decode_cursor, encode_cursor, keyset_page
from kernel.api.schemas import ERRORS, Deleted
from kernel.errors import Invalid
from sessions.event_types import validate_types_filter
from sessions.models import Session as SessionRow
from sessions.selectors import get_session, list_events
from sessions.serializers import session_json
from sessions.stream import sse_tail
from vault.api import actor_of

router = Router(tags=["sessions"])


@router.post("/sessions", response={200: Session, **ERRORS})
def sessions_create(request: HttpRequest, body: SessionCreate) -> dict[str, Any]:
    return session_json(
        session_create(**body.given(), actor=actor_of(request), workspace_id=caller(request).workspace_id)
    )


@router.get("/sessions", response={200: SessionList, **ERRORS})
def sessions_list(request: HttpRequest, query: Query[SessionsQuery]) -> dict[str, Any]:
    sessions = SessionRow.objects.live().filter(workspace_id=caller(request).workspace_id)
    if not query.include_archived:
        sessions = sessions.filter(archived_at__isnull=True)
    if query.agent_id:
        sessions = sessions.filter(agent_id=query.agent_id)
    if query.agent_version:
        sessions = sessions.filter(agent_version=query.agent_version)
    if query.statuses:
        sessions = sessions.filter(status__in=query.statuses)
    for op, value in query.created_ranges().items():
        sessions = sessions.filter(**{f"created_at__{op}": value})
    page = keyset_page(sessions, query.page, order=query.order, limit=query.limit, bidirectional=True)
    return {
        "data": [session_json(s) for s in page["rows"]],
        "next_page": page["next_page"],
        "prev_page": page["prev_page"],
    }


@router.get("/sessions/{session_id}", response={200: Session, **ERRORS})
def sessions_retrieve(request: HttpRequest, session_id: str) -> dict[str, Any]:
    return session_json(get_session(session_id))


@router.post("/sessions/{session_id}", response={200: Session, **ERRORS})
def sessions_update(request: HttpRequest, session_id: str, body: SessionUpdate) -> dict[str, Any]:
    return session_json(session_update(session_id, actor=actor_of(request), **body.given()))


@router.delete("/sessions/{session_id}", response={200: Deleted, **ERRORS})
def sessions_delete(request: HttpRequest, session_id: str) -> dict[str, Any]:
    return session_delete(session_id, actor=actor_of(request))


@router.post("/sessions/{session_id}/archive", response={200: Session, **ERRORS})
def sessions_archive(request: HttpRequest, session_id: str) -> dict[str, Any]:
    return session_json(session_archive(session_id))


@router.post("/sessions/{session_id}/fork", response={200: Session, **ERRORS})
def sessions_fork(request: HttpRequest, session_id: str, body: SessionFork) -> dict[str, Any]:
    """Workbench's own: a new session whose log starts as events [0:at_seq] of this one."""
    return session_json(session_fork(session_id, at_seq=body.at_seq, harness=body.harness, title=body.title))


@router.get(
    "/sessions/{session_id}/resources", response={200: SessionResourceList, **ERRORS}, tags=["resources"]
)
def resources_list(request: HttpRequest, session_id: str, query: Query[ResourcesQuery]) -> dict[str, Any]:
    return session_resources_list(session_id, limit=query.limit, page=query.page)


@router.post(
    "/sessions/{session_id}/resources", response={200: SessionResource, **ERRORS}, tags=["resources"]
)
def resources_add(request: HttpRequest, session_id: str, body: ResourceAdd) -> dict[str, Any]:
    return session_resource_add(session_id, **body.given())


@router.get(
    "/sessions/{session_id}/resources/{resource_id}",
    response={200: SessionResource, **ERRORS},
    tags=["resources"],
)
def resources_retrieve(request: HttpRequest, session_id: str, resource_id: str) -> dict[str, Any]:
    return session_resource_get(session_id, resource_id)


@router.post(
    "/sessions/{session_id}/resources/{resource_id}",
    response={200: SessionResource, **ERRORS},
    tags=["resources"],
)
def resources_update(
    request: HttpRequest, session_id: str, resource_id: str, body: ResourceUpdate
) -> dict[str, Any]:
    """Rotate a github_repository's token (sealed into the vault; never returned)."""
    return session_resource_update(
        session_id, resource_id, authorization_token=body.authorization_token, actor=actor_of(request)
    )


@router.delete(
    "/sessions/{session_id}/resources/{resource_id}",
    response={200: Deleted, **ERRORS},
    tags=["resources"],
)
def resources_delete(request: HttpRequest, session_id: str, resource_id: str) -> dict[str, Any]:
    return session_resource_delete(session_id, resource_id, actor=actor_of(request))


@router.get("/sessions/{session_id}/events", response={200: EventList, **ERRORS}, tags=["events"])
def events_list(request: HttpRequest, session_id: str, query: Query[EventsQuery]) -> dict[str, Any]:
    get_session(session_id)
    types = validate_types_filter(query.types)
    after_seq = None
    if query.page:
        position = decode_cursor(query.page, expect_keys=("s", "o", "sid"))
        if position["sid"] != session_id or position["o"] != query.order:
            raise Invalid("The 'page' cursor belongs to another session or order; start again without it.")
        after_seq = position["s"]
    events, more = list_events(
        session_id,
        after_seq=after_seq,
        order=query.order,
        limit=query.limit,
        types=types,
        processed=query.created_ranges(),
    )
    next_page = encode_cursor({"s": events[-1].seq, "o": query.order, "sid": session_id}) if more else None
    return {"data": [event.as_api() for event in events], "next_page": next_page}


@router.post("/sessions/{session_id}/events", response={200: EventList, **ERRORS}, tags=["events"])
def events_send(request: HttpRequest, session_id: str, body: EventsSend) -> dict[str, Any]:
    sent = session_send_events(session_id, events=body.events, actor=actor_of(request))
    return {"data": [event.as_api() for event in sent]}


def _last_event_id(request: HttpRequest, length: int) -> int | None:
    """The seq a reconnecting stream reads on from (`Last-Event-ID`), None without the header."""
    value = request.headers.get("Last-Event-ID")
    if value is None or not value.strip():
        return None
    try:
        seq = int(value.strip())
    except ValueError:
        seq = None
    if seq is None or not -1 <= seq < length:
        raise Invalid(
            f"'Last-Event-ID' must be the seq of an event this stream sent (an integer from -1 to {length - 1}), "
            f"not {value[:40]!r}; leave it out to read only new events."
        )
    return seq


_SSE = {
    "description": "Server-sent events.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


@router.get(
    "/sessions/{session_id}/events/stream",
    response=ERRORS,
    tags=["events"],
    openapi_extra={"responses": {"200": _SSE}},
)
async def events_stream(
    request: HttpRequest, session_id: str, query: Query[StreamQuery]
) -> StreamingHttpResponse:
    """Server-sent events: each event as it is committed, and with `event_deltas[]` its text as it is written.
    Each event's SSE `id` is its seq; a client that reconnects with `Last-Event-ID: <seq>` first gets every
    event after that seq, so it misses nothing and sees nothing twice."""
    session = await sync_to_async(get_session)(session_id)
    after_seq = _last_event_id(request, session.next_seq)
    response = StreamingHttpResponse(
        sse_tail(
            session_id,
            previews=frozenset(query.event_deltas),
            recheck=credential_recheck(request),
            after_seq=after_seq,
        ),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
