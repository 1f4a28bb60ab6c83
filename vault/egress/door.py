"""The workers' door: where the platform's own processes speak for a session (kernel/egress.py), and what
the proxy does there beyond adding a credential: refresh an `mcp_oauth` token, send a request again after
a refresh, and validate a credential for the web server (`POST /validate` on the control endpoint).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.db import close_old_connections

from vault import crypto
from vault.models import Credential
from vault.services import audit

from . import oauth
from .policy import McpCredential, SessionPolicy
from .resolver import Refused, Resolver
from .state import SESSION_KEY, Keys, Policies

logger = logging.getLogger("vault.egress")
REFRESH_BACKOFF_SECONDS = 30.0


@dataclass
class Door:
    spec: str  # the mitmproxy mode this door listens as ("regular@host:port")
    token: str  # EGRESS_HARNESS_TOKEN
    sandbox_subnet: str  # never a door for these addresses
    policies: Policies
    resolver: Resolver
    keys: Keys
    ca_file: str = ""  # EGRESS_UPSTREAM_CA
    refresh_margin: float = 60.0
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # A refresh that failed is not tried again for the same token for a while: every request of every
    # session using the credential would otherwise ask the token endpoint again.
    _failed: dict[tuple[str, int], float] = field(default_factory=dict)

    def from_sandboxes(self, address: str) -> bool:
        try:
            return ipaddress.ip_address(address) in ipaddress.ip_network(self.sandbox_subnet, strict=False)
        except ValueError:
            return False

    async def _address(self, url: str) -> str:
        """The checked address `url`'s host connects to (oauth.Unreachable with the reason if refused)."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            info = await self.resolver.pin(parts.hostname or "", port)
        except Refused as refused:
            raise oauth.Unreachable(str(refused)) from None
        return str(info[4][0])

    def _public(self) -> crypto.PublicKeyring:
        try:
            return crypto.public_keyring()
        except crypto.VaultKeyError:
            return self.keys.ring().public()

    async def refresh(self, policy: SessionPolicy | None, credential: McpCredential) -> oauth.Refreshed:
        """Refresh `credential`'s token once however many requests ask at the same time."""
        lock = self._locks.setdefault(credential.id, asyncio.Lock())
        failed_at = self._failed.get((credential.id, credential.secret_version))
        if failed_at is not None and time.monotonic() - failed_at < REFRESH_BACKOFF_SECONDS:
            return oauth.Refreshed(
                "failed",
                detail=f"a refresh failed {time.monotonic() - failed_at:.0f} s ago; not tried again yet",
            )
        async with lock:
            endpoint = await asyncio.to_thread(_token_endpoint, credential.id)
            if not endpoint:
                return oauth.Refreshed("no_refresh_token")
            try:
                address = await self._address(endpoint)
            except oauth.Unreachable as error:
                await asyncio.to_thread(
                    _audit_refused, credential, policy, f"token endpoint refused: {error}", endpoint
                )
                return oauth.Refreshed("connect_error", detail=str(error))
            refreshed = await asyncio.to_thread(
                oauth.refresh,
                credential.id,
                seen_version=credential.secret_version,
                address=address,
                keys=self.keys,
                ca_file=self.ca_file,
                session_id=policy.session_id if policy else "",
                public=self._public(),
            )
        if policy is not None and refreshed.status == "succeeded":
            self.policies.forget(SESSION_KEY + policy.session_id)
        if refreshed.status != "succeeded":
            self._failed[(credential.id, credential.secret_version)] = time.monotonic()
            logger.warning("egress: refreshing credential %s failed: %s", credential.id, refreshed.detail)
        return refreshed

    async def resend(
        self, method: str, url: str, headers: dict[str, str], body: bytes
    ) -> oauth.Answer | None:
        try:
            address = await self._address(url)
            return await asyncio.to_thread(
                oauth.send, method, url, address=address, headers=headers, body=body, ca_file=self.ca_file
            )
        except oauth.Unreachable as error:
            logger.info("egress: sending again after a refresh failed: %s", error)
            return None

    async def validate(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """`POST /validate {vault_id, credential_id, actor}`: probe the credential's MCP server with it,
        refreshing on a 401 or 403 where it can; the answer is the API's validation object."""
        vault_id, credential_id = str(request.get("vault_id", "")), str(request.get("credential_id", ""))
        actor = str(request.get("actor") or "api")[:150]
        credential = await asyncio.to_thread(_credential, vault_id, credential_id)
        if credential is None:
            return 404, {"error": f"no credential {credential_id} in vault {vault_id}"}
        if credential.kind == Credential.Kind.ENVIRONMENT_VARIABLE:
            return 400, {"error": "only MCP credentials (static_bearer, mcp_oauth) can be validated"}
        opened = await asyncio.to_thread(self.keys.unseal, credential)
        token = opened.get(
            "token" if credential.kind == Credential.Kind.STATIC_BEARER else "access_token", ""
        )
        has_refresh = bool(credential.auth.get("refresh") and opened.get("refresh_token"))
        secrets = [v for v in opened.values() if v]
        url = credential.auth["mcp_server_url"]
        answer: oauth.Answer | None = None
        refreshed: oauth.Refreshed | None = None
        try:
            address = await self._address(url)
            answer = await asyncio.to_thread(oauth.probe, url, token, address=address, ca_file=self.ca_file)
            if answer.status in (401, 403):
                if has_refresh:
                    mcp = McpCredential(
                        credential.id,
                        credential.vault_id,
                        credential.kind,
                        credential.mcp_server,
                        token,
                        credential.secret_version,
                        credential.auth.get("expires_at"),
                        True,
                    )
                    refreshed = await self.refresh(None, mcp)
                    if refreshed.token and refreshed.token != token:
                        answer = await asyncio.to_thread(
                            oauth.probe, url, refreshed.token, address=address, ca_file=self.ca_file
                        )
                else:
                    refreshed = oauth.Refreshed("no_refresh_token")
            status = (
                "valid"
                if 200 <= answer.status < 300
                else "invalid"
                if answer.status in (401, 403)
                else "unknown"
            )
            why = f"the MCP server answered HTTP {answer.status} to initialize"
        except oauth.Unreachable as error:
            status, why = "unknown", f"the MCP server could not be reached: {error}"
        if refreshed is not None:
            why += f"; refresh {refreshed.status}"
        await asyncio.to_thread(
            _audit_validation, credential, actor, status == "valid", f"validated: {status} ({why})", url
        )
        return 200, oauth.validation(
            credential,
            status=status,
            probe_answer=answer,
            refreshed=refreshed,
            has_refresh_token=has_refresh,
            secrets=[*secrets, *(refreshed.secrets if refreshed else [])],
        )


def _token_endpoint(credential_id: str) -> str:
    close_old_connections()
    auth = Credential.objects.filter(id=credential_id).values_list("auth", flat=True).first() or {}
    return str((auth.get("refresh") or {}).get("token_endpoint") or "")


def _credential(vault_id: str, credential_id: str) -> Credential | None:
    close_old_connections()
    return Credential.objects.live().filter(id=credential_id, vault_id=vault_id).first()


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "")[:300]


def _audit_refused(credential: McpCredential, policy: SessionPolicy | None, detail: str, url: str) -> None:
    close_old_connections()
    audit(
        "refresh",
        actor=oauth.ACTOR,
        allowed=False,
        detail=detail,
        credential_id=credential.id,
        vault_id=credential.vault_id,
        session_id=policy.session_id if policy else "",
        host=_host(url),
    )


def _audit_validation(credential: Credential, actor: str, allowed: bool, detail: str, url: str) -> None:
    close_old_connections()
    audit(
        "validate",
        actor=f"{oauth.ACTOR} for {actor}",
        allowed=allowed,
        detail=detail,
        credential_id=credential.id,
        vault_id=credential.vault_id,
        host=_host(url),
    )
