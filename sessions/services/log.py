"""Writes to the session log. `emit_event` is the only way an event enters it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from kernel.api.validation import NOT_TEXT
from kernel.errors import Closed, NotFound
from kernel.ids import new_id
from sessions.broadcast import publish_event
from sessions.models import Event, Session

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


_COLUMNS = "(uid, session_id, seq, type, payload, processed_at, idempotency_key, lease_epoch)"
_LOCK_AND_BUMP = (
    "UPDATE agent_sessions_session SET next_seq = next_seq + %s, updated_at = %s "
    "WHERE id = %s AND deleted_at IS NULL RETURNING next_seq, lease_epoch, archived_at, status"
)
_UNBUMP = "UPDATE agent_sessions_session SET next_seq = next_seq - %s WHERE id = %s RETURNING next_seq"
_SET_STATUS = "UPDATE agent_sessions_session SET status = %s WHERE id = %s RETURNING id"
_USED_KEYS = "SELECT 1 FROM agent_sessions_event WHERE session_id = %s AND idempotency_key IN ({}) LIMIT 1"


# The whole append as one statement, so that alone it is one round trip and its own transaction. The
# UPDATE locks the session row; under READ COMMITTED it re-checks the epoch (and, for a user's events,
# that the session is open) on the row's latest version if it had to wait. A stale epoch, a deleted or
# closed session or (with keys) a key already used leaves `bump` empty, so nothing is written (the
# caller then asks why). A key written by a transaction that committed while this one waited for the
# lock is not in this statement's snapshot: the unique key then refuses the insert, and the caller falls
# back to the statements above, which look again under the lock.
def _append_statement(keyed: bool) -> str:
    # Keys are looked up one by one through the unique (session, key) index (the LIMIT keeps the lookup a
    # nested loop). A plain `key = ANY(keys)`, or a join, was planned from a small table's statistics and
    # kept (psycopg prepares the statement) as a pass over every index entry of the session, so appends
    # slowed as the session grew. Appends without keys skip the lookup.
    used = (
        (
            "used AS (SELECT 1 FROM unnest(%(keys)s::varchar[]) AS k(key), LATERAL (SELECT 1 FROM "
            "agent_sessions_event e WHERE e.session_id = %(session)s::varchar AND e.idempotency_key = k.key "
            "LIMIT 1) AS hit LIMIT 1), "
        )
        if keyed
        else ""
    )
    return (
        f"WITH {used}"
        "bump AS (UPDATE agent_sessions_session SET next_seq = next_seq + %(count)s, updated_at = %(now)s, "
        "status = COALESCE(%(status)s::text, status) WHERE id = %(session)s::varchar AND deleted_at IS NULL "
        f"{'AND NOT EXISTS (SELECT 1 FROM used) ' if keyed else ''}"
        "AND (%(epoch)s::bigint IS NULL OR lease_epoch = %(epoch)s::bigint) "
        "AND (NOT %(open_only)s::boolean OR (archived_at IS NULL AND status <> 'terminated')) RETURNING next_seq), "
        f"inserted AS (INSERT INTO agent_sessions_event {_COLUMNS} "
        "SELECT r.uid, %(session)s, bump.next_seq - %(count)s + r.n - 1, r.type, r.payload, %(now)s, r.key, "
        "%(epoch)s::bigint FROM bump, unnest(%(uids)s::text[], %(types)s::text[], %(payloads)s::jsonb[], "
        "%(event_keys)s::text[]) WITH ORDINALITY AS r(uid, type, payload, key, n) RETURNING id, seq) "
        "SELECT (SELECT next_seq FROM bump), ARRAY(SELECT id FROM inserted ORDER BY seq)"
    )


APPEND, APPEND_KEYED = _append_statement(keyed=False), _append_statement(keyed=True)
_CURRENT_STATE = (
    "SELECT lease_epoch, archived_at, status FROM agent_sessions_session WHERE id = %s AND deleted_at IS NULL"
)


def insert_sql(count: int) -> str:
    rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * count)
    return f"INSERT INTO agent_sessions_event {_COLUMNS} VALUES {rows} RETURNING id"


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
) -> list[Event]:
    """Append several events at consecutive seqs, all or none, with the statements of one append.

    Each item is `(event, idempotency_key)`. Keys are all-or-nothing too: a batch whose keys were used
    returns the events first written with them. `status` sets the session's status with the append
    (status events set their own). With `open_only` (a user's events) an archived or terminated session
    refuses the append (`SessionClosed`, nothing written). `then` runs once new events are committed,
    before subscribers are told (a user's message queues the wake of its brain there: the brain's first
    token is what the user waits for, and telling subscribers competes with it for this process).
    """
    rows = []
    for event, key in items:
        body = storable(event)
        event_type = body.pop("type")
        uid = body.pop("id", None) or new_id("sevt")
        body.pop("processed_at", None)
        rows.append((event_type, uid, body, key))
    db = connections[DEFAULT_DB_ALIAS]
    now = timezone.now()
    how = {
        "session_id": session_id,
        "rows": rows,
        "now": now,
        "epoch": epoch,
        "status": status or _final_status(rows),
        "open_only": open_only,
    }
    try:
        if db.vendor == "postgresql" and not db.in_atomic_block:
            # Alone, an append is its own transaction: run it on psycopg's, skipping Django's bookkeeping.
            db.ensure_connection()
            with db.wrap_database_errors:
                outcome, result = _append_at_once(db, **how)
                if outcome == "look again":
                    with db.connection.transaction():
                        outcome, result = _append(db, **how)
            if outcome == "new":
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
                outcome, result = _append(db, **how)
                if outcome == "new":
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
    if outcome == "missing":
        raise SessionNotFound(session_id)
    if outcome == "stale":
        raise StaleEpoch(session_id, epoch or 0, result)
    if outcome == "closed":
        raise SessionClosed(session_id, result)
    return result


def _append_at_once(
    db: Any, *, session_id: str, rows: Rows, now: Any, epoch: int | None, status: str | None, open_only: bool
) -> tuple[str, Any]:
    """The append as one statement (`APPEND`, or `APPEND_KEYED`) on PostgreSQL, outside any transaction.

    Returns `_append`'s outcomes, or ("look again", None) when a key or id turned out to be taken, for
    `_append` to settle under the lock."""
    keys = [key for *_, key in rows if key is not None]
    cursor = psycopg.Cursor(db.connection)
    try:
        next_seq, ids = cursor.execute(
            APPEND_KEYED if keys else APPEND,
            {
                "session": session_id,
                "count": len(rows),
                "now": now,
                "epoch": epoch,
                "keys": keys,
                "status": status,
                "open_only": open_only,
                "uids": [uid for _, uid, _, _ in rows],
                "types": [kind for kind, *_ in rows],
                "payloads": [Jsonb(body) for _, _, body, _ in rows],
                "event_keys": [key for *_, key in rows],
            },
        ).fetchone()
    except psycopg.errors.UniqueViolation:
        return "look again", None
    if next_seq is not None:
        return "new", _events(db, session_id, rows, next_seq - len(rows), ids, now, epoch)
    current = cursor.execute(_CURRENT_STATE, [session_id]).fetchall()
    if not current:
        return "missing", None
    lease_epoch, archived_at, session_status = current[0]
    if epoch is not None and lease_epoch != epoch:
        return "stale", lease_epoch
    if open_only and (closed := _closed(archived_at, session_status)):
        return "closed", closed
    existing = _first_written(session_id, rows, keys)
    return ("existing", existing) if existing else ("look again", None)


def _append(
    db: Any, *, session_id: str, rows: Rows, now: Any, epoch: int | None, status: str | None, open_only: bool
) -> tuple[str, Any]:
    """The statements of one append, inside the caller's transaction.

    Returns ("new", events), ("existing", the events first written with the keys), ("stale", the current
    epoch), ("closed", "archived" or "terminated") or ("missing", None); a refused append has undone its
    bump.
    """
    fetch = _statements(db)
    count = len(rows)
    bumped = fetch(_LOCK_AND_BUMP, [count, now, session_id])
    if not bumped:
        return "missing", None
    next_seq, lease_epoch, archived_at, session_status = bumped[0]
    if epoch is not None and epoch != lease_epoch:
        fetch(_UNBUMP, [count, session_id])
        return "stale", lease_epoch
    if open_only and (closed := _closed(archived_at, session_status)):
        fetch(_UNBUMP, [count, session_id])
        return "closed", closed
    keys = [key for *_, key in rows if key is not None]
    if keys and fetch(_USED_KEYS.format(", ".join(["%s"] * len(keys))), [session_id, *keys]):
        existing = _first_written(session_id, rows, keys)
        if existing:
            fetch(_UNBUMP, [count, session_id])
            return "existing", existing
    if status:
        fetch(_SET_STATUS, [status, session_id])
    first = next_seq - count
    params: list[Any] = []
    for offset, (kind, uid, body, key) in enumerate(rows):
        payload = Jsonb(body) if db.vendor == "postgresql" else json.dumps(body)
        params += [uid, session_id, first + offset, kind, payload, now, key, epoch]
    ids = fetch(insert_sql(count), params)
    return "new", _events(db, session_id, rows, first, [pk for (pk,) in ids], now, epoch)


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


def _events(
    db: Any, session_id: str, rows: Rows, first: int, ids: list[int], now: Any, epoch: int | None
) -> list[Event]:
    """The appended rows as saved `Event`s, without reading them back."""
    created = []
    for pk, offset, (kind, uid, body, key) in zip(ids, range(len(rows)), rows, strict=True):
        event = Event(
            id=pk,
            uid=uid,
            session_id=session_id,
            seq=first + offset,
            type=kind,
            payload=body,
            processed_at=now,
            idempotency_key=key,
            lease_epoch=epoch,
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
