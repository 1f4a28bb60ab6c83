"""/v1/sessions and /v1/sessions/{id}/events (list, send, and the SSE live tail)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, StreamingHttpResponse

from harness.services.fork import session_fork
from harness.services.lifecycle import (
    session_archive,
    session_create,
    session_delete,
    session_send_events,
    session_update,
)
from kernel.api.endpoint import async_endpoint, endpoint
from kernel.api.pagination import decode_cursor, encode_cursor, keyset_page
from kernel.api.validation import (
    no_unknown_fields,
    query_bool,
    query_choice,
    query_datetime_ranges,
    query_int,
    text,
)
from kernel.errors import Invalid
from sessions.event_types import validate_types_filter
from sessions.models import Session
from sessions.selectors import get_session, list_events
from sessions.serializers import session_json
from sessions.stream import sse_tail

STATUSES = tuple(Session.Status.values)


def sessions_create(request: HttpRequest) -> dict[str, Any]:
    return session_json(session_create(request.json))  # type: ignore[attr-defined]


def sessions_list(request: HttpRequest) -> dict[str, Any]:
    params = request.GET
    limit = query_int(params, "limit", default=20, minimum=1, maximum=1000)
    order = query_choice(params, "order", ("asc", "desc"), default="desc")
    sessions = Session.objects.filter(deleted_at__isnull=True)
    if not query_bool(params, "include_archived"):
        sessions = sessions.filter(archived_at__isnull=True)
    if params.get("agent_id"):
        sessions = sessions.filter(agent_id=params["agent_id"])
    if params.get("agent_version"):
        sessions = sessions.filter(
            agent_version=query_int(params, "agent_version", default=1, minimum=1, maximum=10**9)
        )
    statuses = params.getlist("statuses[]")
    for status in statuses:
        if status not in STATUSES:
            raise Invalid(
                f"Query parameter 'statuses[]' must be among {', '.join(STATUSES)}, not {status!r}."
            )
    if statuses:
        sessions = sessions.filter(status__in=statuses)
    for op, value in query_datetime_ranges(params, "created_at").items():
        sessions = sessions.filter(**{f"created_at__{op}": value})
    page = keyset_page(sessions, params, order=order, limit=limit, bidirectional=True)
    return {
        "data": [session_json(s) for s in page["rows"]],
        "next_page": page["next_page"],
        "prev_page": page["prev_page"],
    }


def sessions_retrieve(request: HttpRequest, session_id: str) -> dict[str, Any]:
    return session_json(get_session(session_id))


def sessions_update(request: HttpRequest, session_id: str) -> dict[str, Any]:
    return session_json(session_update(session_id, request.json))  # type: ignore[attr-defined]


def sessions_delete(request: HttpRequest, session_id: str) -> dict[str, Any]:
    return session_delete(session_id)


def sessions_archive(request: HttpRequest, session_id: str) -> dict[str, Any]:
    return session_json(session_archive(session_id))


def sessions_fork(request: HttpRequest, session_id: str) -> dict[str, Any]:
    """Workbench's own: `{"at_seq": N, "harness"?, "title"?}` forks the session from event N."""
    body = request.json  # type: ignore[attr-defined]
    no_unknown_fields(body, ("at_seq", "harness", "title"), "fork")
    if "at_seq" not in body:
        raise Invalid("'at_seq' is required: the fork copies events [0:at_seq].")
    return session_json(
        session_fork(
            session_id,
            at_seq=body["at_seq"],
            harness=body.get("harness"),
            title=text(body, "title", nullable=True, max_length=500, default=None),
        )
    )


def events_list(request: HttpRequest, session_id: str) -> dict[str, Any]:
    params = request.GET
    get_session(session_id)
    limit = query_int(params, "limit", default=100, minimum=1, maximum=1000)
    order = query_choice(params, "order", ("asc", "desc"), default="asc")
    types = validate_types_filter(params.getlist("types[]"))
    after_seq = None
    if params.get("page"):
        position = decode_cursor(params["page"], expect_keys=("s", "o", "sid"))
        if position["sid"] != session_id or position["o"] != order:
            raise Invalid("The 'page' cursor belongs to another session or order; start again without it.")
        after_seq = position["s"]
    events, more = list_events(
        session_id,
        after_seq=after_seq,
        order=order,
        limit=limit,
        types=types,
        processed=query_datetime_ranges(params, "created_at"),
    )
    next_page = encode_cursor({"s": events[-1].seq, "o": order, "sid": session_id}) if more else None
    return {"data": [event.as_api() for event in events], "next_page": next_page}


def events_send(request: HttpRequest, session_id: str) -> dict[str, Any]:
    created = session_send_events(session_id, request.json)  # type: ignore[attr-defined]
    return {"data": [event.as_api() for event in created]}


async def events_stream(request: HttpRequest, session_id: str) -> StreamingHttpResponse:
    await sync_to_async(get_session)(session_id)
    wanted = request.GET.getlist("event_deltas[]")
    for kind in wanted:
        if kind not in ("agent.message", "agent.thinking"):
            raise Invalid(f"'event_deltas[]' must be agent.message or agent.thinking, not {kind!r}.")
    response = StreamingHttpResponse(
        sse_tail(session_id, previews=frozenset(wanted)), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


collection = endpoint(GET=sessions_list, POST=sessions_create)
item = endpoint(GET=sessions_retrieve, POST=sessions_update, DELETE=sessions_delete)
archive = endpoint(POST=sessions_archive)
fork = endpoint(POST=sessions_fork)
events = endpoint(GET=events_list, POST=events_send)
stream = async_endpoint(GET=events_stream)
