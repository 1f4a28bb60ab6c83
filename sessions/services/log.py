"""Writes to the session log. `emit_event` is the only way an event enters it."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
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


_INSERT = (
    "INSERT INTO agent_sessions_event (uid, session_id, seq, type, payload, processed_at, idempotency_key, "
    "lease_epoch) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id"
)
_UNBUMP = "UPDATE agent_sessions_session SET next_seq = next_seq - 1 WHERE id = %s RETURNING next_seq"
_LOCK_AND_BUMP = (
    "UPDATE agent_sessions_session SET next_seq = next_seq + 1, updated_at = %s "
    "WHERE id = %s AND deleted_at IS NULL RETURNING next_seq, lease_epoch"
)
_SET_STATUS = "UPDATE agent_sessions_session SET status = %s WHERE id = %s RETURNING id"


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
    db = connections[DEFAULT_DB_ALIAS]
    row = (db, session_id, event_type, uid, body, timezone.now(), idempotency_key, epoch)
    try:
        if db.vendor == "postgresql" and not db.in_atomic_block:
            # Alone, an append is its own transaction: run it on psycopg's, skipping Django's bookkeeping.
            db.ensure_connection()
            with db.wrap_database_errors, db.connection.transaction():
                outcome, created = _append(*row)
            if outcome == "new":
                publish_event(created)
        else:
            # Inside a caller's transaction no savepoint is taken: an append that is refused undoes its own
            # bump and raises only once its block is left, so the caller's transaction stays usable.
            with transaction.atomic(savepoint=False):
                outcome, created = _append(*row)
                if outcome == "new":
                    transaction.on_commit(partial(publish_event, created))
    except IntegrityError:
        # Only a caller-chosen id can collide here (seq and the key are decided under the lock).
        if "id" in event and not db.in_atomic_block and Event.objects.filter(uid=uid).exists():
            raise ValueError(f"An event with id {uid!r} already exists.") from None
        raise
    if outcome == "missing":
        raise SessionNotFound(session_id)
    if outcome == "stale":
        raise StaleEpoch(session_id, epoch or 0, created)
    return created


def _append(
    db: Any, session_id: str, event_type: str, uid: str, body: dict[str, Any], now: Any,
    idempotency_key: str | None, epoch: int | None,
) -> tuple[str, Any]:
    """The statements of one append, inside the caller's transaction.

    Returns ("new", event), ("existing", the event first written with the key), ("stale", the current
    epoch) or ("missing", None); a refused append has undone its bump.
    """
    fetch_one = _statements(db)
    row = fetch_one(_LOCK_AND_BUMP, [now, session_id])
    if row is None:
        return "missing", None
    next_seq, lease_epoch = row
    if epoch is not None and epoch != lease_epoch:
        fetch_one(_UNBUMP, [session_id])
        return "stale", lease_epoch
    if idempotency_key is not None:
        existing = Event.objects.filter(session_id=session_id, idempotency_key=idempotency_key).first()
        if existing is not None:
            fetch_one(_UNBUMP, [session_id])
            return "existing", existing
    status = STATUS_BY_EVENT_TYPE.get(event_type)
    if status is not None:
        fetch_one(_SET_STATUS, [status, session_id])
    seq = next_seq - 1
    payload = Jsonb(body) if db.vendor == "postgresql" else json.dumps(body)
    (pk,) = fetch_one(_INSERT, [uid, session_id, seq, event_type, payload, now, idempotency_key, epoch])
    created = Event(id=pk, uid=uid, session_id=session_id, seq=seq, type=event_type, payload=body,
                    processed_at=now, idempotency_key=idempotency_key, lease_epoch=epoch)
    created._state.adding = False
    created._state.db = db.alias
    return "new", created


def _statements(db: Any) -> Any:
    """A `fetch_one(sql, params)` on the transaction's connection.

    On PostgreSQL it runs straight on psycopg, binding on the server with prepared plans: appends are the
    hottest path in the system, and Django's client-side quoting costs as much as the work.
    """
    if db.vendor == "postgresql":
        cursor = psycopg.Cursor(db.connection)
        return lambda sql, params: cursor.execute(sql, params).fetchone()

    def fetch_one(sql: str, params: list[Any]) -> Any:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()

    return fetch_one
