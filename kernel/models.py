from __future__ import annotations

import hashlib
import secrets
from functools import partial

from django.conf import settings
from django.db import models

from kernel.ids import new_id


def hash_key(raw: str) -> str:
    # Keys are 32 random bytes, so a fast hash is as safe as a slow one and keeps lookups O(1).
    return hashlib.sha256(raw.encode()).hexdigest()


# The workspace every object made before workspaces existed belongs to, and the one a key or user gets
# when none is named.
DEFAULT_WORKSPACE_ID = "wrkspc_default"
DEFAULT_WORKSPACE_SLUG = "default"


class Workspace(models.Model):
    """The tenant: every agent, environment, session, sandbox, vault and API key belongs to one, and another
    workspace's objects are invisible (404) to its keys and members."""

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "wrkspc"), editable=False)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user's role in a workspace: a viewer reads, an operator also runs sessions and moves hands, an
    admin also manages keys, members and credentials."""

    class Role(models.TextChoices):
        VIEWER = "viewer"
        OPERATOR = "operator"
        ADMIN = "admin"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace_id} ({self.role})"


class ApiKey(models.Model):
    """A bearer key for the /v1 API, in one workspace, full or read-only. Only its hash is stored; the key
    itself is shown once."""

    workspace = models.ForeignKey(
        "workbench.Workspace", on_delete=models.PROTECT, related_name="+", editable=False
    )
    read_only = models.BooleanField(default=False, help_text="Refused every write (403).")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise a key.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def generate() -> str:
        return "wbk_" + secrets.token_urlsafe(32)


class AuditEntry(models.Model):
    """Who did what to which object: keys created and revoked, members added, hands passed or terminated,
    harnesses switched. Append-only; the admin shows it read-only."""

    workspace = models.ForeignKey(
        "workbench.Workspace", on_delete=models.PROTECT, related_name="+", editable=False
    )
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=300)
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=200, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"


class IdempotentRequest(models.Model):
    """A POST sent with an `Idempotency-Key`, and the answer it got: a retry with the key gets that answer."""

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="idempotent_requests")
    key = models.CharField(max_length=255)
    # sha256 of the method, path and body: the same key with another request is refused, not replayed.
    fingerprint = models.CharField(max_length=64)
    # Null while the first request with the key runs.
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["api_key", "key"], name="idempotency_key_per_api_key")]

    def __str__(self) -> str:
        return f"{self.key} ({self.status or 'running'})"
