from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def wake(session_id: str) -> None:
    """Continue a session from its log. The harness that answers lands with the harness issue."""
    logger.warning("wake(%s): no harness is installed yet; the session waits with its events recorded.",
                   session_id)
