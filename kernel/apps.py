from django.apps import AppConfig


class KernelConfig(AppConfig):
    name = "kernel"
    # Its tables and migrations were made when these models lived in the project package; the label keeps
    # existing databases (workbench_apikey, the migration history) as they are.
    label = "workbench"
    verbose_name = "Workbench"

    def ready(self) -> None:
        from kernel.errors import NotFound
        from kernel.models import ApiKey
        from kernel.tenancy import add_owner

        def workspace_of(key_id: str) -> str | None:
            if not key_id.isdigit():
                return None
            found: str | None = (
                ApiKey.objects.filter(pk=int(key_id)).values_list("workspace_id", flat=True).first()
            )
            return found

        add_owner("api_key_id", workspace_of=workspace_of, missing=lambda key_id: NotFound("API key", key_id))
