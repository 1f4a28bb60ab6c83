"""The lease that lets exactly one brain write a session: an epoch bumped in the database, with an expiry.

A brain takes the lease only when it is free or expired, renews it while it works, and releases it at
idle. Every append carries the epoch, so a brain whose lease was taken over is refused on its next write.
The statements on the session row are `sessions.services.lease`'s.

A lease's owner names the process holding it (`host:pid`), so a process that learns a brain's process is gone
can free its leases at once (`leases_abandon`) rather than leave its sessions waiting for them to lapse: the
worker's main process when a pool process dies mid-task, a worker starting where an earlier one's processes
are gone. A machine that vanished tells nobody; for it, the lease's expiry and the sweeper stay the way back.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseFailure

from sessions.models import Event
from sessions.services.lease import (
    session_lease_owners,
    session_lease_release,
    session_lease_renew,
    session_lease_take,
    session_leases_abandon,
)


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


# Leases this process could not release because the database was unreachable (a restart breaks every
# connection): released, as crashes, by `leases_left_release` once it answers again.
_left: list[Lease] = []


@contextmanager
def lease_held(lease: Lease) -> Iterator[Lease]:
    """The lease, released when the block ends: cleanly unless the block raised (a crash counts). One the
    database could not release is kept for `leases_left_release`."""
    clean = False
    try:
        yield lease
        clean = True
    finally:
        try:
            lease_release(lease, clean=clean)
        except DatabaseFailure:
            _left.append(lease)
            raise


def leases_left_release() -> None:
    """Release, as crashes, the leases this process's brains could not release when the database failed, so
    the session is free at once rather than when the lease lapses. Each is released only under its own epoch:
    one another brain has taken since is left alone. Raises if the database still fails; what is left stays."""
    while _left:
        lease_release(_left[0], clean=False)
        _left.pop(0)


def owner_name(pid: int | None = None) -> str:
    """The owner a lease names: the process (this one unless `pid` is given) on this host."""
    return f"{_host()}:{os.getpid() if pid is None else pid}"


def _host() -> str:
    """This machine's name in leases: LEASE_HOST, or the hostname. Machines whose processes can see one another
    must share it, and others must not (a container is a machine of its own: its processes and hostname)."""
    return settings.LEASE_HOST or socket.gethostname()


def leases_abandon(pid: int) -> list[str]:
    """Free the leases of this host's process `pid`, which is gone, as a crash (its sessions' crash counters
    go on counting); the sessions it held, for the caller to wake."""
    return session_leases_abandon(owner_name(pid))


def leases_of_gone_processes() -> list[str]:
    """Free the leases held by processes of this host that no longer run (a worker killed with its pool, its
    replacement starting); the sessions they held. Owners on other hosts are left to their leases' expiry."""
    host = f"{_host()}:"
    freed: list[str] = []
    for owner in session_lease_owners():
        name, _, pid = owner.rpartition(":")
        if f"{name}:" == host and pid.isdigit() and process_gone(int(pid)):
            freed += session_leases_abandon(owner)
    return freed


def process_gone(pid: int) -> bool:
    """Whether no process `pid` runs here (a zombie counts as gone: it is dead, only not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # another user's process: alive
    with suppress(OSError, IndexError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    return False
