"""Writes to the session log. `emit_event` is the only way an event enters it."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from sessions.broadcast import publish_event
from sessions.models import Event, Session
from workbench.ids import new_id

# Status events set the session's status in the same statement that appends them.
STATUS_BY_EVENT_TYPE = {
    "session.status_running": Session.Status.RUNNING,
    "session.status_idle": Session.Status.IDLE,
    "session.status_rescheduled": Session.Status.RESCHEDULING,
    "session.status_terminated": Session.Status.TERMINATED,
}


class SessionNotFound(LookupError):
    def __init__(self, session_id: str):
        super().__init__(f"No session with id {session_id!r}.")
        self.session_id = session_id


class StaleEpoch(Exception):
    """The writer's lease was taken over by another brain; the writer must stop."""

    def __init__(self, session_id: str, epoch: int, current: int):
        super().__init__(f"Session {session_id} is leased at epoch {current}; a write at epoch {epoch} is refused.")
        self.session_id, self.epoch, self.current = session_id, epoch, current


class _AlreadyEmitted(Exception):
    def __init__(self, event: Event):
        self.event = event


_INSERT = (
    "INSERT INTO agent_sessions_event (uid, session_id, seq, type, payload, processed_at, idempotency_key, "
    "lease_epoch) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id"
)
_LOCK_AND_BUMP = (
    "UPDATE agent_sessions_session SET next_seq = next_seq + 1, updated_at = %s, status = COALESCE(%s, status) "
    "WHERE id = %s AND deleted_at IS NULL RETURNING next_seq, lease_epoch"
)


def emit_event(
    session_id: str, event: dict[str, Any], *, idempotency_key: str | None = None, epoch: int | None = None
) -> Event:
    """Append `event` at the session's next seq, in one transaction under the session row's lock.

    The same idempotency key returns the event first written with it. With `epoch`, the append is refused
    (`StaleEpoch`, nothing written) unless it is the session's current lease epoch. Subscribers are told
    after the commit.
    """
    body = dict(event)
    event_type = body.pop("type")
    uid = body.pop("id", None) or new_id("sevt")
    body.pop("processed_at", None)
    now = timezone.now()
    try:
        with transaction.atomic():
            row = _fetch_one(_LOCK_AND_BUMP, [now, STATUS_BY_EVENT_TYPE.get(event_type), session_id])
            if row is None:
                raise SessionNotFound(session_id)
            next_seq, lease_epoch = row
            if epoch is not None and epoch != lease_epoch:
                raise StaleEpoch(session_id, epoch, lease_epoch)
            if idempotency_key is not None:
                existing = Event.objects.filter(session_id=session_id, idempotency_key=idempotency_key).first()
                if existing is not None:
                    raise _AlreadyEmitted(existing)
            seq = next_seq - 1
            (pk,) = _fetch_one(_INSERT, [uid, session_id, seq, event_type, _json(body), now, idempotency_key, epoch])
            created = Event(id=pk, uid=uid, session_id=session_id, seq=seq, type=event_type, payload=body,
                            processed_at=now, idempotency_key=idempotency_key, lease_epoch=epoch)
            created._state.adding = False
            created._state.db = connection.alias
            transaction.on_commit(partial(publish_event, created))
    except _AlreadyEmitted as already:
        return already.event
    except IntegrityError:
        # Only a caller-chosen id can collide here (seq and the key are decided under the lock).
        if "id" in event and Event.objects.filter(uid=uid).exists():
            raise ValueError(f"An event with id {uid!r} already exists.") from None
        raise
    return created


def _fetch_one(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """One row of a statement run on the transaction's connection.

    On PostgreSQL the statement goes straight to psycopg with server-side binding and a prepared plan:
    appends are the hottest path in the system, and Django's client-side quoting costs as much as the work.
    """
    if connection.vendor == "postgresql":
        connection.ensure_connection()
        return connection.connection.execute(sql, params, prepare=True).fetchone()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _json(payload: dict[str, Any]) -> Any:
    return Jsonb(payload) if connection.vendor == "postgresql" else json.dumps(payload)
