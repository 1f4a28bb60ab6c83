"""Hands: a session's sandboxes (provision, attach, detach, pass on, terminate) and every sandbox."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from kernel.errors import DomainError, NotFound
from sandboxes.hands import (
    sandbox_attach,
    sandbox_detach,
    sandbox_provision,
    sandbox_terminate,
    sandbox_transfer,
)
from sandboxes.models import Sandbox
from sandboxes.providers import SandboxError
from workbench.ui import selectors
from workbench.ui.forms import AttachForm, ProvisionForm, TransferForm
from workbench.ui.http import here, member, redirect_to, status_of
from workbench.ui.views.sessions import render_panel


def _act(
    request: HttpRequest, session_id: str, action: Callable[[], Any], notice: Callable[[Any], str]
) -> HttpResponse:
    """Run one hands service and show the panel with what happened."""
    try:
        result = action()
    except DomainError as error:
        return render_panel(request, session_id, error=error.message, status=status_of(error))
    except SandboxError as error:
        return render_panel(request, session_id, error=f"The sandbox provider failed: {error}", status=503)
    return render_panel(request, session_id, notice=notice(result))


def _held(session_id: str, sandbox_id: str) -> None:
    if not Sandbox.objects.filter(id=sandbox_id, session_id=session_id).exists():
        raise NotFound(
            "sandbox",
            sandbox_id,
            f"Session {session_id} no longer holds sandbox {sandbox_id}; the panel was out of date.",
        )


@require_POST
@member()
def provision(request: HttpRequest, session_id: str) -> HttpResponse:
    form = ProvisionForm(request.POST)
    if not form.is_valid():
        return render_panel(request, session_id, error="Give the new sandbox a name.", status=400)
    return _act(
        request,
        session_id,
        lambda: sandbox_provision(session_id, name=form.cleaned_data["name"]),
        lambda sandbox: f"Provisioned {sandbox.name} ({sandbox.id}).",
    )


@require_POST
@member()
def attach(request: HttpRequest, session_id: str) -> HttpResponse:
    form = AttachForm(request.POST)
    if not form.is_valid():
        return render_panel(request, session_id, error="Pick a free sandbox to attach.", status=400)
    data = form.cleaned_data
    return _act(
        request,
        session_id,
        lambda: sandbox_attach(
            data["sandbox"], session_id, name=data["name"] or None, actor=here(request).actor
        ),
        lambda sandbox: f"Attached {sandbox.id} as {sandbox.name}.",
    )


@require_POST
@member()
def detach(request: HttpRequest, session_id: str, sandbox_id: str) -> HttpResponse:
    def action() -> Any:
        _held(session_id, sandbox_id)
        return sandbox_detach(sandbox_id)

    return _act(
        request, session_id, action, lambda sandbox: f"Detached {sandbox.id}; it is free for another session."
    )


@require_POST
@member()
def transfer(request: HttpRequest, session_id: str, sandbox_id: str) -> HttpResponse:
    form = TransferForm(request.POST)
    if not form.is_valid():
        return render_panel(request, session_id, error="Pick the session to pass the sandbox to.", status=400)

    def action() -> Any:
        _held(session_id, sandbox_id)
        return sandbox_transfer(sandbox_id, form.cleaned_data["to_session"], actor=here(request).actor)

    return _act(
        request,
        session_id,
        action,
        lambda sandbox: f"Passed {sandbox.id} to session {sandbox.session_id} (named {sandbox.name} there).",
    )


@require_POST
@member()
def terminate(request: HttpRequest, session_id: str, sandbox_id: str) -> HttpResponse:
    def action() -> Any:
        _held(session_id, sandbox_id)
        return sandbox_terminate(sandbox_id, actor=here(request).actor)

    return _act(request, session_id, action, lambda sandbox: f"Terminated {sandbox.id}.")


@member()
def sandbox_list(request: HttpRequest) -> HttpResponse:
    include_ended = request.GET.get("all") == "1"
    return render(
        request,
        "ui/sandboxes/list.html",
        {
            "sandboxes": selectors.all_sandboxes(here(request).workspace.id, include_ended=include_ended),
            "include_ended": include_ended,
        },
    )


@require_POST
@member()
def sandbox_terminate_view(request: HttpRequest, sandbox_id: str) -> HttpResponse:
    try:
        sandbox_terminate(sandbox_id, actor=here(request).actor)
    except DomainError as error:
        return render(request, "ui/_error.html", {"error": error.message}, status=status_of(error))
    return redirect_to(request, reverse("ui:sandboxes"))
