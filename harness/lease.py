"""The lease that lets exactly one brain write a session: an epoch bumped in the database, with an expiry.

A brain takes the lease only when it is free or expired, renews it while it works, and releases it at
idle. Every append carries the epoch, so a brain whose lease was taken over is refused on its next write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connection
from django.utils import timezone

from sandboxes.models import Environment
from sessions.models import Event
from sessions.selectors import events_after

if TYPE_CHECKING:
    from sessions.models import Event


@dataclass(frozen=True)
class Lease:
    session_id: str
    epoch: int
    owner: str
    attempts: int  # wakes in a row that took the lease without a clean release, this one included
    # What a brain starts from, read by the same statement: the session's agent, its environment's config.
    agent: dict[str, Any]
    environment: dict[str, Any]
    # With `read_after`: the log's events after that seq, in order, as of taking the lease.
    events: list[Event] = field(default_factory=list)


def _take(returning: str) -> str:
    return (
        "UPDATE agent_sessions_session SET lease_epoch = lease_epoch + 1, lease_owner = %s, "
        "lease_expires_at = %s, wake_attempts = wake_attempts + 1, wake_queued_at = NULL "
        "WHERE id = %s AND deleted_at IS NULL AND archived_at IS NULL AND status <> 'terminated' "
        "AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
        f"RETURNING {returning}lease_epoch, wake_attempts, agent_snapshot, (SELECT config FROM "
        f"{Environment._meta.db_table} e WHERE e.id = agent_sessions_session.environment_id) AS environment"
    )


def _take_and_read(columns: list[str]) -> str:
    """PostgreSQL: the lease and the log's `columns` after a seq in one statement (one round trip on a wake's
    way to its first model call). The read sees the log as the statement began."""
    selected = ", ".join(f"ev.{name}" for name in columns)
    return (
        f"WITH lease AS ({_take('id, ')}) SELECT lease.lease_epoch, lease.wake_attempts, lease.agent_snapshot, "
        f"lease.environment, {selected} FROM lease LEFT JOIN {Event._meta.db_table} ev "
        "ON ev.session_id = lease.id AND ev.seq > %s ORDER BY ev.seq"
    )


def _event_columns() -> list[str]:
    return [column.attname for column in Event._meta.concrete_fields]


def lease_acquire(
    session_id: str, *, owner: str, seconds: float, read_after: int | None = None
) -> Lease | None:
    """The lease, if the session is free (or its lease lapsed) and can still work: not deleted, archived
    or terminated. With `read_after`, it brings the log's events after that seq (`Lease.events`)."""
    now = timezone.now()
    params = [owner, now + timedelta(seconds=seconds), session_id, now]
    with connection.cursor() as cursor:
        if read_after is not None and connection.vendor == "postgresql":
            columns = _event_columns()
            cursor.execute(_take_and_read(columns), [*params, read_after])
            rows = cursor.fetchall()
            if not rows:
                return None
            events = _events(columns, [row[4:] for row in rows if row[4] is not None])
        else:
            cursor.execute(_take(""), params)
            rows = cursor.fetchall()
            if not rows:
                return None
            events = [] if read_after is None else events_after(session_id, read_after, limit=None)
    epoch, attempts, agent, environment = rows[0][:4]
    return Lease(
        session_id,
        epoch,
        owner,
        attempts,
        agent=_json(agent),
        environment=_json(environment) or {},
        events=events,
    )


def _events(columns: list[str], rows: list[tuple[Any, ...]]) -> list[Event]:
    payload = columns.index("payload")
    return [
        Event.from_db(DEFAULT_DB_ALIAS, columns, (*row[:payload], _json(row[payload]), *row[payload + 1 :]))
        for row in rows
    ]


def _json(value: Any) -> Any:
    """A JSON column from a raw cursor: text on SQLite, and on PostgreSQL as Django's psycopg setup loads it."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def lease_renew(lease: Lease, *, seconds: float) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agent_sessions_session SET lease_expires_at = %s WHERE id = %s AND lease_epoch = %s",
            [timezone.now() + timedelta(seconds=seconds), lease.session_id, lease.epoch],
        )
        return cursor.rowcount == 1


def lease_release(lease: Lease, *, clean: bool = True) -> bool:
    """Free the lease; a clean release (the brain reached idle) also resets the crash counter."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agent_sessions_session SET lease_expires_at = NULL, lease_owner = '', "
            "wake_attempts = CASE WHEN %s THEN 0 ELSE wake_attempts END WHERE id = %s AND lease_epoch = %s",
            [clean, lease.session_id, lease.epoch],
        )
        return cursor.rowcount == 1
