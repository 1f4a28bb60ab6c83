"""The self-hosted work queue's rows: work items, environment keys, and the workers seen polling.

PostgreSQL holds the queue (rows and leases, claimed with `FOR UPDATE SKIP LOCKED`); Redis only wakes
long polls (sandboxes/work_wake.py). Imported by sandboxes.models, so Django sees them as the app's models.
"""

from __future__ import annotations

from functools import partial
from typing import Self

from django.db import models

from kernel.ids import new_id


class WorkItemQuerySet(models.QuerySet["WorkItem"]):
    def live(self) -> Self:
        """Not stopped: at most one such item per session (a partial unique constraint)."""
        return self.exclude(state=WorkItem.State.STOPPED)

    def in_queue(self) -> Self:
        """Waiting for a worker: queued, handed out by a poll or not (a poll's hand-out is not an ack)."""
        return self.filter(state=WorkItem.State.QUEUED)


class WorkItem(models.Model):
    """A self-hosted environment's request for hands, served to the SDK's own worker (reference §5.2)."""

    class Kind(models.TextChoices):
        SESSION = "session"
        HEALTHCHECK = "healthcheck"

    class State(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"  # acked, no first heartbeat yet
        ACTIVE = "active"  # claimed by a first heartbeat; the lease runs
        STOPPING = "stopping"
        STOPPED = "stopped"

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "work"), editable=False)
    environment = models.ForeignKey(
        "sandboxes.Environment", on_delete=models.CASCADE, related_name="work_items"
    )
    session = models.ForeignKey(
        "agent_sessions.Session", null=True, blank=True, on_delete=models.CASCADE, related_name="work_items"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.SESSION)
    state = models.CharField(max_length=20, choices=State.choices, default=State.QUEUED)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When it last entered the queue (created, or put back after its worker was lost): the queue's order.
    queued_at = models.DateTimeField(auto_now_add=True)
    # Handed out by a poll and not yet acked; another poll may hand it out again after reclaim_older_than_ms.
    polled_at = models.DateTimeField(null=True, blank=True)
    polled_by = models.CharField(max_length=200, blank=True, default="")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # The exact string the last heartbeat answered as `last_heartbeat` ("" before the first): the next
    # heartbeat must echo it.
    latest_heartbeat = models.CharField(max_length=64, blank=True, default="")
    latest_heartbeat_at = models.DateTimeField(null=True, blank=True)
    ttl_seconds = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The worker holding it (its Anthropic-Worker-ID from the poll that handed it out).
    worker_id = models.CharField(max_length=200, blank=True, default="")
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # How often a worker was lost with it and it went back to the queue.
    lost_count = models.PositiveIntegerField(default=0)
    # Set by the commit that stops the item or puts it back in the queue, cleared once the work-lost or
    # work-stopped hooks have run; a queued item is not handed out while it is set.
    hooks_due_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The sessions token (sha256) of the current hand-out or claim. Tokens handed out by earlier polls of
    # this same stay in the queue are `offered` (any one of them may still claim it with a first heartbeat);
    # those of claims that ended are `retired`, so their holders are told why they are refused.
    token_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    offered_token_hashes = models.JSONField(default=list, blank=True, editable=False)
    retired_token_hashes = models.JSONField(default=list, blank=True, editable=False)

    objects = WorkItemQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"],
                condition=~models.Q(state="stopped"),
                name="work_item_one_live_per_session",
            )
        ]
        indexes = [
            models.Index(fields=["environment", "state", "queued_at"], name="work_item_queue"),
            models.Index(
                fields=["hooks_due_at"],
                name="work_item_hooks_due",
                condition=models.Q(hooks_due_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.state})"


class EnvironmentKey(models.Model):
    """A self-hosted environment's key: polls its queue and serves its work items. Only its hash is kept;
    the key is shown once, when it is created."""

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "envkey"), editable=False)
    environment = models.ForeignKey("sandboxes.Environment", on_delete=models.CASCADE, related_name="keys")
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise a key.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.name or self.id} ({self.prefix}…)"


class WorkPoller(models.Model):
    """A worker (its Anthropic-Worker-ID) seen polling an environment, and when last: the stats' count of
    workers polling."""

    environment = models.ForeignKey("sandboxes.Environment", on_delete=models.CASCADE, related_name="pollers")
    worker_id = models.CharField(max_length=200)
    last_polled_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["environment", "worker_id"], name="work_poller_per_environment")
        ]

    def __str__(self) -> str:
        return f"{self.worker_id} on {self.environment_id}"
