from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "sessions"
    # `sessions` is django.contrib.sessions' label; ours is the agent session log.
    label = "agent_sessions"
    verbose_name = "Agent sessions"

    def ready(self) -> None:
        from kernel.tenancy import add_owner, workspace_lookup
        from sessions.models import Session
        from sessions.services import SessionNotFound

        add_owner("session_id", workspace_of=workspace_lookup(Session), missing=SessionNotFound)
