from __future__ import annotations

from functools import partial
from typing import Self

from django.db import models

from kernel.ids import new_id
from sandboxes.work_models import EnvironmentKey, WorkItem, WorkPoller

__all__ = ["Environment", "EnvironmentKey", "Sandbox", "WorkItem", "WorkPoller"]


class EnvironmentQuerySet(models.QuerySet["Environment"]):
    def live(self) -> Self:
        """Not deleted: a deleted environment is a 404, though sessions that used it keep their history."""
        return self.filter(deleted_at__isnull=True)

    def usable(self) -> Self:
        """Live and not archived: new sessions may start in it, and its warm pool is kept."""
        return self.live().filter(archived_at__isnull=True)


class Environment(models.Model):
    """The template sandboxes are provisioned from (the /v1 environment)."""

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "env"), editable=False)
    workspace = models.ForeignKey(
        "workbench.Workspace", on_delete=models.PROTECT, related_name="+", editable=False
    )
    name = models.CharField(max_length=255)
    description = models.TextField(null=True, blank=True)  # noqa: DJ001 - the API tells null from ""
    metadata = models.JSONField(default=dict, blank=True)
    scope = models.CharField(max_length=20, default="organization")
    config = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = EnvironmentQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        # Names are unique in a workspace among the environments the API still shows (archived ones too);
        # deleting one frees its name.
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"],
                condition=models.Q(deleted_at__isnull=True),
                name="environment_live_name_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class Sandbox(models.Model):
    """One hand: an execution environment instance, held by at most one session at a time."""

    class Status(models.TextChoices):
        PROVISIONING = "provisioning"
        READY = "ready"
        DEAD = "dead"
        TERMINATED = "terminated"

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "sbx"), editable=False)
    environment = models.ForeignKey(Environment, on_delete=models.PROTECT, related_name="sandboxes")
    session = models.ForeignKey(
        "agent_sessions.Session", null=True, blank=True, on_delete=models.SET_NULL, related_name="sandboxes"
    )
    name = models.CharField(max_length=64, default="main")
    provider = models.CharField(max_length=32)
    handle = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PROVISIONING)
    labels = models.JSONField(default=dict, blank=True)
    # The sha256 of the token the sandbox gives the egress proxy as its identity (Proxy-Authorization);
    # the token itself is only in the sandbox's environment.
    egress_token_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [  # the few being provisioned, counted by each turn that would provision ahead
            models.Index(
                fields=["status"], condition=models.Q(status="provisioning"), name="sandbox_provisioning"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id}, {self.status})"
