"""A session's repository tokens (a github_repository resource's `authorization_token`), sealed at the API's
door: set when the session is created, rotated by the resource's update route, deleted with the resource or
the session.

Like every process but the egress proxy, the callers (web, admin) seal with the vault's public key and never
open: the proxy alone reads a token, and adds it to git's requests under the repository's URL, from the
session's sandboxes and from the worker's clone at provisioning. One RepositorySecret per session and
resource; the resource in `Session.resources` never holds the token, and a fork gets none. Each change is a
row of the audit trail, which names the resource and the URL, never the token.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.db import transaction

from vault.models import CredentialUse, RepositorySecret
from vault.services import _seal, audit

FIELD = "token"  # the sealed field the proxy reads (vault/egress/state.py)


def _host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def _audit(action: str, secret: RepositorySecret, *, actor: str, did: str) -> None:
    audit(
        action,
        actor=actor,
        session_id=secret.session_id,
        host=_host(secret.url),
        detail=f"repository token of {secret.resource_id} ({secret.url}) {did}",
    )


def repository_token_set(
    session_id: str, *, resource_id: str, url: str, token: str, actor: str
) -> RepositorySecret:
    """The token of a new resource, sealed. Raises Unavailable (and stores nothing) when this installation
    has no public vault key."""
    secret = RepositorySecret(session_id=session_id, resource_id=resource_id, url=url)
    _seal(secret, {FIELD: token})
    secret.save()
    _audit(CredentialUse.Action.CREATE, secret, actor=actor, did="set")
    return secret


@transaction.atomic
def repository_token_rotate(
    session_id: str, *, resource_id: str, url: str, token: str, actor: str
) -> RepositorySecret:
    """A new token for the resource: the stored one resealed with its secret_version bumped (so the proxy
    drops the old one the next time it reads the session), or a first one for a repository that had none."""
    secret = (
        RepositorySecret.objects.select_for_update()
        .filter(session_id=session_id, resource_id=resource_id)
        .first()
    )
    if secret is None:
        return repository_token_set(session_id, resource_id=resource_id, url=url, token=token, actor=actor)
    secret.url = url
    secret.secret_version += 1
    _seal(secret, {FIELD: token})
    secret.save()
    _audit(CredentialUse.Action.UPDATE, secret, actor=actor, did=f"rotated (version {secret.secret_version})")
    return secret


@transaction.atomic
def repository_tokens_delete(session_id: str, *, actor: str, resource_id: str | None = None) -> int:
    """Destroy the session's repository tokens (only `resource_id`'s, when given); returns how many."""
    secrets = RepositorySecret.objects.filter(session_id=session_id)
    if resource_id is not None:
        secrets = secrets.filter(resource_id=resource_id)
    deleted = 0
    for secret in secrets.select_for_update():
        _audit(CredentialUse.Action.DELETE, secret, actor=actor, did="deleted")
        secret.delete()
        deleted += 1
    return deleted


__all__ = ["repository_token_rotate", "repository_token_set", "repository_tokens_delete"]
