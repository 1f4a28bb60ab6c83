"""API keys: the one write the UI needs that no app provides yet (it belongs in `workbench/`)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from kernel.errors import Invalid, NotFound
from kernel.models import ApiKey, hash_key

PREFIX_LENGTH = 12


def api_key_create(*, name: str, created_by: Any = None) -> tuple[ApiKey, str]:
    """A new key and its raw value. Only the hash is stored: the raw value must be shown now or never."""
    name = name.strip()
    if not name:
        raise Invalid("Give the key a name that says what it is for, e.g. 'ci' or 'alice laptop'.")
    raw = ApiKey.generate()
    key = ApiKey.objects.create(
        name=name, prefix=raw[:PREFIX_LENGTH], key_hash=hash_key(raw), created_by=created_by
    )
    return key, raw


def api_key_revoke(key_id: int) -> ApiKey:
    key = ApiKey.objects.filter(pk=key_id).first()
    if key is None:
        raise NotFound("API key", str(key_id))
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key
