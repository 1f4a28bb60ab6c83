from django.apps import AppConfig


class VaultConfig(AppConfig):
    name = "vault"
    verbose_name = "Vault"

    def ready(self) -> None:
        # Imported once the models are loaded (a module of models cannot load before): the sandboxes' shells
        # get the placeholders of their session's credentials from here, as sandboxes cannot import the vault.
        from vault.egress.placeholders import register

        register()

        from kernel.tenancy import add_owner, workspace_lookup
        from vault.models import Vault
        from vault.services import VaultNotFound

        add_owner(
            "vault_id",
            workspace_of=workspace_lookup(Vault),
            missing=VaultNotFound,
        )
