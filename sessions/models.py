from __future__ import annotations

from functools import partial
from typing import Any, Self

from django.db import models

from kernel.ids import new_id


class SessionQuerySet(models.QuerySet["Session"]):
    def live(self) -> Self:
        """Not deleted: a deleted session is a 404 everywhere, though its row and log stay."""
        return self.filter(deleted_at__isnull=True)

    def open(self) -> Self:
        """Live and able to work: not archived or terminated (what a brain's lease and users' events need)."""
        return self.live().filter(archived_at__isnull=True).exclude(status=Session.Status.TERMINATED)


class Session(models.Model):
    """An agent session. Its history is its events; the row holds what lists and locks need."""

    class Status(models.TextChoices):
        IDLE = "idle"
        RUNNING = "running"
        RESCHEDULING = "rescheduling"
        TERMINATED = "terminated"

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "sesn"), editable=False)
    workspace = models.ForeignKey(
        "workbench.Workspace", on_delete=models.PROTECT, related_name="+", editable=False
    )
    agent = models.ForeignKey("harness.Agent", on_delete=models.PROTECT, related_name="sessions")
    agent_version = models.PositiveIntegerField()
    agent_snapshot = models.JSONField(help_text="The resolved agent this session runs.")
    environment = models.ForeignKey(
        "sandboxes.Environment", on_delete=models.PROTECT, related_name="sessions"
    )
    title = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001 - the API tells null from ""
    metadata = models.JSONField(default=dict, blank=True)
    resources = models.JSONField(default=list, blank=True)
    vault_ids = models.JSONField(default=list, blank=True)
    budget = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.IDLE)
    usage = models.JSONField(default=dict, blank=True)
    # The number of events, i.e. the next seq. Appends take this row's lock to bump it.
    next_seq = models.BigIntegerField(default=0)
    # The lease of the brain allowed to write; appends carrying another epoch are refused.
    lease_epoch = models.BigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Wakes that took the lease and have not yet reached a clean release: a crash counter.
    wake_attempts = models.PositiveIntegerField(default=0)
    # Of those wakes, the ones in a row that died on the same step (none wrote progress): what parks a session.
    wake_step_attempts = models.PositiveIntegerField(default=0)
    # When the sweeper last queued a wake for this session; taking the lease clears it (one queued at a time).
    wake_queued_at = models.DateTimeField(null=True, blank=True)
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    forked_at_seq = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = SessionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["created_at", "id"], name="session_created_id")]

    def __str__(self) -> str:
        return self.id

    def shown_resources(self) -> list[dict[str, Any]]:
        """The resources as they may be shown or copied. A repository token is never stored here (the vault
        holds it, sealed, as a RepositorySecret); a row written before tokens moved there loses it here too."""
        return [
            {k: v for k, v in resource.items() if k != "authorization_token"} for resource in self.resources
        ]


class AppendOnlyError(Exception):
    """Events are never changed or removed once written."""


class EventQuerySet(models.QuerySet["Event"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("Events are append-only: they cannot be updated.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Events are append-only: they cannot be deleted.")


class Event(models.Model):
    """One entry of a session's log, at position `seq`."""

    uid = models.CharField(max_length=40, unique=True, default=partial(new_id, "sevt"), editable=False)
    session = models.ForeignKey(Session, on_delete=models.PROTECT, related_name="events", db_index=False)
    seq = models.BigIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    processed_at = models.DateTimeField()
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULLs stay out of the unique key
    lease_epoch = models.BigIntegerField(null=True, blank=True)
    # Who sent it, for events a person or a key sends ("user alice", "api key ci (wbk_…)"); "" for the platform's.
    actor = models.CharField(max_length=200, blank=True, default="")

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="event_session_seq_unique"),
            models.UniqueConstraint(fields=["session", "idempotency_key"], name="event_session_idem_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}[{self.seq}] {self.type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError("Events are append-only: they cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Events are append-only: they cannot be deleted.")

    def as_api(self) -> dict[str, Any]:
        """The event as the /v1 API and the SDK see it."""
        return {
            "id": self.uid,
            "type": self.type,
            **self.payload,
            "processed_at": self.processed_at.isoformat(),
        }
