"""Reads of the session log. Slices are positional and read by keyset on seq, never by OFFSET."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import connection

from sessions import statements
from sessions.models import Event, Session
from sessions.services import SessionNotFound


def get_session(session_id: str) -> Session:
    session = Session.objects.live().filter(id=session_id).first()
    if session is None:
        raise SessionNotFound(session_id)
    return session


def session_length(session_id: str) -> int:
    length = Session.objects.live().filter(id=session_id).values_list("next_seq", flat=True).first()
    if length is None:
        raise SessionNotFound(session_id)
    return length


def get_events(
    session_id: str, start: int | None = None, stop: int | None = None, *, types: Iterable[str] | None = None
) -> list[Event]:
    """The events at positions `[start:stop]` with Python's slice semantics (negatives count from the end).

    Positions are seqs, because seqs have no gaps, so a slice is one range scan of the (session, seq) index.
    Only a negative bound needs the session's length first; the range is then passed as constants, which
    lets the planner use the index however long the session is.
    """
    events = Event.objects.filter(session_id=session_id, session__deleted_at__isnull=True)
    if start is not None and start < 0 and stop is None:
        # The tail, the commonest read: one backward index scan, no length needed.
        found = list(events.order_by("-seq")[:-start])[::-1]
        if not found:
            session_length(session_id)
        wanted = None if types is None else set(types)
        return found if wanted is None else [event for event in found if event.type in wanted]
    if (start is not None and start < 0) or (stop is not None and stop < 0):
        length = session_length(session_id)
        start = None if start is None else (start if start >= 0 else length + start)
        stop = None if stop is None else (stop if stop >= 0 else length + stop)
    if start is not None:
        events = events.filter(seq__gte=start)
    if stop is not None:
        events = events.filter(seq__lt=stop)
    if types is not None:
        events = events.filter(type__in=list(types))
    found = list(events.order_by("seq"))
    if not found:
        session_length(session_id)  # an unknown session raises rather than looking empty
    return found


def events_after(session_id: str, after_seq: int, *, limit: int | None) -> list[Event]:
    """Up to `limit` (None: all) events with seq greater than `after_seq`, in order: how live readers catch
    up, and what a brain reads when it wakes (written out: `statements.EVENTS_AFTER`)."""
    limited = "" if limit is None else " LIMIT %s"
    return list(
        Event.objects.raw(
            f"{statements.EVENTS_AFTER}{limited}",
            [session_id, after_seq] if limit is None else [session_id, after_seq, limit],
        )
    )


def interrupted_sessions(floors: list[tuple[str, int]]) -> set[str]:
    """Which of these `(session, seq)` got a user.interrupt after that seq (one statement for them all)."""
    with connection.cursor() as cursor:
        cursor.execute(statements.interrupted(len(floors)), [value for floor in floors for value in floor])
        return {row[0] for row in cursor.fetchall()}


def list_events(
    session_id: str,
    *,
    after_seq: int | None,
    order: str,
    limit: int,
    types: list[str] | None,
    processed: dict[str, datetime],
) -> tuple[list[Event], bool]:
    """One page of the API's event list and whether more follow; `after_seq` is the cursor (exclusive)."""
    events = Event.objects.filter(session_id=session_id)
    if after_seq is not None:
        events = events.filter(seq__gt=after_seq) if order == "asc" else events.filter(seq__lt=after_seq)
    if types:
        events = events.filter(type__in=types)
    if processed:
        events = events.filter(**{f"processed_at__{op}": value for op, value in processed.items()})
    page = list(events.order_by("seq" if order == "asc" else "-seq")[: limit + 1])
    return page[:limit], len(page) > limit
