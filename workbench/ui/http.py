"""What every UI view shares: the operator check, htmx-aware redirects, and error rendering."""

from __future__ import annotations

import functools
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import Any
from urllib.parse import urlencode

from channels.db import database_sync_to_async
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from kernel.api.errors import from_domain
from kernel.errors import DomainError


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


def operator_required(view: Callable[..., Any]) -> Callable[..., Any]:
    """Every UI page is for staff users only; others go to the UI's login page (sync and async views)."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            user = await database_sync_to_async(_user, thread_sensitive=False)(request)
            if not _is_operator(user):
                return _refusal(request, user)
            return await view(request, *args, **kwargs)

        return async_wrapper

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
