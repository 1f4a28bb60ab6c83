from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    verbose_name = "Sandboxes (hands)"
