from django.contrib import admin
from django.urls import include, path

import harness.api.agents as agents
import harness.api.sessions as sessions
import sandboxes.api as environments
from workbench import views

v1 = [
    path("v1/agents", agents.collection),
    path("v1/agents/<str:agent_id>", agents.item),
    path("v1/agents/<str:agent_id>/archive", agents.archive),
    path("v1/agents/<str:agent_id>/versions", agents.versions),
    path("v1/environments", environments.collection),
    path("v1/environments/<str:environment_id>", environments.item),
    path("v1/environments/<str:environment_id>/archive", environments.archive),
    path("v1/sessions", sessions.collection),
    path("v1/sessions/<str:session_id>", sessions.item),
    path("v1/sessions/<str:session_id>/archive", sessions.archive),
    path("v1/sessions/<str:session_id>/fork", sessions.fork),
    path("v1/sessions/<str:session_id>/events", sessions.events),
    path("v1/sessions/<str:session_id>/events/stream", sessions.stream),
    path("v1/sessions/<str:session_id>/sandboxes", environments.session_sandboxes),
    path("v1/sessions/<str:session_id>/sandboxes/<str:sandbox_id>", environments.session_sandbox),
    path(
        "v1/sessions/<str:session_id>/sandboxes/<str:sandbox_id>/detach",
        environments.session_sandbox_detach_view,
    ),
    path(
        "v1/sessions/<str:session_id>/sandboxes/<str:sandbox_id>/transfer",
        environments.session_sandbox_transfer_view,
    ),
    path("v1/sandboxes", environments.sandboxes),
]

urlpatterns = [
    *v1,
    path("v1/<path:rest>", views.api_not_found),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz),
    path("", include("workbench.ui.urls")),
]
