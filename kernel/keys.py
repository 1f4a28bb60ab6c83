"""API keys: made (the raw key shown once), revoked, each in one workspace, full or read-only; both recorded in
the audit log. The management command, the keys page and `/v1` all come here."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from kernel.errors import Invalid, NotFound
from kernel.models import DEFAULT_WORKSPACE_ID, ApiKey, hash_key
from kernel.tenancy import audit

PREFIX_LENGTH = 12


@transaction.atomic
def api_key_create(
    *,
    name: str,
    workspace_id: str = DEFAULT_WORKSPACE_ID,
    read_only: bool = False,
    created_by: Any = None,
    actor: str = "system",
) -> tuple[ApiKey, str]:
    """A new key and its raw value. Only the hash is stored: the raw value must be shown now or never."""
    name = name.strip()
    if not name:
        raise Invalid("Give the key a name that says what it is for, e.g. 'ci' or 'alice laptop'.")
    raw = ApiKey.generate()
    key = ApiKey.objects.create(
        workspace_id=workspace_id,
        read_only=read_only,
        name=name,
        prefix=raw[:PREFIX_LENGTH],
        key_hash=hash_key(raw),
        created_by=created_by,
    )
    audit(workspace_id, actor, "api_key.created", f"{key.name} ({key.prefix}…)", read_only=read_only)
    return key, raw


@transaction.atomic
def api_key_revoke(key_id: int, *, workspace_id: str, actor: str = "system") -> ApiKey:
    """Revoke a key of the workspace (another workspace's key is answered as a missing one)."""
    key = ApiKey.objects.select_for_update().filter(pk=key_id, workspace_id=workspace_id).first()
    if key is None:
        raise NotFound("API key", str(key_id))
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        audit(workspace_id, actor, "api_key.revoked", f"{key.name} ({key.prefix}…)")
    return key
