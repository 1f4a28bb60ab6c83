"""Writes to the session log. `emit_event` is the only way an event enters it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from kernel.api.validation import NOT_TEXT
from kernel.errors import Closed, NotFound
from kernel.ids import new_id
from sessions import statements
from sessions.broadcast import publish_event
from sessions.models import Event, Session
from sessions.statements import APPEND, APPEND_KEYED

# Status events set the session's status in the transaction that appends them.
STATUS_BY_EVENT_TYPE = {
    "session.status_running": Session.Status.RUNNING,
    "session.status_idle": Session.Status.IDLE,
    "session.status_rescheduled": Session.Status.RESCHEDULING,
    "session.status_terminated": Session.Status.TERMINATED,
}


class SessionNotFound(NotFound):
    def __init__(self, session_id: str):
        super().__init__("session", session_id)
        self.session_id = session_id


class SessionClosed(Closed):
    """The session is archived or terminated: it takes no more events from users."""

    def __init__(self, session_id: str, state: str):
        super().__init__(f"Session {session_id} is {state}; it takes no more events.")
        self.session_id, self.state = session_id, state


class StaleEpoch(Exception):
    """The writer's lease was taken over by another brain; the writer must stop."""

    def __init__(self, session_id: str, epoch: int, current: int):
        super().__init__(
            f"Session {session_id} is leased at epoch {current}; a write at epoch {epoch} is refused."
        )
        self.session_id, self.epoch, self.current = session_id, epoch, current


class Appended(StrEnum):
    """How an append ended (the refused ones carry why)."""

    NEW = "new"
    EXISTING = "existing"  # its keys were used: the events first written with them
    STALE = "stale"  # the epoch is not the lease's: the current epoch
    CLOSED = "closed"  # a user's events to an archived or terminated session: which
    MISSING = "missing"
    LOOK_AGAIN = "look again"  # the one statement found a key or id taken: settle it under the lock


def storable(value: Any) -> Any:
    """`value` (a JSON-shaped event) with each NUL and unpaired surrogate in its strings, keys included,
    spelled out as the six characters of its JSON escape: U+0000 becomes the text `\\u0000`, U+D800 `\\ud800`.

    PostgreSQL refuses U+0000 in jsonb, and an unpaired surrogate cannot be encoded as UTF-8 (for the model's
    request, or the database), so an event holding one would fail every wake that writes or reads it. Users'
    text holding them is refused at the /v1 edge; what the platform itself writes (the model's output, tool
    results, errors) is kept, visibly escaped rather than dropped, so a reader sees what was there. A tool call
    runs with its stored input, escapes included.
    """
    if isinstance(value, str):
        # Most text is ASCII, which only a NUL can spoil: two scans in C, much faster than the pattern.
        if value.isascii() and "\x00" not in value:
            return value
        return NOT_TEXT.sub(_escape, value)
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [storable(item) for item in value]
    return value


def _escape(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


Item = tuple[dict[str, Any], str | None]
Rows = list[tuple[str, str, dict[str, Any], str | None]]  # (type, uid, payload, key) of each event


@dataclass(frozen=True)
class _Append:
    """One append, as its statements take it."""

    session_id: str
    rows: Rows
    now: datetime
    epoch: int | None
    status: str | None
    open_only: bool
    actor: str = ""

    @property
    def keys(self) -> list[str]:
        return [key for *_, key in self.rows if key is not None]


def emit_event(
    session_id: str, event: dict[str, Any], *, idempotency_key: str | None = None, epoch: int | None = None
) -> Event:
    """Append `event` at the session's next seq, in one transaction under the session row's lock.

    The same idempotency key returns the event first written with it. With `epoch`, the append is refused
    (`StaleEpoch`, nothing written) unless it is the session's current lease epoch. Subscribers are told
    after the commit.
    """
    return emit_events(session_id, [(event, idempotency_key)], epoch=epoch)[0]


def emit_events(
    session_id: str,
    items: list[Item],
    *,
    epoch: int | None = None,
    status: str | None = None,
    open_only: bool = False,
    then: Callable[[], None] | None = None,
    actor: str = "",
) -> list[Event]:
    """Append several events at consecutive seqs, all or none, with the statements of one append.

    Each item is `(event, idempotency_key)`. Keys are all-or-nothing too: a batch whose keys were used
    returns the events first written with them. `status` sets the session's status with the append
    (status events set their own). With `open_only` (a user's events) an archived or terminated session
    refuses the append (`SessionClosed`, nothing written). `then` runs once new events are committed,
    before subscribers are told (a user's message queues the wake of its brain there: the brain's first
    token is what the user waits for, and telling subscribers competes with it for this process). `actor`
    is who sent the events, for a person's or a key's.
    """
    rows = []
    for event, key in items:
        body = storable(event)
        event_type = body.pop("type")
        uid = body.pop("id", None) or new_id("sevt")
        body.pop("processed_at", None)
        rows.append((event_type, uid, body, key))
    db = connections[DEFAULT_DB_ALIAS]
    append = _Append(session_id, rows, timezone.now(), epoch, status or _final_status(rows), open_only, actor)
    try:
        if db.vendor == "postgresql" and not db.in_atomic_block:
            # Alone, an append is its own transaction: run it on psycopg's, skipping Django's bookkeeping.
            db.ensure_connection()
            with db.wrap_database_errors:
                outcome, result = _append_at_once(db, append)
                if outcome is Appended.LOOK_AGAIN:
                    with db.connection.transaction():
                        outcome, result = _append(db, append)
            if outcome is Appended.NEW:
                try:
                    if then is not None:
                        then()
                finally:
                    for created in result:
                        publish_event(created)
        else:
            # Inside a caller's transaction no savepoint is taken: an append that is refused undoes its own
            # bump and raises only once its block is left, so the caller's transaction stays usable.
            with transaction.atomic(savepoint=False):
                outcome, result = _append(db, append)
                if outcome is Appended.NEW:
                    if then is not None:
                        transaction.on_commit(then)
                    for created in result:
                        transaction.on_commit(partial(publish_event, created))
    except IntegrityError:
        # Only a caller-chosen id can collide here (seqs and keys are decided under the lock).
        chosen = [event["id"] for event, _ in items if "id" in event]
        if chosen and not db.in_atomic_block and Event.objects.filter(uid__in=chosen).exists():
            raise ValueError(f"An event with one of the ids {chosen} already exists.") from None
        raise
    if outcome is Appended.MISSING:
        raise SessionNotFound(session_id)
    if outcome is Appended.STALE:
        raise StaleEpoch(session_id, epoch or 0, result)
    if outcome is Appended.CLOSED:
        raise SessionClosed(session_id, result)
    return result


def _append_at_once(db: Any, append: _Append) -> tuple[Appended, Any]:
    """The append as one statement (`APPEND`, or `APPEND_KEYED`) on PostgreSQL, outside any transaction.

    Returns `_append`'s outcomes, or LOOK_AGAIN when a key or id turned out to be taken, for `_append` to
    settle under the lock."""
    rows, keys = append.rows, append.keys
    cursor = psycopg.Cursor(db.connection)
    try:
        [(next_seq, ids)] = cursor.execute(
            APPEND_KEYED if keys else APPEND,
            {
                "session": append.session_id,
                "count": len(rows),
                "now": append.now,
                "epoch": append.epoch,
                "keys": keys,
                "status": append.status,
                "open_only": append.open_only,
                "uids": [uid for _, uid, _, _ in rows],
                "types": [kind for kind, *_ in rows],
                "payloads": [Jsonb(body) for _, _, body, _ in rows],
                "event_keys": [key for *_, key in rows],
                "actor": append.actor,
            },
        ).fetchall()
    except psycopg.errors.UniqueViolation:
        return Appended.LOOK_AGAIN, None
    if next_seq is not None:
        return Appended.NEW, _events(db, append, next_seq - len(rows), ids)
    current = cursor.execute(statements.CURRENT_STATE, [append.session_id]).fetchall()
    if not current:
        return Appended.MISSING, None
    lease_epoch, archived_at, session_status = current[0]
    if append.epoch is not None and lease_epoch != append.epoch:
        return Appended.STALE, lease_epoch
    if append.open_only and (closed := _closed(archived_at, session_status)):
        return Appended.CLOSED, closed
    existing = _first_written(append.session_id, rows, keys)
    return (Appended.EXISTING, existing) if existing else (Appended.LOOK_AGAIN, None)


def _append(db: Any, append: _Append) -> tuple[Appended, Any]:
    """The statements of one append, inside the caller's transaction.

    Returns NEW and the events, EXISTING and the events first written with the keys, STALE and the current
    epoch, CLOSED and "archived" or "terminated", or MISSING; a refused append has undone its bump.
    """
    fetch = _statements(db)
    session_id, rows, count = append.session_id, append.rows, len(append.rows)
    bumped = fetch(statements.LOCK_AND_BUMP, [count, append.now, session_id])
    if not bumped:
        return Appended.MISSING, None
    next_seq, lease_epoch, archived_at, session_status = bumped[0]
    if append.epoch is not None and append.epoch != lease_epoch:
        fetch(statements.UNBUMP, [count, session_id])
        return Appended.STALE, lease_epoch
    if append.open_only and (closed := _closed(archived_at, session_status)):
        fetch(statements.UNBUMP, [count, session_id])
        return Appended.CLOSED, closed
    keys = append.keys
    if keys and fetch(statements.used_keys(len(keys)), [session_id, *keys]):
        existing = _first_written(session_id, rows, keys)
        if existing:
            fetch(statements.UNBUMP, [count, session_id])
            return Appended.EXISTING, existing
    if append.status:
        fetch(statements.SET_STATUS, [append.status, session_id])
    first = next_seq - count
    params: list[Any] = []
    for offset, (kind, uid, body, key) in enumerate(rows):
        payload = Jsonb(body) if db.vendor == "postgresql" else json.dumps(body)
        params += [
            uid,
            session_id,
            first + offset,
            kind,
            payload,
            append.now,
            key,
            append.epoch,
            append.actor,
        ]
    ids = fetch(statements.insert(count), params)
    return Appended.NEW, _events(db, append, first, [pk for (pk,) in ids])


def _first_written(session_id: str, rows: Rows, keys: list[str]) -> list[Event]:
    """The events first written with these rows' keys, in the rows' order (none if no key was used)."""
    existing = {
        e.idempotency_key: e for e in Event.objects.filter(session_id=session_id, idempotency_key__in=keys)
    }
    return [existing[key] for *_, key in rows if key in existing]


def _closed(archived_at: Any, status: str) -> str | None:
    """Why a session takes no more events from users, if it does not."""
    # (Not `archived_at IS NOT NULL` in SQL: SQLite 3.40 answered it wrong in an UPDATE's RETURNING.)
    return (
        "archived"
        if archived_at is not None
        else "terminated"
        if status == Session.Status.TERMINATED
        else None
    )


def _final_status(rows: Rows) -> str | None:
    """The status the last status event among the rows sets, if any does."""
    statuses = [STATUS_BY_EVENT_TYPE[kind] for kind, *_ in rows if kind in STATUS_BY_EVENT_TYPE]
    return statuses[-1] if statuses else None


def _events(db: Any, append: _Append, first: int, ids: list[int]) -> list[Event]:
    """The appended rows as saved `Event`s, without reading them back."""
    created = []
    for pk, offset, (kind, uid, body, key) in zip(ids, range(len(append.rows)), append.rows, strict=True):
        event = Event(
            id=pk,
            uid=uid,
            session_id=append.session_id,
            seq=first + offset,
            type=kind,
            payload=body,
            processed_at=append.now,
            idempotency_key=key,
            lease_epoch=append.epoch,
            actor=append.actor,
        )
        event._state.adding = False
        event._state.db = db.alias
        created.append(event)
    return created


def _statements(db: Any) -> Any:
    """A `fetch(sql, params) -> rows` on the transaction's connection.

    On PostgreSQL it runs straight on psycopg, binding on the server with prepared plans: appends are the
    hottest path in the system, and Django's client-side quoting costs as much as the work.
    """
    if db.vendor == "postgresql":
        cursor = psycopg.Cursor(db.connection)
        return lambda sql, params: cursor.execute(sql, params).fetchall()

    def fetch(sql: str, params: list[Any]) -> Any:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    return fetch
