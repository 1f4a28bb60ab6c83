from django.contrib import admin
from django.urls import include, path

from harness.api.agents import router as agents
from harness.api.sessions import router as sessions
from kernel.api.edge import Edge
from kernel.api.keys import router as api_keys
from sandboxes.api import router as environments
from sandboxes.work_api import router as work
from vault.api import router as vaults
from workbench import health, views

api = Edge(
    description="The Managed Agents API as the official `anthropic` SDK speaks it, and Workbench's own routes "
    "(harnesses, forks, hands). Authenticate with `x-api-key: <key>` or `Authorization: Bearer <key>`."
)
api.add_router("", agents)
api.add_router("", environments)
api.add_router("", work)
api.add_router("", sessions)
api.add_router("", vaults)
api.add_router("", api_keys)

urlpatterns = [
    path("v1/", api.urls),
    path("v1/<path:rest>", views.api_not_found),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("", include("workbench.ui.urls")),
]
