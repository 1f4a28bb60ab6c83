from django.apps import AppConfig


class HarnessConfig(AppConfig):
    name = "harness"
    verbose_name = "Harness (brains)"

    def ready(self) -> None:
        from harness.services.lifecycle import session_worker_gone
        from sandboxes.work import add_work_lost_hook, add_work_stopped_hook

        # A self-hosted worker that leaves its session (lost, or its item stopped): the harness recovers
        # what it left, and makes sure a worker is asked for while calls wait for one.
        add_work_lost_hook(session_worker_gone)
        add_work_stopped_hook(session_worker_gone)

        from harness.agents import AgentNotFound
        from harness.models import Agent
        from kernel.tenancy import add_owner, workspace_lookup

        add_owner(
            "agent_id",
            workspace_of=workspace_lookup(Agent),
            missing=AgentNotFound,
        )
