import os
import sys
import uuid
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")
django_asgi_app = get_asgi_application()

from workbench.secret_key import refuse_insecure_secret_key  # noqa: E402

refuse_insecure_secret_key("web server")

from workbench.celery import GIL_SWITCH_SECONDS  # noqa: E402

# The event loop's thread serves every socket and stream; a view's thread, or the broadcaster's, woken by
# the database or Redis should not wait Python's default 5 ms for the loop to give up the GIL (and back).
sys.setswitchinterval(GIL_SWITCH_SECONDS)

from asgiref.sync import iscoroutinefunction  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402

from kernel.api.edge import internal_error  # noqa: E402
from kernel.auth import ApiKeyOrSessionAuthMiddleware  # noqa: E402
from workbench.origins import SameOriginOrTrusted  # noqa: E402
from workbench.routing import websocket_urlpatterns  # noqa: E402


class ApiHandler(ASGIHandler):
    """Django for `/v1` without the browser's middleware.

    The API authenticates by key, is CSRF-exempt and keeps no session, and under ASGI every sync
    middleware costs a hop to the request's thread and back (about 10 ms a request on 2 cores with the
    seven the pages need). The views check the host themselves (`kernel.api.edge`).
    """

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        # Django's own handlers, which its type stubs leave out.
        get_response = self._get_response_async if is_async else self._get_response  # type: ignore[attr-defined]
        self._middleware_chain = _json_errors(convert_exception_to_response(get_response))


def _json_errors(get_response: Any) -> Any:
    """Django's own error pages are HTML; an API client gets every 5xx in the `/v1` envelope instead (a
    view's errors are already enveloped by `kernel.api.edge`; these are the ones outside a view)."""

    def enveloped(request: Any, response: Any) -> Any:
        if response.status_code < 500 or response.get("Content-Type", "").startswith("application/json"):
            return response
        return internal_error(f"req_{uuid.uuid4().hex}", log=False)  # Django logged it

    if iscoroutinefunction(get_response):

        async def inner(request: Any) -> Any:
            return enveloped(request, await get_response(request))

        return inner
    return lambda request: enveloped(request, get_response(request))


api_app = ApiHandler()


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`/v1` to the API's handler, everything else (pages, admin, static) to Django with its middleware."""
    app = api_app if scope["path"] == "/v1" or scope["path"].startswith("/v1/") else django_asgi_app
    await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": SameOriginOrTrusted(ApiKeyOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)
