"""Vaults and credentials: create, change, archive, delete; repository tokens; the audit trail.

These processes (web, workers, admin) seal secrets with the public key and never open them: reading a
secret back is the egress proxy's alone (vault/crypto.py). Deleting a credential destroys its sealed
secret; its audit trail stays.
"""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

from django.db import IntegrityError, transaction
from django.utils import timezone

from kernel.api.validation import check_metadata, patch_metadata
from kernel.errors import Closed, Conflict, Invalid, NotFound, Unavailable
from kernel.models import DEFAULT_WORKSPACE_ID
from vault import crypto, rules
from vault.models import Credential, CredentialUse, RepositorySecret, Vault


def _seal(record: Credential | RepositorySecret, secrets: dict[str, str]) -> None:
    try:
        record.seal(secrets)
    except crypto.VaultKeyError as error:
        raise Unavailable(
            f"The vault cannot seal secrets: {error} Run `manage.py vault_key init` once for this installation."
        ) from None


def audit(action: str, *, actor: str, allowed: bool = True, detail: str = "", **ids: str) -> None:
    """One row of the trail: `ids` among credential_id, vault_id, session_id, sandbox_id, host."""
    CredentialUse.objects.create(action=action, actor=actor, allowed=allowed, detail=detail, **ids)


# --- Vaults ----------------------------------------------------------------------------------------------


class VaultNotFound(NotFound):
    def __init__(self, vault_id: str):
        super().__init__("vault", vault_id)


def get_vault(vault_id: str) -> Vault:
    vault = Vault.objects.live().filter(id=vault_id).first()
    if vault is None:
        raise VaultNotFound(vault_id)
    return vault


def vault_json(vault: Vault) -> dict[str, Any]:
    return {
        "id": vault.id,
        "type": "vault",
        "display_name": vault.display_name,
        "metadata": vault.metadata,
        "created_at": vault.created_at.isoformat(),
        "updated_at": vault.updated_at.isoformat(),
        "archived_at": vault.archived_at.isoformat() if vault.archived_at else None,
    }


def vault_create(
    *, display_name: str, metadata: dict[str, str] | None = None, workspace_id: str = DEFAULT_WORKSPACE_ID
) -> Vault:
    return Vault.objects.create(
        workspace_id=workspace_id, display_name=display_name, metadata=dict(check_metadata(metadata or {}))
    )


class VaultChanges(TypedDict, total=False):
    display_name: str
    metadata: dict[str, str | None]


@transaction.atomic
def vault_update(vault_id: str, **changes: Unpack[VaultChanges]) -> Vault:
    vault = _open_vault(vault_id)
    if "display_name" in changes:
        vault.display_name = changes["display_name"]
    if "metadata" in changes:
        vault.metadata = patch_metadata(vault.metadata, check_metadata(changes["metadata"], patch=True))
    vault.save()
    return vault


@transaction.atomic
def vault_archive(vault_id: str, *, actor: str) -> Vault:
    """Its credentials are no longer added to any session's traffic; it can still be read."""
    vault = _locked_vault(vault_id)
    if vault.archived_at is None:
        vault.archived_at = timezone.now()
        vault.save(update_fields=["archived_at", "updated_at"])
        audit(CredentialUse.Action.ARCHIVE, actor=actor, vault_id=vault.id, detail="vault archived")
    return vault


@transaction.atomic
def vault_delete(vault_id: str, *, actor: str) -> dict[str, str]:
    """Hidden from the API, and every credential in it deleted (its secret destroyed)."""
    vault = _locked_vault(vault_id)
    for credential in vault.credentials.live():
        _destroy(credential, actor=actor)
    vault.deleted_at = timezone.now()
    vault.save(update_fields=["deleted_at", "updated_at"])
    audit(CredentialUse.Action.DELETE, actor=actor, vault_id=vault.id, detail="vault deleted")
    return {"id": vault.id, "type": "vault_deleted"}


def _locked_vault(vault_id: str) -> Vault:
    vault = Vault.objects.select_for_update().filter(id=vault_id, deleted_at__isnull=True).first()
    if vault is None:
        raise VaultNotFound(vault_id)
    return vault


def _open_vault(vault_id: str) -> Vault:
    vault = _locked_vault(vault_id)
    if vault.archived_at is not None:
        raise Closed(f"Vault {vault_id} is archived and takes no changes.", code="vault_archived")
    return vault


def usable_vault_ids(vault_ids: list[str], workspace_id: str, where: str = "vault_ids") -> list[str]:
    """`vault_ids` as a session may take them: each names a live vault of the session's workspace that is not
    archived, once (another workspace's vault is answered as a missing one)."""
    ids = list(dict.fromkeys(vault_ids))
    found = {v.id: v for v in Vault.objects.live().filter(id__in=ids, workspace_id=workspace_id)}
    for index, vault_id in enumerate(ids):
        vault = found.get(vault_id)
        if vault is None:
            raise NotFound("vault", vault_id, f"'{where}[{index}]': no vault with id {vault_id!r}.")
        if vault.archived_at is not None:
            raise Invalid(f"'{where}[{index}]': vault {vault_id} is archived; a session cannot use it.")
    return ids


# --- Credentials -----------------------------------------------------------------------------------------


def get_credential(vault_id: str, credential_id: str) -> Credential:
    get_vault(vault_id)
    credential = Credential.objects.live().filter(id=credential_id, vault_id=vault_id).first()
    if credential is None:
        raise NotFound(
            "credential", credential_id, f"Vault {vault_id} has no credential with id {credential_id!r}."
        )
    return credential


def credential_json(credential: Credential) -> dict[str, Any]:
    return {
        "id": credential.id,
        "type": "vault_credential",
        "vault_id": credential.vault_id,
        "display_name": credential.display_name,
        "metadata": credential.metadata,
        "auth": credential.auth,
        "created_at": credential.created_at.isoformat(),
        "updated_at": credential.updated_at.isoformat(),
        "archived_at": credential.archived_at.isoformat() if credential.archived_at else None,
    }


def _taken(error: IntegrityError, shown: dict[str, Any]) -> Conflict:
    if "mcp_server" in str(error):
        return Conflict(
            f"This vault already has a credential for {shown.get('mcp_server_url')}; update or archive that "
            "one instead."
        )
    return Conflict(
        f"This vault already has a credential for the variable {shown.get('secret_name')}; update or archive "
        "that one instead."
    )


def credential_create(
    vault_id: str,
    *,
    auth: dict[str, Any],
    actor: str,
    display_name: str | None = None,
    metadata: dict[str, str] | None = None,
) -> Credential:
    """`auth` as the API's create union has it (vault/api.py checks its shape)."""
    shown, secret = rules.new_auth(auth)
    with transaction.atomic():
        vault = _open_vault(vault_id)
        credential = Credential(
            vault=vault,
            kind=shown["type"],
            display_name=display_name,
            metadata=dict(check_metadata(metadata or {})),
            auth=shown,
            mcp_server=rules.mcp_url_key(shown["mcp_server_url"]) if "mcp_server_url" in shown else "",
            secret_name=shown.get("secret_name", ""),
        )
        _seal(credential, secret)
        try:
            with transaction.atomic():
                credential.save(force_insert=True)
        except IntegrityError as error:
            raise _taken(error, shown) from None
        audit(
            CredentialUse.Action.CREATE,
            actor=actor,
            credential_id=credential.id,
            vault_id=vault.id,
            detail=f"{credential.kind} credential created",
        )
    return credential


class CredentialChanges(TypedDict, total=False):
    auth: dict[str, Any]
    display_name: str | None
    metadata: dict[str, str | None] | None


def credential_update(
    vault_id: str, credential_id: str, *, actor: str, **changes: Unpack[CredentialChanges]
) -> Credential:
    """Fields left out keep their value. Each secret field is sealed on its own, so a new one replaces
    only itself: this process could not open the others to re-seal them."""
    with transaction.atomic():
        _open_vault(vault_id)
        credential = (
            Credential.objects.select_for_update()
            .filter(id=credential_id, vault_id=vault_id, deleted_at__isnull=True)
            .first()
        )
        if credential is None:
            raise NotFound(
                "credential", credential_id, f"Vault {vault_id} has no credential with id {credential_id!r}."
            )
        if credential.archived_at is not None:
            raise Closed(
                f"Credential {credential_id} is archived and takes no changes.", code="credential_archived"
            )
        said = []
        if changes.get("auth") is not None:
            shown, secret = rules.changed_auth(credential.auth, changes["auth"])
            credential.auth = shown
            if secret:
                _seal(credential, secret)
                credential.secret_version += 1
                said.append(f"new {', '.join(sorted(secret))}")
            said.append("auth settings")
        if "display_name" in changes:
            credential.display_name = changes["display_name"]
        if changes.get("metadata") is not None:
            credential.metadata = patch_metadata(
                credential.metadata, check_metadata(changes["metadata"], patch=True)
            )
        credential.save()
        audit(
            CredentialUse.Action.UPDATE,
            actor=actor,
            credential_id=credential.id,
            vault_id=vault_id,
            detail="updated: " + (", ".join(said) or "name or metadata"),
        )
    return credential


@transaction.atomic
def credential_archive(vault_id: str, credential_id: str, *, actor: str) -> Credential:
    credential = get_credential(vault_id, credential_id)
    if credential.archived_at is None:
        credential.archived_at = timezone.now()
        credential.save(update_fields=["archived_at", "updated_at"])
        audit(CredentialUse.Action.ARCHIVE, actor=actor, credential_id=credential.id, vault_id=vault_id)
    return credential


@transaction.atomic
def credential_delete(vault_id: str, credential_id: str, *, actor: str) -> dict[str, str]:
    credential = get_credential(vault_id, credential_id)
    _destroy(credential, actor=actor)
    return {"id": credential.id, "type": "vault_credential_deleted"}


def _destroy(credential: Credential, *, actor: str) -> None:
    credential.deleted_at = timezone.now()
    credential.sealed = {}
    credential.save(update_fields=["deleted_at", "updated_at", "sealed"])
    audit(
        CredentialUse.Action.DELETE,
        actor=actor,
        credential_id=credential.id,
        vault_id=credential.vault_id,
        detail="deleted; its sealed secret destroyed",
    )
