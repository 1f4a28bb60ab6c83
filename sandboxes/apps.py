from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    verbose_name = "Sandboxes (hands)"

    def ready(self) -> None:
        from kernel.auth import add_bearer_resolver
        from sandboxes.work_keys import resolve_bearer

        # Environment keys and work items' sessions tokens: what self-hosted workers authenticate with.
        add_bearer_resolver(resolve_bearer)
