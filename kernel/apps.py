from django.apps import AppConfig


class KernelConfig(AppConfig):
    name = "kernel"
    # Its tables and migrations were made when these models lived in the project package; the label keeps
    # existing databases (workbench_apikey, the migration history) as they are.
    label = "workbench"
    verbose_name = "Workbench"
