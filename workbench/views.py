from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from workbench.api.endpoint import error_response
from workbench.api.errors import NotFound


def api_not_found(request: HttpRequest, rest: str) -> HttpResponse:
    return error_response(NotFound(f"There is no API endpoint {request.method} /v1/{rest}."), "req_none")


def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@login_required
def home(request: HttpRequest) -> HttpResponse:
    from sessions.models import Session

    sessions = Session.objects.filter(deleted_at__isnull=True).select_related("environment")[:50]
    return render(request, "workbench/home.html", {"sessions": sessions})
