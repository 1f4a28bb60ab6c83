"""Background work on sandboxes: pool refills, the reaper, and the work queue's sweep for lost workers (on beat)."""

from __future__ import annotations

from celery import shared_task

from sandboxes.models import Environment
from sandboxes.pool import REFILL_TASK, pool_refill, pool_renew, pool_size
from sandboxes.reaper import reap_idle, reap_orphans
from sandboxes.work_queue import work_sweep


@shared_task(name=REFILL_TASK, ignore_result=True, time_limit=600, soft_time_limit=570)
def refill_pool(environment_id: str) -> int:
    return pool_refill(environment_id)


@shared_task(ignore_result=True, time_limit=600, soft_time_limit=570)
def maintain_pools() -> int:
    """Every pool: its stale members replaced (`pool_renew`), and filled to its size; how many were added."""
    added = 0
    for environment in Environment.objects.usable():
        if pool_size(environment) > 0:
            pool_renew(environment)
            added += pool_refill(environment.id)
    return added


@shared_task(ignore_result=True, time_limit=600, soft_time_limit=570)
def reap() -> dict[str, list[str]]:
    return {"idle": reap_idle(), "orphans": reap_orphans()}


@shared_task(ignore_result=True, time_limit=300, soft_time_limit=270)
def sweep_work() -> list[str]:
    """Work items whose self-hosted worker is gone go back to the queue (polls sweep their own environment
    too, so an idle queue's pollers need not wait for beat)."""
    return work_sweep()
