from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


def hash_key(raw: str) -> str:
    # Keys are 32 random bytes, so a fast hash is as safe as a slow one and keeps lookups O(1).
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiKey(models.Model):
    """A bearer key for the /v1 API. Only its hash is stored; the key itself is shown once."""

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
