"""Vaults and credentials in the admin: secret fields are write-only (a form field that is never filled in
from the stored value), and the audit trail is read-only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from kernel.errors import DomainError
from vault import services
from vault.models import Credential, CredentialUse, RepositorySecret, Vault
from vault.repositories import repository_tokens_delete
from vault.rules import REPLACEABLE_SECRET


def _actor(request: HttpRequest) -> str:
    return f"admin {request.user.get_username()}"


class CredentialInline(admin.TabularInline):
    model = Credential
    fields = ("id", "kind", "display_name", "auth", "archived_at", "last_used_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(deleted_at__isnull=True)


@admin.register(Vault)
class VaultAdmin(admin.ModelAdmin):
    list_display = ("id", "display_name", "created_at", "archived_at")
    search_fields = ("id", "display_name")
    readonly_fields = ("id", "created_at", "updated_at", "archived_at", "deleted_at")
    inlines = [CredentialInline]
    actions = ["archive"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(deleted_at__isnull=True)

    @admin.action(description="Archive the selected vaults (their credentials stop being used)")
    def archive(self, request: HttpRequest, queryset: Any) -> None:
        for vault in queryset:
            services.vault_archive(vault.id, actor=_actor(request))

    def delete_model(self, request: HttpRequest, obj: Vault) -> None:
        services.vault_delete(obj.id, actor=_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for vault in queryset:
            services.vault_delete(vault.id, actor=_actor(request))


class SecretWidget(forms.PasswordInput):
    def __init__(self) -> None:
        super().__init__(render_value=False, attrs={"autocomplete": "new-password"})


class CredentialForm(forms.ModelForm):
    """A new secret replaces the stored one (rotation); left empty, the stored one stays. Nothing stored is
    ever put back into the page."""

    new_secret = forms.CharField(
        required=False,
        widget=SecretWidget(),
        label="New secret",
        help_text="The token (static_bearer), access token (mcp_oauth) or value (environment_variable). "
        "Leave empty to keep the stored one; it is never shown.",
    )

    class Meta:
        model = Credential
        fields = ("display_name", "metadata")


@admin.register(Credential)
class CredentialAdmin(admin.ModelAdmin):
    form = CredentialForm
    list_display = ("id", "kind", "display_name", "vault", "last_used_at", "archived_at")
    list_filter = ("kind",)
    search_fields = ("id", "display_name", "mcp_server", "secret_name")
    readonly_fields = (
        "id",
        "vault",
        "kind",
        "auth",
        "key_ids",
        "secret_version",
        "created_at",
        "updated_at",
        "archived_at",
        "last_used_at",
    )
    fields = (
        "id",
        "vault",
        "kind",
        "display_name",
        "metadata",
        "auth",
        "new_secret",
        "key_ids",
        "secret_version",
        "created_at",
        "updated_at",
        "archived_at",
        "last_used_at",
    )
    actions = ["archive"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(deleted_at__isnull=True)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # created through /v1 or the workbench's vault page, which check the whole auth

    @admin.display(description="Sealed to keys")
    def key_ids(self, obj: Credential) -> str:
        return ", ".join(sorted({sealed["kid"] for sealed in obj.sealed.values()})) or "(destroyed)"

    def save_model(self, request: HttpRequest, obj: Credential, form: Any, change: bool) -> None:
        secret = form.cleaned_data.get("new_secret")
        auth = {"type": obj.kind, REPLACEABLE_SECRET[obj.kind]: secret} if secret else None
        try:
            services.credential_update(
                obj.vault_id,
                obj.id,
                actor=_actor(request),
                display_name=obj.display_name,
                metadata=obj.metadata,
                **({"auth": auth} if auth else {}),
            )
        except DomainError as error:
            self.message_user(request, error.message, level="error")

    @admin.action(description="Archive the selected credentials")
    def archive(self, request: HttpRequest, queryset: Any) -> None:
        for credential in queryset:
            services.credential_archive(credential.vault_id, credential.id, actor=_actor(request))

    def delete_model(self, request: HttpRequest, obj: Credential) -> None:
        services.credential_delete(obj.vault_id, obj.id, actor=_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for credential in queryset:
            services.credential_delete(credential.vault_id, credential.id, actor=_actor(request))


@admin.register(CredentialUse)
class CredentialUseAdmin(admin.ModelAdmin):
    list_display = ("at", "action", "allowed", "credential_id", "session_id", "host", "actor")
    list_filter = ("action", "allowed")
    search_fields = ("credential_id", "vault_id", "session_id", "sandbox_id", "host", "actor")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(RepositorySecret)
class RepositorySecretAdmin(admin.ModelAdmin):
    """Which sessions hold a repository token, and its version, never the token. Tokens are set and rotated
    through the session's resources (/v1/sessions/{id}/resources); a deletion here is audited."""

    list_display = ("session", "resource_id", "url", "secret_version", "updated_at")
    search_fields = ("session__id", "resource_id", "url")
    fields = ("session", "resource_id", "url", "secret_version", "created_at", "updated_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: RepositorySecret) -> None:
        repository_tokens_delete(obj.session_id, resource_id=obj.resource_id, actor=_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for secret in queryset:
            self.delete_model(request, secret)
