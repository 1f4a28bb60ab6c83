"""The lease that lets exactly one brain write a session: an epoch bumped in the database, with an expiry.

A brain takes the lease only when it is free or expired, renews it while it works, and releases it at
idle. Every append carries the epoch, so a brain whose lease was taken over is refused on its next write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone


@dataclass(frozen=True)
class Lease:
    session_id: str
    epoch: int
    owner: str
    attempts: int  # wakes in a row that took the lease without a clean release, this one included
    # What a brain starts from, read by the same statement: the session's agent, its environment's config.
    agent: dict[str, Any]
    environment: dict[str, Any]


def lease_acquire(session_id: str, *, owner: str, seconds: float) -> Lease | None:
    """The lease, if the session is free (or its lease lapsed) and can still work: not deleted, archived
    or terminated."""
    from sandboxes.models import Environment

    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agent_sessions_session SET lease_epoch = lease_epoch + 1, lease_owner = %s, "
            "lease_expires_at = %s, wake_attempts = wake_attempts + 1 "
            "WHERE id = %s AND deleted_at IS NULL AND archived_at IS NULL AND status <> 'terminated' "
            "AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
            f"RETURNING lease_epoch, wake_attempts, agent_snapshot, "
            f"(SELECT config FROM {Environment._meta.db_table} e WHERE e.id = agent_sessions_session.environment_id)",
            [owner, now + timedelta(seconds=seconds), session_id, now],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Lease(session_id, row[0], owner, row[1], agent=_json(row[2]), environment=_json(row[3]) or {})


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
