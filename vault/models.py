from __future__ import annotations

from functools import partial
from typing import Self

from django.db import models

from kernel.ids import new_id
from vault import crypto


class VaultQuerySet(models.QuerySet["Vault"]):
    def live(self) -> Self:
        """Not deleted: a deleted vault is a 404; its credentials' audit trail stays."""
        return self.filter(deleted_at__isnull=True)

    def usable(self) -> Self:
        """Live and not archived: a session may name it, and the proxy uses its credentials."""
        return self.live().filter(archived_at__isnull=True)


class Vault(models.Model):
    """A named set of credentials a session can be given (the /v1 vault)."""

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "vlt"), editable=False)
    workspace = models.ForeignKey(
        "workbench.Workspace", on_delete=models.PROTECT, related_name="+", editable=False
    )
    display_name = models.CharField(max_length=255)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = VaultQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.display_name} ({self.id})"


class CredentialQuerySet(models.QuerySet["Credential"]):
    def live(self) -> Self:
        return self.filter(deleted_at__isnull=True)

    def usable(self) -> Self:
        """Live, not archived, in a usable vault: what the proxy may add to traffic."""
        return self.live().filter(
            archived_at__isnull=True, vault__archived_at__isnull=True, vault__deleted_at__isnull=True
        )


class SealedSecret(models.Model):
    """Secret fields, each sealed on its own by vault.crypto ({field: {"kid", "key", "ct"}}), bound to the
    record's ids and the field's name, so one field can be replaced without opening the others."""

    sealed = models.JSONField(default=dict, blank=True, editable=False)
    # Bumped on every change of a secret (a new token, a refresh), so a proxy's cache can tell.
    secret_version = models.PositiveIntegerField(default=1, editable=False)

    class Meta:
        abstract = True

    def aad(self, field: str) -> str:
        """The associated data a field's secret is bound to: the record's ids and the field."""
        raise NotImplementedError

    def seal(self, secrets: dict[str, str], *, public: crypto.PublicKeyring | None = None) -> None:
        """Seal `secrets` (field -> value) over the stored ones, with the installation's public key (or
        `public`: the egress proxy seals a refreshed token with its own keyring's)."""
        self.sealed = {
            **self.sealed,
            **{f: crypto.seal(v, self.aad(f), public).as_json() for f, v in secrets.items()},
        }

    def unseal(self, ring: crypto.Keyring) -> dict[str, str]:
        """Every secret field in the clear: only a process holding the private keyring can."""
        return {
            f: crypto.unseal(crypto.Sealed.from_json(v), self.aad(f), ring) for f, v in self.sealed.items()
        }


class Credential(SealedSecret):
    """One credential in a vault (the /v1 vault credential). `auth` holds what the API shows; the secret
    fields are sealed and never leave the egress proxy."""

    class Kind(models.TextChoices):
        STATIC_BEARER = "static_bearer"
        MCP_OAUTH = "mcp_oauth"
        ENVIRONMENT_VARIABLE = "environment_variable"

    id = models.CharField(primary_key=True, max_length=40, default=partial(new_id, "vcrd"), editable=False)
    vault = models.ForeignKey(Vault, on_delete=models.CASCADE, related_name="credentials")
    kind = models.CharField(max_length=32, choices=Kind.choices, editable=False)
    display_name = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - the API tells null
    metadata = models.JSONField(default=dict, blank=True)
    auth = models.JSONField(help_text="The auth object as the API returns it: no secret fields.")
    # For MCP credentials, the server URL normalised (vault.rules.mcp_url_key), so a session's credential
    # for a server is found by equality.
    mcp_server = models.CharField(max_length=2048, blank=True, default="", db_index=True)
    secret_name = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = CredentialQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One live credential per MCP server, and one per variable name, in a vault.
            models.UniqueConstraint(
                fields=["vault", "mcp_server"],
                condition=models.Q(deleted_at__isnull=True, archived_at__isnull=True)
                & ~models.Q(mcp_server=""),
                name="credential_live_mcp_server_unique",
            ),
            models.UniqueConstraint(
                fields=["vault", "secret_name"],
                condition=models.Q(deleted_at__isnull=True, archived_at__isnull=True)
                & ~models.Q(secret_name=""),
                name="credential_live_secret_name_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.display_name or self.kind} ({self.id})"

    def aad(self, field: str) -> str:
        return f"credential|{self.vault_id}|{self.id}|{self.kind}|{field}"


class RepositorySecret(SealedSecret):
    """A session's repository token (a github_repository resource's `authorization_token`): sealed, never
    copied into a fork, added to git's traffic by the egress proxy for that repository alone."""

    session = models.ForeignKey(
        "agent_sessions.Session", on_delete=models.CASCADE, related_name="repository_secrets"
    )
    resource_id = models.CharField(max_length=40)
    # The repository's URL without credentials: the proxy adds the token to requests under it only.
    url = models.CharField(max_length=2048)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "resource_id"], name="repository_secret_unique")
        ]

    def __str__(self) -> str:
        return f"token for {self.url} ({self.session_id})"

    def aad(self, field: str) -> str:
        return f"repository|{self.session_id}|{self.resource_id}|{field}"


class CredentialUse(models.Model):
    """The audit trail: every use of a secret, and every refusal, by whom and where. Rows are only added."""

    class Action(models.TextChoices):
        INJECT = "inject"  # added to an outbound request
        REFUSE = "refuse"  # a request that would have needed it, or a host outside the allowlist, refused
        REFRESH = "refresh"  # an OAuth token refreshed
        VALIDATE = "validate"
        CREATE = "create"
        UPDATE = "update"
        ARCHIVE = "archive"
        DELETE = "delete"
        REWRAP = "rewrap"  # its data key sealed to a new key-encryption key

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=16, choices=Action.choices)
    allowed = models.BooleanField(default=True)
    # Ids as strings, not foreign keys: the trail outlives what it names.
    credential_id = models.CharField(max_length=40, blank=True, default="", db_index=True)
    vault_id = models.CharField(max_length=40, blank=True, default="")
    session_id = models.CharField(max_length=40, blank=True, default="", db_index=True)
    sandbox_id = models.CharField(max_length=40, blank=True, default="")
    actor = models.CharField(max_length=200, help_text="The process or key that did it.")
    host = models.CharField(max_length=300, blank=True, default="")
    detail = models.TextField(blank=True, default="", help_text="What happened, in words; never a secret.")

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.action} {self.credential_id or self.session_id}"
