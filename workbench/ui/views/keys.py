"""API keys of the current workspace (its admins only): create, full or read-only (the key is shown once, in
the answer to the POST), list, revoke."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from kernel.errors import DomainError
from kernel.keys import api_key_create, api_key_revoke
from kernel.models import ApiKey
from workbench.ui.forms import ApiKeyForm
from workbench.ui.http import ADMIN, here, member, redirect_to, status_of


def _keys(request: HttpRequest) -> list[ApiKey]:
    return list(ApiKey.objects.filter(workspace=here(request).workspace).select_related("created_by"))


@member(read=ADMIN, write=ADMIN)
def key_list(request: HttpRequest) -> HttpResponse:
    return render(request, "ui/keys/list.html", {"keys": _keys(request), "form": ApiKeyForm()})


@require_POST
@member(read=ADMIN, write=ADMIN)
def key_create(request: HttpRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST)
    context: dict[str, object] = {"form": form}
    status = 400
    if form.is_valid():
        try:
            key, raw = api_key_create(
                name=form.cleaned_data["name"],
                read_only=form.cleaned_data["read_only"],
                workspace_id=here(request).workspace.id,
                created_by=request.user,
                actor=here(request).actor,
            )
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            context.update(created=key, raw=raw, form=ApiKeyForm())
            status = 200
    response = render(request, "ui/keys/_keys.html", {**context, "keys": _keys(request)}, status=status)
    # The raw key is in this answer only: never cache it, never show it again.
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@member(read=ADMIN, write=ADMIN)
def key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    try:
        api_key_revoke(key_id, workspace_id=here(request).workspace.id, actor=here(request).actor)
    except DomainError as error:
        return render(
            request,
            "ui/keys/_keys.html",
            {"keys": _keys(request), "form": ApiKeyForm(), "error": error.message},
            status=status_of(error),
        )
    return redirect_to(request, reverse("ui:keys"))
