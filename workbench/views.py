from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from kernel.api.edge import error_response
from kernel.api.errors import NotFound


def api_not_found(request: HttpRequest, rest: str) -> HttpResponse:
    return error_response(NotFound(f"There is no API endpoint {request.method} /v1/{rest}."), "req_none")
