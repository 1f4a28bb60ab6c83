"""The raw SQL on the sessions tables, in one place, spelled with the models' `_meta` names.

Everything else on these tables goes through the ORM. Each statement here is written out because a
measurement showed it pays; the reason is beside it in one line, the numbers in bench/README.md.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from sessions.event_types import PROGRESS_TYPES
from sessions.models import Event, Session


class _Names:
    """A model's table (`.table`) and its fields' columns by field name (`.seq`, `.session` for session_id)."""

    def __init__(self, model: type[models.Model]) -> None:
        self.table: str = model._meta.db_table
        self._columns = {field.name: field.column for field in model._meta.concrete_fields}

    def __getattr__(self, field: str) -> str:
        try:
            return self._columns[field]
        except KeyError:
            raise AttributeError(field) from None


S, E = _Names(Session), _Names(Event)
# sessions imports no other app: the environment's table is reached through the session's foreign key.
_environment: Any = Session._meta.get_field("environment").related_model
V = _Names(_environment)

_TERMINATED = f"'{Session.Status.TERMINATED.value}'"
# Session.objects.open(), as the lease's WHERE.
_OPEN = f"{S.deleted_at} IS NULL AND {S.archived_at} IS NULL AND {S.status} <> {_TERMINATED}"

# -- appends (sessions.services.log): the hottest path in the system

INSERT_COLUMNS = (
    f"({E.uid}, {E.session}, {E.seq}, {E.type}, {E.payload}, {E.processed_at}, {E.idempotency_key}, "
    f"{E.lease_epoch}, {E.actor})"
)


# The whole append as one statement, so that alone it is one round trip and its own transaction (a keyed
# 3-event batch: 2.5 -> 1.8 ms). The UPDATE locks the session row; under READ COMMITTED it re-checks the
# epoch (and, for a user's events, that the session is open) on the row's latest version if it had to wait.
# A stale epoch, a deleted or closed session or (with keys) a key already used leaves `bump` empty, so
# nothing is written (the caller then asks why). A key written by a transaction that committed while this
# one waited for the lock is not in this statement's snapshot: the unique key then refuses the insert, and
# the caller falls back to the statements below, which look again under the lock.
def _append(keyed: bool) -> str:
    # Keys are looked up one by one through the (session, key) index, the LIMIT keeping each a nested loop
    # in the plan psycopg prepares (`key = ANY(keys)` slowed appends as a session grew: 421 -> 789 appends/s).
    used = (
        (
            f"used AS (SELECT 1 FROM unnest(%(keys)s::varchar[]) AS k(key), LATERAL (SELECT 1 FROM "
            f"{E.table} e WHERE e.{E.session} = %(session)s::varchar AND e.{E.idempotency_key} = k.key "
            "LIMIT 1) AS hit LIMIT 1), "
        )
        if keyed
        else ""
    )
    return (
        f"WITH {used}"
        f"bump AS (UPDATE {S.table} SET {S.next_seq} = {S.next_seq} + %(count)s, {S.updated_at} = %(now)s, "
        f"{S.status} = COALESCE(%(status)s::text, {S.status}) WHERE {S.id} = %(session)s::varchar AND "
        f"{S.deleted_at} IS NULL "
        f"{'AND NOT EXISTS (SELECT 1 FROM used) ' if keyed else ''}"
        f"AND (%(epoch)s::bigint IS NULL OR {S.lease_epoch} = %(epoch)s::bigint) "
        f"AND (NOT %(open_only)s::boolean OR ({S.archived_at} IS NULL AND {S.status} <> {_TERMINATED})) "
        f"RETURNING {S.next_seq}), "
        f"inserted AS (INSERT INTO {E.table} {INSERT_COLUMNS} "
        f"SELECT r.uid, %(session)s, bump.{S.next_seq} - %(count)s + r.n - 1, r.type, r.payload, %(now)s, "
        "r.key, %(epoch)s::bigint, %(actor)s FROM bump, unnest(%(uids)s::text[], %(types)s::text[], %(payloads)s::jsonb[], "
        "%(event_keys)s::text[]) WITH ORDINALITY AS r(uid, type, payload, key, n) "
        f"RETURNING {E.id}, {E.seq}) "
        f"SELECT (SELECT {S.next_seq} FROM bump), ARRAY(SELECT {E.id} FROM inserted ORDER BY {E.seq})"
    )


APPEND, APPEND_KEYED = _append(keyed=False), _append(keyed=True)
# The append's statements one by one, under the session row's lock, inside a caller's transaction (and
# after APPEND found a key or id taken). Sent straight to psycopg, bound on the server with prepared plans:
# Django's client-side quoting cost as much as the work.
CURRENT_STATE = (
    f"SELECT {S.lease_epoch}, {S.archived_at}, {S.status} FROM {S.table} WHERE {S.id} = %s AND "
    f"{S.deleted_at} IS NULL"
)
LOCK_AND_BUMP = (
    f"UPDATE {S.table} SET {S.next_seq} = {S.next_seq} + %s, {S.updated_at} = %s "
    f"WHERE {S.id} = %s AND {S.deleted_at} IS NULL RETURNING {S.next_seq}, {S.lease_epoch}, {S.archived_at}, "
    f"{S.status}"
)
UNBUMP = f"UPDATE {S.table} SET {S.next_seq} = {S.next_seq} - %s WHERE {S.id} = %s RETURNING {S.next_seq}"
SET_STATUS = f"UPDATE {S.table} SET {S.status} = %s WHERE {S.id} = %s RETURNING {S.id}"


def used_keys(count: int) -> str:
    placeholders = ", ".join(["%s"] * count)
    return (
        f"SELECT 1 FROM {E.table} WHERE {E.session} = %s AND {E.idempotency_key} IN ({placeholders}) LIMIT 1"
    )


def insert(count: int) -> str:
    rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * count)
    return f"INSERT INTO {E.table} {INSERT_COLUMNS} VALUES {rows} RETURNING {E.id}"


# -- reads (sessions.selectors)

# Every socket's catch-up tick and every wake reads this way: building the queryset cost 1.1 ms a call
# against 0.3 ms for the read itself.
EVENTS_AFTER = f"SELECT * FROM {E.table} WHERE {E.session} = %s AND {E.seq} > %s ORDER BY {E.seq}"


def interrupted(count: int) -> str:
    """Which of `count` (session, seq) pairs have a user.interrupt after the seq: one statement a tick for all
    of a process's brains (for 8: 0.7-1.2 ms, where the ORM's OR of 8 conditions took 8-11 ms)."""
    floors = ", ".join(["(CAST(%s AS TEXT), CAST(%s AS BIGINT))"] * count)
    return (
        f"WITH floors(session_id, seq) AS (VALUES {floors}) "
        f"SELECT DISTINCT e.{E.session} FROM {E.table} e JOIN floors f "
        f"ON e.{E.session} = f.session_id AND e.{E.seq} > f.seq WHERE e.{E.type} = 'user.interrupt'"
    )


# -- the lease (sessions.services.lease)

# What a wake reads back from the lease's row, and from the log with it: the fields of an Event, in order.
LEASE_EVENT_FIELDS = [field.attname for field in Event._meta.concrete_fields]


_PROGRESS = ", ".join(f"'{kind}'" for kind in PROGRESS_TYPES)
# The wakes in a row that died on the same step: after a wake that died (the counters not reset by a clean
# release), one more, unless that wake made progress (wrote an event of PROGRESS_TYPES under its epoch: the
# epoch before this take's), and then this is the first attempt at a new step. The look at the log runs only
# after a crash: it reads the session's events by its (session, seq) index.
_STEP_ATTEMPTS = (
    f"CASE WHEN {S.wake_attempts} > 0 AND EXISTS (SELECT 1 FROM {E.table} p WHERE p.{E.session} = {S.table}.{S.id} "
    f"AND p.{E.lease_epoch} = {S.table}.{S.lease_epoch} AND p.{E.type} IN ({_PROGRESS})) THEN 1 "
    f"ELSE {S.wake_step_attempts} + 1 END"
)


def _lease_take(returning: str) -> str:
    """The lease, taken only if free (or lapsed) on an open session, with what a brain starts from: one
    statement, since the ORM's update returns no row."""
    return (
        f"UPDATE {S.table} SET {S.lease_epoch} = {S.lease_epoch} + 1, {S.lease_owner} = %s, "
        f"{S.lease_expires_at} = %s, {S.wake_attempts} = {S.wake_attempts} + 1, "
        f"{S.wake_step_attempts} = {_STEP_ATTEMPTS}, {S.wake_queued_at} = NULL "
        f"WHERE {S.id} = %s AND {_OPEN} "
        f"AND ({S.lease_expires_at} IS NULL OR {S.lease_expires_at} < %s) "
        f"RETURNING {returning}{S.lease_epoch}, {S.wake_attempts}, {S.wake_step_attempts}, {S.agent_snapshot}, "
        f"(SELECT {V.config} FROM {V.table} e WHERE e.{V.id} = {S.table}.{S.environment}) AS environment"
    )


LEASE_TAKE = _lease_take("")
# PostgreSQL: the lease and the log after a seq in one statement, one round trip fewer on a wake's way to
# its first model call. The read sees the log as the statement began.
LEASE_TAKE_AND_READ = (
    f"WITH lease AS ({_lease_take(f'{S.id}, ')}) SELECT lease.{S.lease_epoch}, lease.{S.wake_attempts}, "
    f"lease.{S.wake_step_attempts}, lease.{S.agent_snapshot}, lease.environment, "
    f"{', '.join(f'ev.{field.column}' for field in Event._meta.concrete_fields)} FROM lease LEFT JOIN "
    f"{E.table} ev ON ev.{E.session} = lease.{S.id} AND ev.{E.seq} > %s ORDER BY ev.{E.seq}"
)
# Renewed every LEASE_SECONDS / 3 for each brain, released at every wake's end: 1.2 and 0.8-1.4 ms a call
# here, where the ORM's update took 2.0-4.4 and 2.5-2.9 ms.
LEASE_RENEW = f"UPDATE {S.table} SET {S.lease_expires_at} = %s WHERE {S.id} = %s AND {S.lease_epoch} = %s"
LEASE_RELEASE = (
    f"UPDATE {S.table} SET {S.lease_expires_at} = NULL, {S.lease_owner} = '', {S.wake_attempts} = "
    f"CASE WHEN %(clean)s THEN 0 ELSE {S.wake_attempts} END, {S.wake_step_attempts} = "
    f"CASE WHEN %(clean)s THEN 0 ELSE {S.wake_step_attempts} END "
    f"WHERE {S.id} = %(session)s AND {S.lease_epoch} = %(epoch)s"
)
# A brain known dead (its process gone): its leases freed at once, as a crash (the counters kept), rather than
# left to lapse. By owner, which names the process (`host:pid`); only a lease still held.
LEASE_ABANDON = (
    f"UPDATE {S.table} SET {S.lease_expires_at} = NULL, {S.lease_owner} = '' "
    f"WHERE {S.lease_owner} = %s AND {S.lease_expires_at} IS NOT NULL RETURNING {S.id}"
)
# The owners holding a lease now: the processes a restarted worker asks about.
LEASE_OWNERS = (
    f"SELECT DISTINCT {S.lease_owner} FROM {S.table} WHERE {S.lease_expires_at} IS NOT NULL "
    f"AND {S.lease_owner} <> ''"
)
