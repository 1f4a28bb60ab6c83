"""Middleware of the pages (not `/v1`, which checks its own parameters in `kernel.api.edge`)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse

from kernel.api.validation import text_problem


def refuse_what_is_not_text(request: HttpRequest) -> None:
    """An address no page can have is a 404, a query no form sends a 400 (Django renders both pages).
    `/v1` checks its own, in its error envelope (it reaches this middleware only through the test client)."""
    if request.path == "/v1" or request.path.startswith("/v1/"):
        return
    problem = text_problem(request.path)
    if problem:
        raise Http404(f"No page has this address: it holds {problem}.")
    for name, values in request.GET.lists():
        for value in (name, *values):
            problem = text_problem(value)
            if problem:
                raise BadRequest(f"The query holds {problem}.")


class RefuseNonText:
    """A page whose address (404) or query (400) holds a NUL or an unpaired surrogate is refused: no view, the admin's
    included, hands such text to the database (PostgreSQL refuses it with an error, a 500 otherwise).
    Sync and async, so it adds no thread hop under ASGI."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._async_call(request)
        refuse_what_is_not_text(request)
        return self.get_response(request)

    async def _async_call(self, request: HttpRequest) -> HttpResponse:
        refuse_what_is_not_text(request)
        return await self.get_response(request)
