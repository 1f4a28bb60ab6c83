"""Forking a session: a new session whose log starts with a copy of another's first N events."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from harness.registry import validate_harness_name
from harness.services.lifecycle import queue_wake_if_pending
from kernel.errors import Invalid
from kernel.ids import new_id
from sessions import events
from sessions.models import Event, Session
from sessions.services.log import STATUS_BY_EVENT_TYPE, SessionNotFound, emit_event

COPY_BATCH = 2000


def session_fork(
    session_id: str, *, at_seq: int, harness: str | None = None, title: str | None = None
) -> Session:
    """Copy events [0:at_seq] into a new session, record the fork, and let a brain continue it.

    The copies are new events (new ids, no lease epoch); the origin's log is not touched. A repository
    token stays with the session it was given to (its RepositorySecret is not copied): the fork's
    repositories have none until one is given with POST /v1/sessions/{fork}/resources/{resource_id}.
    """
    origin = Session.objects.live().filter(id=session_id).first()
    if origin is None:
        raise SessionNotFound(session_id)
    if not isinstance(at_seq, int) or isinstance(at_seq, bool) or not 0 <= at_seq <= origin.next_seq:
        raise Invalid(
            f"'at_seq' must be an integer from 0 to {origin.next_seq} (the session's length), not {at_seq!r}."
        )
    if harness is not None:
        validate_harness_name(harness)
    with transaction.atomic():
        fork = Session.objects.create(
            workspace_id=origin.workspace_id,
            agent_id=origin.agent_id,
            agent_version=origin.agent_version,
            agent_snapshot=origin.agent_snapshot,
            environment_id=origin.environment_id,
            title=title or f"Fork of {origin.title or origin.id} at {at_seq}",
            metadata=dict(origin.metadata),
            resources=origin.shown_resources(),
            vault_ids=origin.vault_ids,
            budget=origin.budget,
            forked_from=origin,
            forked_at_seq=at_seq,
        )
        status = Session.Status.IDLE
        for start in range(0, at_seq, COPY_BATCH):
            rows = list(
                Event.objects.filter(
                    session_id=session_id, seq__gte=start, seq__lt=min(start + COPY_BATCH, at_seq)
                ).order_by("seq")
            )
            Event.objects.bulk_create(
                [
                    Event(
                        uid=new_id("sevt"),
                        session=fork,
                        seq=row.seq,
                        type=row.type,
                        payload=row.payload,
                        processed_at=row.processed_at,
                        actor=row.actor,
                    )
                    for row in rows
                ]
            )
            status = next((_status(row) for row in reversed(rows) if _status(row)), status)
        Session.objects.filter(id=fork.id).update(next_seq=at_seq, status=status)
        emit_event(fork.id, events.fork_created(origin.id, through_seq=at_seq))
        if harness is not None:
            emit_event(fork.id, events.harness_switched(harness))
        queue_wake_if_pending(fork.id)
    fork.refresh_from_db()
    return fork


def _status(event: Event) -> Any:
    return STATUS_BY_EVENT_TYPE.get(event.type)
