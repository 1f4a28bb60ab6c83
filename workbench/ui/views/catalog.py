"""Agents and environments: list, create, edit (an agent's edit is a new version), archive; a self-hosted
environment's page also shows its work queue and keys (views/work.py)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from harness.agents import agent_archive, agent_create, agent_update, get_agent_version
from harness.models import Agent, AgentVersion
from kernel.errors import DomainError, NotFound
from sandboxes.environments import (
    environment_archive,
    environment_create,
    environment_update,
    get_environment,
)
from sandboxes.models import Environment
from workbench.ui.forms import AgentForm, EnvironmentForm
from workbench.ui.http import OPERATOR, here, member, redirect_to
from workbench.ui.views.work import is_self_hosted, queue_rows, self_hosted_context


@member()
def agent_list(request: HttpRequest) -> HttpResponse:
    show_archived = request.GET.get("archived") == "1"
    agents = Agent.objects.filter(workspace=here(request).workspace)
    if not show_archived:
        agents = agents.filter(archived_at__isnull=True)
    latest = {(v.agent_id, v.version): v for v in AgentVersion.objects.filter(agent__in=agents)}
    rows = [(agent, latest.get((agent.id, agent.version))) for agent in agents]
    return render(request, "ui/agents/list.html", {"rows": rows, "show_archived": show_archived})


@member(read=OPERATOR)
def agent_new(request: HttpRequest) -> HttpResponse:
    form = AgentForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            version = agent_create(workspace_id=here(request).workspace.id, **form.service_args())
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            messages.success(request, f"Created agent {version.config['name']} ({version.agent_id}).")
            return redirect_to(request, reverse("ui:agents"))
    return _agent_form(request, form, agent=None)


@member()
def agent_edit(request: HttpRequest, agent_id: str) -> HttpResponse:
    try:
        current = get_agent_version(agent_id)
    except NotFound:
        raise Http404(f"No agent with id {agent_id!r}.") from None
    form = AgentForm(request.POST) if request.method == "POST" else AgentForm.from_config(current.config)
    if request.method == "POST" and form.is_valid():
        try:
            version = agent_update(agent_id, version=current.version, **form.service_args())
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            if version.version == current.version:
                messages.info(request, f"Nothing changed; {agent_id} stays at version {version.version}.")
            else:
                messages.success(request, f"Saved {agent_id} as version {version.version}.")
            return redirect_to(request, reverse("ui:agents"))
    return _agent_form(request, form, agent=current)


def _agent_form(request: HttpRequest, form: AgentForm, *, agent: AgentVersion | None) -> HttpResponse:
    status = 400 if form.is_bound and form.errors else 200
    template = "ui/agents/_form.html" if request.method == "POST" else "ui/agents/form.html"
    return render(request, template, {"form": form, "agent": agent}, status=status)


@require_POST
@member()
def agent_archive_view(request: HttpRequest, agent_id: str) -> HttpResponse:
    try:
        agent_archive(agent_id)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(
            request, f"Archived {agent_id}; its sessions keep running, new ones cannot start from it."
        )
    return redirect_to(request, reverse("ui:agents"))


@member()
def environment_list(request: HttpRequest) -> HttpResponse:
    show_archived = request.GET.get("archived") == "1"
    environments = Environment.objects.live().filter(workspace=here(request).workspace)
    if not show_archived:
        environments = environments.filter(archived_at__isnull=True)
    return render(
        request,
        "ui/environments/list.html",
        {"rows": queue_rows(environments), "show_archived": show_archived},
    )


@member(read=OPERATOR)
def environment_new(request: HttpRequest) -> HttpResponse:
    form = EnvironmentForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            environment = environment_create(workspace_id=here(request).workspace.id, **form.service_args())
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            messages.success(request, f"Created environment {environment.name} ({environment.id}).")
            return redirect_to(request, reverse("ui:environments"))
    return _environment_form(request, form, environment=None)


@member()
def environment_edit(request: HttpRequest, environment_id: str) -> HttpResponse:
    try:
        environment = get_environment(environment_id)
    except NotFound:
        raise Http404(f"No environment with id {environment_id!r}.") from None
    form = (
        EnvironmentForm(request.POST)
        if request.method == "POST"
        else EnvironmentForm.from_environment(environment)
    )
    if request.method == "POST" and form.is_valid():
        try:
            environment_update(environment_id, **form.service_args())
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            messages.success(request, f"Saved environment {environment_id}.")
            return redirect_to(request, reverse("ui:environments"))
    return _environment_form(request, form, environment=environment)


def _environment_form(
    request: HttpRequest, form: EnvironmentForm, *, environment: Environment | None
) -> HttpResponse:
    status = 400 if form.is_bound and form.errors else 200
    if request.method == "POST":
        return render(
            request, "ui/environments/_form.html", {"form": form, "environment": environment}, status=status
        )
    context: dict[str, Any] = {"form": form, "environment": environment}
    if environment is not None and is_self_hosted(environment):
        context.update(
            self_hosted_context(request, environment, page=request.GET.get("page", "")), self_hosted=True
        )
    return render(request, "ui/environments/form.html", context, status=status)


@require_POST
@member()
def environment_archive_view(request: HttpRequest, environment_id: str) -> HttpResponse:
    try:
        environment_archive(environment_id)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Archived {environment_id}; new sessions cannot start in it.")
    return redirect_to(request, reverse("ui:environments"))
