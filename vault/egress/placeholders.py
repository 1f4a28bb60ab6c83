"""The placeholders a sandbox's shell holds for the environment_variable credentials of its session.

Each variable (the credential's secret_name) holds `wbph_<credential id>`, never the value: the egress proxy
replaces it with the secret on the hosts the credential allows. Sandboxes cannot import the vault, so the
vault adds this source to theirs (`sandboxes.provisioning.add_session_env`), at provisioning and when a
hand moves to another session.
"""

from __future__ import annotations

from sandboxes.models import Sandbox
from sandboxes.provisioning import add_session_env
from sessions.models import Session
from vault.models import Credential

from .policy import placeholder


def session_placeholders(sandbox: Sandbox) -> dict[str, str]:
    session = Session.objects.filter(id=sandbox.session_id).only("vault_ids").first()
    if session is None or not session.vault_ids:
        return {}
    order = {vault_id: i for i, vault_id in enumerate(session.vault_ids)}
    found = Credential.objects.usable().filter(
        vault_id__in=list(order), kind=Credential.Kind.ENVIRONMENT_VARIABLE
    )
    # A name in several vaults: the first vault the session lists wins.
    ranked = sorted(found.values_list("vault_id", "id", "secret_name"), key=lambda row: -order[row[0]])
    return {secret_name: placeholder(credential_id) for _, credential_id, secret_name in ranked}


def register() -> None:
    add_session_env(session_placeholders)
