"""Celery tasks of the brain: `wake(session_id)` and the sweeper. Thin: they load, guard and call."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import redis
from celery import current_app, shared_task
from celery.signals import worker_ready
from celery.worker.request import Request
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, connections
from django.db.models import Q
from django.utils import timezone

from harness.brain import Outcome, has_pending_work, run_brain
from harness.lease import leases_abandon, leases_left_release, leases_of_gone_processes, process_gone
from harness.pool import watch_pool
from sessions.models import Session

logger = logging.getLogger(__name__)


class WakeRequest(Request):  # type: ignore[misc]
    """A wake as the worker's main process sees it. When the pool process running it dies (SIGKILL, the OOM
    killer, a crash), the leases that process held are freed before Celery requeues the wake, so the wake
    taking it up finds the session free at once instead of waiting out the dead brain's lease."""

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        if self.worker_pid and process_gone(self.worker_pid):
            _wake_sessions_of_lost_brains(
                lambda: leases_abandon(self.worker_pid), f"pool process {self.worker_pid}", self.args[:1]
            )
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


@worker_ready.connect
def _free_leases_of_gone_processes(sender: Any = None, **_: Any) -> None:
    """A worker starting (a supervisor restarting one whose main process was killed, its pool with it): the
    leases that processes of this host no longer running still hold are freed, and their sessions woken. Then
    it watches its pool processes, so one that dies is noticed at once (harness.pool)."""
    _wake_sessions_of_lost_brains(leases_of_gone_processes, "processes of this host that are gone", ())
    watch_pool(sender)


def _wake_sessions_of_lost_brains(
    free: Callable[[], list[str]], whose: str, requeued: Sequence[str], *, main_process: bool = True
) -> None:
    """Free the leases (`free`), then wake their sessions, but for those whose wake Celery requeues itself.
    In a worker's main process (which runs no brain) the database is closed afterwards. A failure only costs
    speed: the leases lapse as before."""
    try:
        freed = free()
    except Exception:  # noqa: BLE001 - the lease's expiry is the way back
        logger.exception("the leases of %s were not freed; their sessions resume when they lapse", whose)
        return
    finally:
        if main_process:
            _close_database()
    if freed:
        logger.warning("freed the leases of %s: %s", whose, ", ".join(freed))
    for session_id in freed:
        if session_id not in requeued:
            queue_wake(session_id, by="worker_lost")


def _close_database() -> None:
    """Close the main process's database connection and its pool, if it has one. The pool processes it forks
    next would inherit the pool's open connections, and a pool process starting closes the pool it inherited
    (Celery's Django fixup), which ends those connections for this process too: its next use failed with a
    broken connection, and the sessions of the next dead brain waited out their leases."""
    connection.close()
    close_pool = getattr(connection, "close_pool", None)  # PostgreSQL's backend alone has a pool
    if close_pool is not None and connection.settings_dict.get("OPTIONS", {}).get("pool"):
        close_pool()


# No time limit: a turn may rightly work for hours (a long model stream, tool call after tool call), and a
# limit would kill it mid-step and count it as a crash. A brain proves it is alive by renewing its lease
# (harness.watcher, every LEASE_SECONDS / 3); a dead or frozen worker's lease lapses and the sweeper wakes the
# session again. Each step has a limit of its own (MODEL_TIMEOUT_SECONDS, TOOL_TIMEOUT_SECONDS,
# MCP_TIMEOUT_SECONDS), so a brain does not wait forever on one.
@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True, Request=WakeRequest)
def wake(session_id: str, by: str = "event") -> Outcome:
    """Continue a session from its log. Safe to run twice or at once: the lease admits one brain, and only
    to a session that can still work (`Session.objects.open()`)."""
    outcome = _riding_out_the_database(lambda: run_brain(session_id, by=by), session_id)
    if outcome is Outcome.BUSY and not Session.objects.open().filter(id=session_id).exists():
        outcome = Outcome.GONE
    logger.info("wake(%s): %s", session_id, outcome)
    return outcome


DATABASE_RETRY_PAUSE_SECONDS = 1.0


def _riding_out_the_database(work: Callable[[], Outcome], session_id: str) -> Outcome:
    """`work`, again while the database is unreachable (a PostgreSQL restart breaks every connection), up to
    WAKE_DATABASE_WAIT_SECONDS. A wake that failed so would otherwise be gone: one that had not taken the lease
    left the session waiting WAKE_REQUEUE_SECONDS for the sweeper, one whose brain held it, the lease's lapse.
    Trying again once the database answers releases what the dead brain held (`leases_left_release`) and
    takes the session up at once, as a brain does after a crash."""
    give_up = time.monotonic() + settings.WAKE_DATABASE_WAIT_SECONDS
    while True:
        try:
            leases_left_release()
            return work()
        except (OperationalError, InterfaceError) as error:
            if time.monotonic() >= give_up:
                raise
            logger.warning("wake(%s): the database failed (%s); trying again", session_id, error)
            connections.close_all()
            time.sleep(DATABASE_RETRY_PAUSE_SECONDS)


_wake_pool: tuple[int, Any] | None = None  # (the process that made it, the pool)
_wake_pool_lock = threading.Lock()


def _wake_connections() -> Any:
    """The process's pool of broker connections for wakes, with socket timeouts: a hung Redis answers within
    them. One pool per process, not a connection per thread: under ASGI each request has a thread of its own,
    and a new connection per request cost ~2.4 ms of its answer. A forked child makes its own: kombu closes
    the pools a child inherits, and a worker's main process that had queued a wake (for a dead pool process's
    sessions) gave every pool process it forked after a closed one, whose every wake then failed."""
    global _wake_pool
    with _wake_pool_lock:
        if _wake_pool is None or _wake_pool[0] != os.getpid() or _wake_pool[1]._closed:
            timeout = settings.WAKE_PUBLISH_TIMEOUT_SECONDS
            connection = current_app.connection_for_write(
                transport_options={
                    **current_app.conf.broker_transport_options,
                    "socket_timeout": timeout,
                    "socket_connect_timeout": timeout,
                }
            )
            _wake_pool = (os.getpid(), connection.Pool(limit=settings.WAKE_PUBLISH_CONNECTIONS))
        return _wake_pool[1]


def queue_wake(session_id: str, *, by: str = "event") -> bool:
    """Put `wake(session_id)` on the broker, or give up within about WAKE_PUBLISH_TIMEOUT_SECONDS.

    Called after the events that need the wake are committed: a broker that hangs or refuses must not turn
    a committed request into a timeout or a 500 (which a client retries, appending again). A session whose
    wake did not go out is running with no lease, and the sweeper wakes it. A connection that went stale
    (Redis restarted) is replaced once, if there is time left.
    """
    give_up = time.monotonic() + settings.WAKE_PUBLISH_TIMEOUT_SECONDS
    while True:
        try:
            with _wake_connections().acquire(
                block=True, timeout=settings.WAKE_PUBLISH_TIMEOUT_SECONDS
            ) as broker:
                try:
                    wake.apply_async(
                        (session_id,), {} if by == "event" else {"by": by}, connection=broker, retry=False
                    )
                except Exception:
                    broker.close()  # back in the pool closed: its next user connects afresh
                    raise
            return True
        except Exception as error:  # noqa: BLE001 - every broker failure means the same here
            if time.monotonic() < give_up and not _timed_out(error):
                continue
            logger.warning(
                "wake(%s) was not queued (%s: %s); the sweeper will wake the session",
                session_id,
                type(error).__name__,
                error,
            )
            return False


def _timed_out(error: BaseException) -> bool:
    while error is not None:
        if isinstance(error, TimeoutError | redis.TimeoutError):
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


BROKER_MARK = "workbench:broker-remembers"


def _broker_forgot() -> bool:
    """Whether the broker lost what it held since the last sweep: a Redis restarted without persistence (as
    `make run` runs it), flushed or replaced. The sweeper leaves a mark in it; a sweep that finds none knows
    the wakes queued before are gone (the first sweep of a new deployment thinks so too, which costs at most
    one extra wake per waiting session). A broker that does not answer forgot nothing we can act on."""
    if not settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://", "unix://")):
        return False
    timeout = settings.WAKE_PUBLISH_TIMEOUT_SECONDS
    client = redis.Redis.from_url(
        settings.CELERY_BROKER_URL, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        forgot = bool(client.set(BROKER_MARK, timezone.now().isoformat(), nx=True))
    except redis.RedisError:
        return False
    finally:
        client.close()
    if forgot:
        logger.warning(
            "the broker holds no mark of an earlier sweep: wakes queued before are lost; waking again"
        )
    return forgot


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def sweep() -> int:
    """Re-wake running sessions whose lease lapsed (their brain died): the log shows work left to do.

    At most one wake per session is queued: the mark it sets is cleared by the brain that takes the lease,
    so a session whose wake waits behind busy workers is not queued again every sweep.

    First, the leases held by processes of this host that are gone are freed and their sessions woken: a
    worker killed whole, its pool with it, tells nobody, and its replacement (if any) takes seconds to start.
    And when the broker lost its queue (`_broker_forgot`), every running session without a living lease is
    woken now, not after the grace and requeue times that keep it from being queued twice.
    """
    _wake_sessions_of_lost_brains(
        leases_of_gone_processes, "processes of this host that are gone", (), main_process=False
    )
    now = timezone.now()
    lapsed = Q(lease_expires_at__lt=now) | Q(
        lease_expires_at__isnull=True, updated_at__lt=now - timedelta(seconds=2 * settings.LEASE_SECONDS)
    )
    unqueued = Q(wake_queued_at__isnull=True) | Q(
        wake_queued_at__lt=now - timedelta(seconds=settings.WAKE_REQUEUE_SECONDS)
    )
    if _broker_forgot():
        # Every wake queued before is gone: no session without a living lease waits for one.
        lapsed, unqueued = Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True), Q()
    candidates = (
        Session.objects.open()
        .filter(lapsed, unqueued, status=Session.Status.RUNNING)
        .values_list("id", flat=True)[:500]
    )
    woken = 0
    for session_id in candidates:
        if not has_pending_work(session_id):
            continue
        if not Session.objects.filter(unqueued, id=session_id).update(wake_queued_at=now):
            continue  # another sweeper queued it meanwhile
        if queue_wake(session_id, by="sweeper"):
            woken += 1
        else:
            Session.objects.filter(id=session_id, wake_queued_at=now).update(wake_queued_at=None)
    return woken
