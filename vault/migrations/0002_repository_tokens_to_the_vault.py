"""Repository tokens stored in the clear in `Session.resources` (before they were sealed at the API's door)
move into RepositorySecrets, sealed with the installation's public vault key, and leave the JSON. A deleted
session's tokens are removed, not moved: deleting a session now destroys its tokens.

A live session holding a token when no public key is configured stops the migration (nothing is changed):
a token is never dropped. The reverse leaves the sealed tokens where they are: no process that migrates can
open them again, which is the point.
"""

from typing import Any

from django.db import migrations

from kernel.ids import new_id
from vault import crypto
from vault.models import RepositorySecret as CurrentRepositorySecret

TOKEN = "authorization_token"
NO_KEY = (
    "{count} session(s) hold a repository token in Session.resources, which this migration seals into the "
    "vault, and no public vault key is configured ({error}) Run `manage.py vault_key init` (it writes "
    "VAULT_PUBLIC_KEY_FILE, default .vault/public.json, and the private keyring the egress proxy takes), or "
    "point VAULT_PUBLIC_KEY_FILE (or VAULT_PUBLIC_KEYS) at this installation's public keyring, then migrate "
    "again. No token was moved or removed."
)


def _token(resource: Any) -> str | None:
    token = resource.get(TOKEN) if isinstance(resource, dict) else None
    return token if isinstance(token, str) and token else None


def _holding(Session: Any) -> list[Any]:
    """The sessions whose resources hold a token key (null or empty ones included: they are removed too)."""
    return [
        session
        for session in Session.objects.only("id", "resources", "deleted_at").iterator(chunk_size=500)
        if isinstance(session.resources, list)
        and any(isinstance(r, dict) and TOKEN in r for r in session.resources)
    ]


def _seal(session_id: str, resource_id: str, url: str, token: str, public: crypto.PublicKeyring) -> Any:
    # The current model's associated data, so that the egress proxy opens what is sealed here (a historical
    # model has none of the model's methods).
    aad = CurrentRepositorySecret(session_id=session_id, resource_id=resource_id, url=url).aad("token")
    return {"token": crypto.seal(token, aad, public).as_json()}


def seal_stored_tokens(apps: Any, schema_editor: Any) -> None:
    Session = apps.get_model("agent_sessions", "Session")
    RepositorySecret = apps.get_model("vault", "RepositorySecret")
    sessions = _holding(Session)
    live = [s for s in sessions if s.deleted_at is None and any(_token(r) for r in s.resources)]
    public = None
    if live:
        try:
            public = crypto.public_keyring()
        except crypto.VaultKeyError as error:
            raise RuntimeError(NO_KEY.format(count=len(live), error=error)) from None
    for session in sessions:
        resources = []
        for resource in session.resources:
            token = _token(resource)
            if isinstance(resource, dict):
                resource = {k: v for k, v in resource.items() if k != TOKEN}
            if token and public is not None and session.deleted_at is None:
                # A resource stored before resources had ids gets one: its secret is keyed by it.
                resource_id = resource.setdefault("id", new_id("sres"))
                url = resource["url"][:2048] if isinstance(resource.get("url"), str) else ""
                sealed = _seal(session.id, resource_id, url, token, public)
                secret = RepositorySecret.objects.filter(
                    session_id=session.id, resource_id=resource_id
                ).first()
                if secret is None:
                    RepositorySecret.objects.create(
                        session_id=session.id, resource_id=resource_id, url=url, sealed=sealed
                    )
                else:
                    secret.url, secret.sealed = url, sealed
                    secret.secret_version += 1
                    secret.save()
            resources.append(resource)
        Session.objects.filter(id=session.id).update(resources=resources)


class Migration(migrations.Migration):
    dependencies = [
        ("vault", "0001_initial"),
        ("agent_sessions", "0004_session_wake_queued_at"),
    ]

    operations = [migrations.RunPython(seal_stored_tokens, migrations.RunPython.noop)]
