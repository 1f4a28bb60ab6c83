"""The lease's writes on the session row: take it (with the log after a seq), renew it, release it.

What a lease means to a brain is `harness.lease`'s; here are only the row's statements. Taking it bumps the
epoch that every append of its brain carries, so a brain whose lease was taken over is refused.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS, connection
from django.utils import timezone

from sessions import statements
from sessions.models import Event
from sessions.selectors import events_after


class Taken(NamedTuple):
    epoch: int
    attempts: int  # wakes in a row that took the lease without a clean release, this one included
    step_attempts: int  # of those, the ones in a row on the same step (each died with no progress)
    agent: dict[str, Any]
    environment: dict[str, Any]
    events: list[Event]  # with `read_after`: the log after that seq, in order, as of taking the lease


def session_lease_take(
    session_id: str, *, owner: str, seconds: float, read_after: int | None = None
) -> Taken | None:
    """The lease, if the session is open (`Session.objects.open()`) and its lease free or lapsed; else None.
    With `read_after`, it brings the log's events after that seq."""
    now = timezone.now()
    params: list[Any] = [owner, now + timedelta(seconds=seconds), session_id, now]
    with connection.cursor() as cursor:
        if read_after is not None and connection.vendor == "postgresql":
            cursor.execute(statements.LEASE_TAKE_AND_READ, [*params, read_after])
            rows = cursor.fetchall()
            if not rows:
                return None
            events = _events([row[5:] for row in rows if row[5] is not None])
        else:
            cursor.execute(statements.LEASE_TAKE, params)
            rows = cursor.fetchall()
            if not rows:
                return None
            events = [] if read_after is None else events_after(session_id, read_after, limit=None)
    epoch, attempts, step_attempts, agent, environment = rows[0][:5]
    return Taken(epoch, attempts, step_attempts, _json(agent), _json(environment) or {}, events)


def session_lease_renew(session_id: str, epoch: int, *, seconds: float) -> bool:
    """Push the lease's expiry on; False if another brain holds the session now."""
    with connection.cursor() as cursor:
        cursor.execute(
            statements.LEASE_RENEW, [timezone.now() + timedelta(seconds=seconds), session_id, epoch]
        )
        return cursor.rowcount == 1


def session_lease_release(session_id: str, epoch: int, *, clean: bool) -> bool:
    """Free the lease; a clean release (the brain reached idle) also resets the crash counters."""
    with connection.cursor() as cursor:
        cursor.execute(statements.LEASE_RELEASE, {"clean": clean, "session": session_id, "epoch": epoch})
        return cursor.rowcount == 1


def session_leases_abandon(owner: str) -> list[str]:
    """Free every lease `owner` holds, as a crash (the crash counters stay); the sessions it held."""
    with connection.cursor() as cursor:
        cursor.execute(statements.LEASE_ABANDON, [owner])
        return [row[0] for row in cursor.fetchall()]


def session_lease_owners() -> list[str]:
    """The owners holding a lease."""
    with connection.cursor() as cursor:
        cursor.execute(statements.LEASE_OWNERS)
        return [row[0] for row in cursor.fetchall()]


_PAYLOAD = statements.LEASE_EVENT_FIELDS.index("payload")


def _events(rows: list[tuple[Any, ...]]) -> list[Event]:
    return [
        Event.from_db(
            DEFAULT_DB_ALIAS,
            statements.LEASE_EVENT_FIELDS,
            (*row[:_PAYLOAD], _json(row[_PAYLOAD]), *row[_PAYLOAD + 1 :]),
        )
        for row in rows
    ]


def _json(value: Any) -> Any:
    """A JSON column from a raw cursor: text on SQLite, and on PostgreSQL as Django's psycopg setup loads it."""
    return json.loads(value) if isinstance(value, str | bytes) else value
