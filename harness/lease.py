"""The lease that lets exactly one brain write a session: an epoch bumped in the database, with an expiry.

A brain takes the lease only when it is free or expired, renews it while it works, and releases it at
idle. Every append carries the epoch, so a brain whose lease was taken over is refused on its next write.
The statements on the session row are `sessions.services.lease`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sessions.models import Event
from sessions.services.lease import session_lease_release, session_lease_renew, session_lease_take


@dataclass(frozen=True)
class Lease:
    session_id: str
    epoch: int
    owner: str
    attempts: int  # wakes in a row that took the lease without a clean release, this one included
    # Of those, the ones in a row on the same step (each died having written no progress): what parks it.
    step_attempts: int
    # What a brain starts from, read by the same statement: the session's agent, its environment's config.
    agent: dict[str, Any]
    environment: dict[str, Any]
    # With `read_after`: the log's events after that seq, in order, as of taking the lease.
    events: list[Event] = field(default_factory=list)


def lease_acquire(
    session_id: str, *, owner: str, seconds: float, read_after: int | None = None
) -> Lease | None:
    """The lease, if the session is free (or its lease lapsed) and can still work: not deleted, archived
    or terminated. With `read_after`, it brings the log's events after that seq (`Lease.events`), on
    PostgreSQL in the same round trip."""
    taken = session_lease_take(session_id, owner=owner, seconds=seconds, read_after=read_after)
    if taken is None:
        return None
    return Lease(
        session_id,
        taken.epoch,
        owner,
        taken.attempts,
        taken.step_attempts,
        agent=taken.agent,
        environment=taken.environment,
        events=taken.events,
    )


def lease_renew(lease: Lease, *, seconds: float) -> bool:
    return session_lease_renew(lease.session_id, lease.epoch, seconds=seconds)


def lease_release(lease: Lease, *, clean: bool = True) -> bool:
    """Free the lease; a clean release (the brain reached idle) also resets the crash counter."""
    return session_lease_release(lease.session_id, lease.epoch, clean=clean)


@contextmanager
def lease_held(lease: Lease) -> Iterator[Lease]:
    """The lease, released when the block ends: cleanly unless the block raised (a crash counts)."""
    clean = False
    try:
        yield lease
        clean = True
    finally:
        lease_release(lease, clean=clean)
