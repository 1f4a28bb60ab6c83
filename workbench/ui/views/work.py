"""A self-hosted environment on its page: the work queue, its environment keys (issued, shown once, revoked),
and how to run the SDK's worker against it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_POST

from kernel.api.errors import InvalidRequest
from kernel.api.pagination import keyset_page
from kernel.errors import DomainError, NotFound
from sandboxes.environments import get_environment
from sandboxes.models import Environment, WorkItem, WorkPoller
from sandboxes.work_keys import environment_key_create, environment_key_revoke, environment_keys
from sandboxes.work_queue import POLLERS_WINDOW, work_stats
from workbench.ui.forms import EnvironmentKeyForm
from workbench.ui.http import ADMIN, here, member, status_of

SELF_HOSTED = "self_hosted"
ITEMS_PER_PAGE = 50


def is_self_hosted(environment: Environment) -> bool:
    return bool(environment.config.get("type") == SELF_HOSTED)


def queue_rows(environments: Any) -> list[tuple[Environment, dict[str, Any] | None]]:
    """Each environment with its queue's stats, None for one that is not self-hosted (it has no queue).
    One stats read per self-hosted environment: there are few, and work_stats is where the numbers are defined."""
    return [(e, work_stats(e.id) if is_self_hosted(e) else None) for e in environments]


def _when(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def self_hosted_context(request: HttpRequest, environment: Environment, *, page: str = "") -> dict[str, Any]:
    """What the environment's page shows of its queue: the stats, a page of its items (newest first), the
    workers seen polling, its keys, and the installation's base URL for the worker command."""
    stats = work_stats(environment.id)
    items = WorkItem.objects.filter(environment_id=environment.id).select_related("session")
    page_error = ""
    try:
        listing = keyset_page(items, page or None, order="desc", limit=ITEMS_PER_PAGE)
    except InvalidRequest as error:
        page_error, page = error.message, ""
        listing = keyset_page(items, None, order="desc", limit=ITEMS_PER_PAGE)
    pollers = WorkPoller.objects.filter(
        environment_id=environment.id, last_polled_at__gte=timezone.now() - POLLERS_WINDOW
    ).order_by("-last_polled_at", "worker_id")
    return {
        "stats": stats,
        "oldest_queued_at": _when(stats["oldest_queued_at"]),
        "pollers": list(pollers),
        "polling_window": int(POLLERS_WINDOW.total_seconds()),
        "items": listing["rows"],
        "older_page": listing["next_page"],
        "paged": bool(page),
        "page_error": page_error,
        **_keys_context(environment),
        "base_url": request.build_absolute_uri("/").rstrip("/"),
    }


def _keys_context(environment: Environment, **extra: Any) -> dict[str, Any]:
    return {
        "environment": environment,
        "keys": environment_keys(environment.id),
        "key_form": EnvironmentKeyForm(),
        **extra,
    }


def _self_hosted_or_404(environment_id: str) -> Environment:
    try:
        environment = get_environment(environment_id)
    except NotFound:
        raise Http404(f"No environment with id {environment_id!r}.") from None
    if not is_self_hosted(environment):
        raise Http404(f"Environment {environment_id} is not self-hosted; only a self-hosted one has keys.")
    return environment


@require_POST
@member(write=ADMIN)
def environment_key_create_view(request: HttpRequest, environment_id: str) -> HttpResponse:
    environment = _self_hosted_or_404(environment_id)
    form = EnvironmentKeyForm(request.POST)
    context: dict[str, Any] = {}
    status = 400
    if form.is_valid():
        try:
            key, raw = environment_key_create(
                environment.id, name=form.cleaned_data["name"], actor=here(request).actor
            )
        except DomainError as error:
            form.add_error(None, error.message)
            status = status_of(error)
        else:
            context.update(created=key, raw=raw)
            form, status = EnvironmentKeyForm(), 200
    response = render(
        request,
        "ui/environments/_keys.html",
        _keys_context(environment, key_form=form, **context),
        status=status,
    )
    # The key is in this answer only: never cache it, never show it again.
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@member(write=ADMIN)
def environment_key_revoke_view(request: HttpRequest, environment_id: str, key_id: str) -> HttpResponse:
    environment = _self_hosted_or_404(environment_id)
    try:
        key = environment_key_revoke(environment.id, key_id, actor=here(request).actor)
    except DomainError as error:
        context = _keys_context(environment, error=error.message)
        return render(request, "ui/environments/_keys.html", context, status=status_of(error))
    notice = (
        f"Revoked {key.name or key.id} ({key.prefix}…): a worker using it is refused from its next request."
    )
    return render(request, "ui/environments/_keys.html", _keys_context(environment, notice=notice))
