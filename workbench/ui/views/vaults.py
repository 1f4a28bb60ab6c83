"""Vaults: create one, add or replace a credential, see where each was last used, archive."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from kernel.errors import DomainError, NotFound
from vault.models import Credential, CredentialUse, Vault
from vault.rules import REPLACEABLE_SECRET
from vault.services import (
    credential_archive,
    credential_create,
    credential_update,
    get_vault,
    vault_archive,
    vault_create,
)
from workbench.ui.forms import CredentialForm, ReplaceSecretForm, VaultForm
from workbench.ui.http import ADMIN, here, member, redirect_to, status_of


def _vault_or_404(vault_id: str) -> Vault:
    try:
        return get_vault(vault_id)
    except NotFound:
        raise Http404(f"No vault with id {vault_id!r}.") from None


@member(write=ADMIN)
def vault_list(request: HttpRequest) -> HttpResponse:
    form = VaultForm(request.POST or None)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                vault = vault_create(
                    display_name=form.cleaned_data["display_name"], workspace_id=here(request).workspace.id
                )
            except DomainError as error:
                form.add_error(None, error.message)
                status = status_of(error)
            else:
                messages.success(request, f"Created vault {vault.display_name} ({vault.id}).")
                return redirect_to(request, reverse("ui:vault", args=[vault.id]))
    show_archived = request.GET.get("archived") == "1"
    vaults = (
        Vault.objects.live()
        .filter(workspace=here(request).workspace)
        .annotate(
            credential_count=Count(
                "credentials",
                filter=Q(credentials__deleted_at__isnull=True, credentials__archived_at__isnull=True),
            )
        )
    )
    if not show_archived:
        vaults = vaults.filter(archived_at__isnull=True)
    context = {"vaults": vaults, "form": form, "show_archived": show_archived}
    return render(request, "ui/vaults/list.html", context, status=status)


def _detail(request: HttpRequest, vault: Vault, **extra: Any) -> dict[str, Any]:
    credentials = list(vault.credentials.live().order_by("archived_at", "-created_at"))
    ids = [c.id for c in credentials]
    uses = CredentialUse.objects.filter(Q(vault_id=vault.id) | Q(credential_id__in=ids))[:30]
    last_use: dict[str, CredentialUse] = {}
    for use in CredentialUse.objects.filter(credential_id__in=ids, action__in=["inject", "refresh"]).order_by(
        "-at"
    ):
        last_use.setdefault(use.credential_id, use)
    rows = [(c, last_use.get(c.id)) for c in credentials]
    return {
        "vault": vault,
        "rows": rows,
        "uses": uses,
        "form": CredentialForm(),
        "replace": ReplaceSecretForm(),
        **extra,
    }


@member(write=ADMIN)
def vault_detail(request: HttpRequest, vault_id: str) -> HttpResponse:
    vault = _vault_or_404(vault_id)
    return render(request, "ui/vaults/detail.html", _detail(request, vault))


@require_POST
@member(write=ADMIN)
def credential_add(request: HttpRequest, vault_id: str) -> HttpResponse:
    vault = _vault_or_404(vault_id)
    form = CredentialForm(request.POST)
    status = 400
    if form.is_valid():
        try:
            credential = credential_create(
                vault.id,
                auth=form.auth(),
                actor=here(request).actor,
                display_name=form.cleaned_data["display_name"] or None,
            )
        except DomainError as error:
            form.add_error(None, error.message)
            status = status_of(error)
        else:
            messages.success(
                request, f"Added {credential.display_name or credential.kind} ({credential.id})."
            )
            return redirect_to(request, reverse("ui:vault", args=[vault.id]))
    response = render(request, "ui/vaults/detail.html", _detail(request, vault, form=form), status=status)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@member(write=ADMIN)
def credential_replace(request: HttpRequest, vault_id: str, credential_id: str) -> HttpResponse:
    vault = _vault_or_404(vault_id)
    form = ReplaceSecretForm(request.POST)
    credential = Credential.objects.live().filter(id=credential_id, vault_id=vault.id).first()
    if credential is None:
        raise Http404(f"Vault {vault_id} has no credential {credential_id!r}.")
    if form.is_valid():
        auth = {"type": credential.kind, REPLACEABLE_SECRET[credential.kind]: form.cleaned_data["secret"]}
        try:
            credential_update(vault.id, credential.id, actor=here(request).actor, auth=auth)
        except DomainError as error:
            messages.error(request, error.message)
        else:
            messages.success(request, f"Replaced the secret of {credential.display_name or credential.id}.")
    else:
        messages.error(request, "Type the new secret to replace the stored one.")
    return redirect_to(request, reverse("ui:vault", args=[vault.id]))


@require_POST
@member(write=ADMIN)
def credential_archive_view(request: HttpRequest, vault_id: str, credential_id: str) -> HttpResponse:
    try:
        credential = credential_archive(vault_id, credential_id, actor=here(request).actor)
    except NotFound:
        raise Http404(f"Vault {vault_id} has no credential {credential_id!r}.") from None
    messages.success(request, f"Archived {credential.display_name or credential.id}; it is no longer used.")
    return redirect_to(request, reverse("ui:vault", args=[vault_id]))


@require_POST
@member(write=ADMIN)
def vault_archive_view(request: HttpRequest, vault_id: str) -> HttpResponse:
    try:
        vault = vault_archive(vault_id, actor=here(request).actor)
    except NotFound:
        raise Http404(f"No vault with id {vault_id!r}.") from None
    messages.success(request, f"Archived vault {vault.display_name}; sessions no longer get its credentials.")
    return redirect_to(request, reverse("ui:vaults"))
