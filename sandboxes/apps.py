from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    verbose_name = "Sandboxes (hands)"

    def ready(self) -> None:
        from kernel.auth import add_bearer_resolver
        from sandboxes.work_keys import resolve_bearer

        # Environment keys and work items' sessions tokens: what self-hosted workers authenticate with.
        add_bearer_resolver(resolve_bearer)

        from kernel.tenancy import add_owner, workspace_lookup
        from sandboxes.environments import EnvironmentNotFound
        from sandboxes.models import Environment

        add_owner(
            "environment_id",
            workspace_of=workspace_lookup(Environment),
            missing=EnvironmentNotFound,
        )
