"""Logging in and out, choosing the workspace, and the static files Daphne does not serve by itself."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import logout as end_login
from django.contrib.auth.views import LoginView
from django.contrib.staticfiles.views import serve
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import reverse
from django.views.decorators.http import require_POST

from workbench.ui.http import (
    CURRENT_WORKSPACE,
    OperatorLoginForm,
    member_workspaces,
    operator_only,
    redirect_to,
)

login = LoginView.as_view(
    template_name="ui/login.html",
    authentication_form=OperatorLoginForm,
    redirect_authenticated_user=True,
    next_page="ui:sessions",
)


@require_POST
def logout(request: HttpRequest) -> HttpResponse:
    end_login(request)
    return redirect_to(request, reverse("ui:login"))


@require_POST
@operator_only
def workspace_switch(request: HttpRequest) -> HttpResponse:
    """Make one of the person's workspaces the one lists show and new objects go to."""
    slug = request.POST.get("workspace", "")
    found = next((w for w, _ in member_workspaces(request.user) if w.slug == slug), None)
    if found is None:
        messages.error(
            request, f"You are not a member of a workspace {slug!r}; ask one of its admins to add you."
        )
    else:
        request.session[CURRENT_WORKSPACE] = found.id
    return redirect_to(request, reverse("ui:sessions"))


def static(request: HttpRequest, path: str) -> HttpResponseBase:
    """The app's static files (found by the staticfiles finders), for Daphne, which serves none.

    A deployment behind a web server serves `collectstatic`'s STATIC_ROOT there instead.
    """
    return serve(request, path, insecure=True)
