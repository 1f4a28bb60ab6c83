from django.urls import path

from workbench.ui.views import account, catalog, hands, keys, sessions, timeline, vaults, work

app_name = "ui"

urlpatterns = [
    path("login/", account.login, name="login"),
    path("logout/", account.logout, name="logout"),
    path("workspace", account.workspace_switch, name="workspace-switch"),
    path("static/<path:path>", account.static, name="static"),
    path("", sessions.session_list, name="sessions"),
    path("sessions/new", sessions.session_start, name="session-start"),
    path("sessions/<str:session_id>/", sessions.session_detail, name="session"),
    path("sessions/<str:session_id>/events", timeline.events_fragment, name="session-events"),
    path("sessions/<str:session_id>/send", timeline.send_event, name="session-send"),
    path("sessions/<str:session_id>/panel", sessions.session_panel, name="session-panel"),
    path("sessions/<str:session_id>/harness", sessions.session_harness, name="session-harness"),
    path("sessions/<str:session_id>/archive", sessions.session_archive_view, name="session-archive"),
    path("sessions/<str:session_id>/replay", timeline.replay, name="session-replay"),
    path("sessions/<str:session_id>/fork", timeline.fork, name="session-fork"),
    path("sessions/<str:session_id>/sandboxes/provision", hands.provision, name="hand-provision"),
    path("sessions/<str:session_id>/sandboxes/attach", hands.attach, name="hand-attach"),
    path("sessions/<str:session_id>/sandboxes/<str:sandbox_id>/detach", hands.detach, name="hand-detach"),
    path(
        "sessions/<str:session_id>/sandboxes/<str:sandbox_id>/transfer", hands.transfer, name="hand-transfer"
    ),
    path(
        "sessions/<str:session_id>/sandboxes/<str:sandbox_id>/terminate",
        hands.terminate,
        name="hand-terminate",
    ),
    path("sandboxes/", hands.sandbox_list, name="sandboxes"),
    path("sandboxes/<str:sandbox_id>/terminate", hands.sandbox_terminate_view, name="sandbox-terminate"),
    path("agents/", catalog.agent_list, name="agents"),
    path("agents/new", catalog.agent_new, name="agent-new"),
    path("agents/<str:agent_id>/", catalog.agent_edit, name="agent"),
    path("agents/<str:agent_id>/archive", catalog.agent_archive_view, name="agent-archive"),
    path("environments/", catalog.environment_list, name="environments"),
    path("environments/new", catalog.environment_new, name="environment-new"),
    path("environments/<str:environment_id>/", catalog.environment_edit, name="environment"),
    path(
        "environments/<str:environment_id>/archive",
        catalog.environment_archive_view,
        name="environment-archive",
    ),
    path(
        "environments/<str:environment_id>/keys/new",
        work.environment_key_create_view,
        name="environment-key-create",
    ),
    path(
        "environments/<str:environment_id>/keys/<str:key_id>/revoke",
        work.environment_key_revoke_view,
        name="environment-key-revoke",
    ),
    path("vaults/", vaults.vault_list, name="vaults"),
    path("vaults/<str:vault_id>/", vaults.vault_detail, name="vault"),
    path("vaults/<str:vault_id>/archive", vaults.vault_archive_view, name="vault-archive"),
    path("vaults/<str:vault_id>/credentials", vaults.credential_add, name="credential-add"),
    path(
        "vaults/<str:vault_id>/credentials/<str:credential_id>/replace",
        vaults.credential_replace,
        name="credential-replace",
    ),
    path(
        "vaults/<str:vault_id>/credentials/<str:credential_id>/archive",
        vaults.credential_archive_view,
        name="credential-archive",
    ),
    path("keys/", keys.key_list, name="keys"),
    path("keys/new", keys.key_create, name="key-create"),
    path("keys/<int:key_id>/revoke", keys.key_revoke, name="key-revoke"),
]
