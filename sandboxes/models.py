from __future__ import annotations

from functools import partial

from django.db import models

from workbench.ids import new_id


class Environment(models.Model):
    """The template sandboxes are provisioned from (the /v1 environment)."""

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "env"), editable=False)
    name = models.CharField(max_length=255)
    description = models.TextField(null=True, blank=True)  # noqa: DJ001 - the API tells null from ""
    metadata = models.JSONField(default=dict, blank=True)
    scope = models.CharField(max_length=20, default="organization")
    config = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"
