from __future__ import annotations

from functools import partial

from django.db import models

from kernel.ids import new_id


class Agent(models.Model):
    """An agent's identity; its configuration lives in immutable versions."""

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "agent"), editable=False)
    workspace = models.ForeignKey(
        "workbench.Workspace", on_delete=models.PROTECT, related_name="+", editable=False
    )
    version = models.PositiveIntegerField(default=1, help_text="The latest version.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.id


class AgentVersion(models.Model):
    """One version of an agent: the whole configuration, exactly as the API returns it."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    config = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["agent", "-version"]
        constraints = [models.UniqueConstraint(fields=["agent", "version"], name="agent_version_unique")]

    def __str__(self) -> str:
        return f"{self.agent_id} v{self.version}"
