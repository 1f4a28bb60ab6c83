"""What every UI view shares: the workspace and role check, htmx-aware redirects, and error rendering."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from inspect import iscoroutinefunction
from typing import Any
from urllib.parse import urlencode

from channels.db import database_sync_to_async
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from kernel.api.errors import from_domain
from kernel.errors import DomainError
from kernel.models import ApiKey, Membership, Workspace
from kernel.tenancy import CHILD_PARAMS, may, owner
from sandboxes.models import Sandbox


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def is_fragment_request(request: HttpRequest) -> bool:
    """htmx, or the timeline's own fetches: callers that want a fragment or a status, not a page."""
    return is_htmx(request) or request.headers.get("X-Workbench-Fragment") == "1"


def redirect_to(request: HttpRequest, url: str) -> HttpResponse:
    """A redirect htmx follows as a page load (HX-Redirect), or a plain 302."""
    if is_htmx(request):
        response = HttpResponse(status=200)
        response["HX-Redirect"] = url
        return response
    return HttpResponseRedirect(url)


def _refusal(request: HttpRequest, user: Any) -> HttpResponse:
    if user is not None and user.is_authenticated:
        return render(request, "ui/403.html", status=403)
    login = f"{reverse('ui:login')}?{urlencode({'next': request.get_full_path()})}"
    if is_htmx(request):
        return redirect_to(request, login)
    if is_fragment_request(request):
        return HttpResponse(
            "Your login has expired; reload the page to log in again.", status=401, content_type="text/plain"
        )
    return HttpResponseRedirect(login)


def _user(request: HttpRequest) -> Any:
    """The request's user, loaded on a long-lived worker thread rather than the request's own.

    Under ASGI every request's sync code runs on a thread of its own, which opens a database connection of
    its own; the shared pool's threads keep theirs (channels' `database_sync_to_async` looks after them).
    """
    user = request.user
    user.is_authenticated  # noqa: B018 - evaluates the lazy user here, on this thread
    return user


def _is_operator(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


VIEWER, OPERATOR, ADMIN = Membership.Role.VIEWER, Membership.Role.OPERATOR, Membership.Role.ADMIN
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
CURRENT_WORKSPACE = "workspace"  # the login session's key for the workspace lists and new objects are in


def _sandbox_workspace(sandbox_id: str) -> str | None:
    found: str | None = (
        Sandbox.objects.filter(id=sandbox_id).values_list("environment__workspace_id", flat=True).first()
    )
    return found


def _key_workspace(key_id: Any) -> str | None:
    found: str | None = ApiKey.objects.filter(pk=key_id).values_list("workspace_id", flat=True).first()
    return found


# What the UI's paths name beyond /v1's: a sandbox by itself, an API key by its number.
UI_OWNERS: dict[str, Callable[[Any], str | None]] = {
    "sandbox_id": _sandbox_workspace,
    "key_id": _key_workspace,
}


@dataclass(frozen=True)
class Here:
    """Where a UI request acts: its workspace, the person's role there, the workspaces they may switch to,
    and the actor recorded with what they do."""

    workspace: Workspace
    role: str
    workspaces: list[tuple[Workspace, str]]
    actor: str

    @property
    def can_operate(self) -> bool:
        return may(self.role, OPERATOR)

    @property
    def is_admin(self) -> bool:
        return may(self.role, ADMIN)


def here(request: HttpRequest) -> Here:
    """What `member` found for this request."""
    found: Here = request.here  # type: ignore[attr-defined]
    return found


def path_workspace(params: dict[str, Any]) -> str | None:
    """The workspace of the objects a page's path names (None if it names none). One missing answers 404;
    a child named with its parent (a credential in a vault) is looked up under the parent by the view."""
    found = None
    for name, value in params.items():
        if CHILD_PARAMS.get(name) in params:
            continue
        rule = owner(name)
        lookup = rule.workspace_of if rule is not None else UI_OWNERS.get(name)
        if lookup is None:
            continue
        workspace = lookup(value)
        if workspace is None or found not in (None, workspace):
            raise Http404(f"There is no {name.removesuffix('_id')} {value!r}.")
        found = workspace
    return found


def member_workspaces(user: Any) -> list[tuple[Workspace, str]]:
    """The workspaces a person may open, with their role in each (a superuser: all, as admin)."""
    if user.is_superuser:
        return [(workspace, ADMIN) for workspace in Workspace.objects.all()]
    memberships = Membership.objects.filter(user=user).select_related("workspace").order_by("workspace__slug")
    return [(m.workspace, m.role) for m in memberships]


def _admit(request: HttpRequest, params: dict[str, Any], read: str, write: str) -> HttpResponse | None:
    """None when the request may go on (with `request.here` set), else
    the page that says why not. Another workspace's object answers as a missing one (404); a role that may
    not do this, 403 saying which role may."""
    user = _user(request)
    if not _is_operator(user):
        return _refusal(request, user)
    workspaces = member_workspaces(user)
    roles = {workspace.id: role for workspace, role in workspaces}
    named = path_workspace(params)
    if named is not None:
        if named not in roles:
            raise Http404("There is no such object in your workspaces.")
        workspace = next(w for w, _ in workspaces if w.id == named)
    elif not workspaces:
        return render(request, "ui/403.html", {"no_workspace": True}, status=403)
    else:
        chosen = request.session.get(CURRENT_WORKSPACE)
        workspace = next((w for w, _ in workspaces if w.id == chosen), workspaces[0][0])
    role = roles[workspace.id]
    request.here = Here(workspace, role, workspaces, f"user {user.get_username()}")  # type: ignore[attr-defined]
    needed = read if request.method in SAFE_METHODS else write
    if not may(role, needed):
        context = {"role": role, "needed": needed, "workspace": workspace}
        if is_fragment_request(request):
            return render(request, "ui/_error.html", {"error": role_refusal(context)}, status=403)
        return render(request, "ui/403.html", context, status=403)
    return None


def role_refusal(context: dict[str, Any]) -> str:
    return (
        f"Your role in workspace {context['workspace'].slug} is {context['role']}; this needs "
        f"{context['needed']} or above. Ask one of its admins."
    )


def member(*, read: str = VIEWER, write: str = OPERATOR) -> Any:
    """A UI page for operators (active staff) in the workspace it shows: the one its path's objects belong
    to, else the one chosen in the header. Reading needs `read`, anything else `write` (viewer < operator <
    admin); sync and async views."""

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                refused = await database_sync_to_async(_admit, thread_sensitive=False)(
                    request, kwargs, read, write
                )
                if refused is not None:
                    return refused
                return await view(request, *args, **kwargs)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            refused = _admit(request, kwargs, read, write)
            if refused is not None:
                return refused
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def operator_only(view: Callable[..., Any]) -> Callable[..., Any]:
    """A page of no workspace (choosing one): any operator."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not _is_operator(request.user):
            return _refusal(request, request.user)
        return view(request, *args, **kwargs)

    return wrapper


class OperatorLoginForm(AuthenticationForm):
    """Django's login form, refusing accounts that are not operators (staff)."""

    def confirm_login_allowed(self, user: Any) -> None:
        super().confirm_login_allowed(user)
        if not user.is_staff:
            raise ValidationError(
                "This account is not an operator account; ask an admin to make it staff.", code="not_staff"
            )


def status_of(error: DomainError) -> int:
    """The HTTP status a page answers a service's refusal with: the same as the API's."""
    return from_domain(error).status
