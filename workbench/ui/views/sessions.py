"""The sessions list, starting a session, the session page and its side panel (brains and hands)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from harness.model import describe_model
from harness.services.lifecycle import session_archive, session_create, session_update
from kernel.errors import DomainError
from sandboxes.hands import held
from sessions.models import Session
from sessions.selectors import get_session
from sessions.services import SessionNotFound
from workbench.ui import selectors
from workbench.ui.forms import HarnessForm, StartSessionForm
from workbench.ui.http import here, is_htmx, member, redirect_to, status_of
from workbench.ui.presenters import preview_view

# The timeline opens on this many events at the tail of the log.
TAIL = 100


def session_or_404(session_id: str) -> Session:
    try:
        return get_session(session_id)
    except SessionNotFound:
        raise Http404(f"No session with id {session_id!r}.") from None


def _start_form(
    request: HttpRequest, data: Any = None, *, agents: list[tuple[str, str]] | None = None
) -> StartSessionForm:
    workspace_id = here(request).workspace.id
    return StartSessionForm(
        data,
        agents=selectors.agent_choices(workspace_id) if agents is None else agents,
        environments=selectors.environment_choices(workspace_id),
    )


@member()
def session_list(request: HttpRequest) -> HttpResponse:
    status, agent = request.GET.get("status", ""), request.GET.get("agent", "")
    context = {
        "sessions": selectors.session_rows(here(request).workspace.id, status=status, agent_id=agent),
        "status": status,
        "agent": agent,
        "statuses": [*selectors.STATUSES, "archived"],
        "filtered": bool(status or agent),
    }
    if is_htmx(request) and request.headers.get("HX-Target") == "session-rows":
        return render(request, "ui/sessions/_rows.html", context)
    agents = selectors.agent_choices(here(request).workspace.id)
    context.update(form=_start_form(request, agents=agents), agents=agents, model=describe_model())
    return render(request, "ui/sessions/list.html", context)


@require_POST
@member()
def session_start(request: HttpRequest) -> HttpResponse:
    form = _start_form(request, request.POST)
    if form.is_valid():
        try:
            session = session_create(
                **form.service_args(), workspace_id=here(request).workspace.id, actor=here(request).actor
            )
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            return redirect_to(request, reverse("ui:session", args=[session.id]))
    return render(request, "ui/sessions/_start_form.html", {"form": form}, status=400)


def panel_context(session: Any, **extra: Any) -> dict[str, Any]:
    brain = selectors.session_brain(session)
    return {
        "session": session,
        "brain": brain,
        "model": describe_model(),
        "hands": held(session.id),
        "free": selectors.free_sandboxes(session.workspace_id),
        "targets": selectors.transfer_targets(session),
        "harness_form": HarnessForm(initial={"harness": brain.harness}),
        **extra,
    }


@member()
def session_detail(request: HttpRequest, session_id: str) -> HttpResponse:
    session = session_or_404(session_id)
    timeline = selectors.timeline_slice(session.id, -TAIL, None)
    return render(
        request,
        "ui/sessions/detail.html",
        {
            **panel_context(session),
            "timeline": timeline,
            "preview": preview_view(),
            "base": request.path,
            "replay_from": max(0, timeline.length - 50),
        },
    )


@member()
def session_panel(request: HttpRequest, session_id: str) -> HttpResponse:
    return render(request, "ui/sessions/_panel.html", panel_context(session_or_404(session_id)))


def render_panel(
    request: HttpRequest, session_id: str, *, error: str = "", notice: str = "", status: int = 200
) -> HttpResponse:
    """The panel after an action, saying what happened or what went wrong."""
    context = panel_context(session_or_404(session_id), error=error, notice=notice)
    return render(request, "ui/sessions/_panel.html", context, status=status)


@require_POST
@member()
def session_harness(request: HttpRequest, session_id: str) -> HttpResponse:
    form = HarnessForm(request.POST)
    if not form.is_valid():
        return render_panel(request, session_id, error="Choose one of the harnesses listed.", status=400)
    try:
        session_update(session_id, harness=form.cleaned_data["harness"], actor=here(request).actor)
    except DomainError as error:
        return render_panel(request, session_id, error=error.message, status=status_of(error))
    return render_panel(request, session_id, notice=f"The next turn runs on {form.cleaned_data['harness']}.")


@require_POST
@member()
def session_archive_view(request: HttpRequest, session_id: str) -> HttpResponse:
    try:
        session_archive(session_id)
    except DomainError as error:
        return render_panel(request, session_id, error=error.message, status=status_of(error))
    return redirect_to(request, reverse("ui:session", args=[session_id]))
