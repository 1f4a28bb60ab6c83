"""Celery tasks of the brain: `wake(session_id)` and the sweeper. Thin: they load, guard and call."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             time_limit=settings.CELERY_TASK_TIME_LIMIT, soft_time_limit=settings.CELERY_TASK_SOFT_TIME_LIMIT)
def wake(session_id: str, by: str = "event") -> str:
    """Continue a session from its log. Safe to run twice or at once: the lease admits one brain, and only
    to a session that can still work (not deleted, archived or terminated)."""
    from harness.brain import run_brain
    from sessions.models import Session

    outcome = run_brain(session_id, by=by)
    if outcome == "busy" and not Session.objects.filter(
            id=session_id, deleted_at__isnull=True, archived_at__isnull=True).exclude(
            status=Session.Status.TERMINATED).exists():
        outcome = "gone"
    logger.info("wake(%s): %s", session_id, outcome)
    return outcome


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def sweep() -> int:
    """Re-wake running sessions whose lease lapsed (their brain died): the log shows work left to do."""
    from harness.brain import has_pending_work
    from sessions.models import Session

    now = timezone.now()
    lapsed = Q(lease_expires_at__lt=now) | Q(
        lease_expires_at__isnull=True, updated_at__lt=now - timedelta(seconds=2 * settings.LEASE_SECONDS))
    candidates = Session.objects.filter(
        lapsed, deleted_at__isnull=True, archived_at__isnull=True, status=Session.Status.RUNNING,
    ).values_list("id", flat=True)[:500]
    woken = 0
    for session_id in candidates:
        if has_pending_work(session_id):
            wake.delay(session_id, by="sweeper")
            woken += 1
    return woken
