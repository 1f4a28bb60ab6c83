"""What the proxy reads from the database, and keeps for a few seconds so a request adds little latency.

A sandbox's policy (its identity, the networking of its environment, the credentials of the session that
holds it now, the session's repositories) is cached per sandbox for EGRESS_CACHE_SECONDS; opened secrets
are cached per (record, secret_version), so a new value is used as soon as the policy is read again. On
PostgreSQL the database also tells the proxy at commit what changed (`notices.py`), and the policies it
names are read again at the next request: a sandbox passed to another session, or a credential archived,
takes effect at once, not after the cache's time. The database is only read on threads
(`asyncio.to_thread`): the proxy's event loop never blocks on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import queue
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from django.db import close_old_connections
from django.utils import timezone

from sandboxes.models import Sandbox
from sessions.models import Session
from vault import crypto
from vault.models import Credential, CredentialUse, RepositorySecret, Vault

from .policy import EnvCredential, McpCredential, Repository, SandboxPolicy, SessionPolicy

logger = logging.getLogger("vault.egress")
ACTOR = "egress proxy"
# A sandbox that is gone no longer speaks through the proxy.
SERVED = (Sandbox.Status.PROVISIONING, Sandbox.Status.READY)
MAX_CACHED = 10_000
SESSION_KEY = "session:"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Keys:
    """The private keyring, read again when a secret is sealed to a key it does not hold (a rotation added
    one while the proxy runs)."""

    def __init__(self) -> None:
        self._ring: crypto.Keyring | None = None
        self._lock = threading.Lock()

    def ring(self) -> crypto.Keyring:
        with self._lock:
            if self._ring is None:
                self._ring = crypto.keyring()
            return self._ring

    def unseal(self, record: Credential | RepositorySecret) -> dict[str, str]:
        ring = self.ring()
        if any(sealed.get("kid") not in ring.keys for sealed in record.sealed.values()):
            with self._lock:
                self._ring = crypto.keyring()
                ring = self._ring
            logger.info("egress: reloaded the vault keyring (a secret was sealed to a key it did not hold)")
        return record.unseal(ring)


class Loader:
    """Reads policies from the database (on a thread), with the opened secrets cached by version."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self._secrets: dict[tuple[str, int], dict[str, str]] = {}
        self._lock = threading.Lock()

    def _opened(self, record: Credential | RepositorySecret) -> dict[str, str] | None:
        key = (record.pk if isinstance(record.pk, str) else f"repo:{record.pk}", record.secret_version)
        with self._lock:
            return self._opened_locked(record, key)

    def _opened_locked(
        self, record: Credential | RepositorySecret, key: tuple[str, int]
    ) -> dict[str, str] | None:
        if key not in self._secrets:
            try:
                self._secrets[key] = self.keys.unseal(record)
            except crypto.VaultKeyError as error:
                logger.error("egress: a secret could not be opened (%s): %s", key[0], error)
                return None
            # Older versions of the same record are of no more use.
            for old in [k for k in self._secrets if k[0] == key[0] and k != key]:
                del self._secrets[old]
        return self._secrets[key]

    def load(self, key: str) -> SandboxPolicy | SessionPolicy | None:
        """The policy of a sandbox (`sbx_…`) or of a session at the workers' door (`session:<id>`)."""
        close_old_connections()
        if key.startswith(SESSION_KEY):
            return self.load_session(key.removeprefix(SESSION_KEY))
        return self.load_sandbox(key)

    def load_sandbox(self, sandbox_id: str) -> SandboxPolicy | None:
        sandbox = (
            Sandbox.objects.select_related("environment", "session")
            .filter(id=sandbox_id, status__in=SERVED)
            .first()
        )
        if sandbox is None or not sandbox.egress_token_hash:
            return None
        networking = (sandbox.environment.config or {}).get("networking") or {"type": "unrestricted"}
        session = sandbox.session
        if (
            session is not None
            and networking.get("type") == "limited"
            and networking.get("allow_mcp_servers")
        ):
            networking = _with_mcp_servers(networking, session.agent_snapshot or {})
        if session is None:
            return SandboxPolicy(
                sandbox.id, sandbox.egress_token_hash, "", networking, environment_id=sandbox.environment_id
            )
        vault_ids = list(session.vault_ids or [])
        usable = list(Vault.objects.usable().filter(id__in=vault_ids).values_list("id", flat=True))
        credentials = []
        for credential in Credential.objects.usable().filter(
            vault_id__in=usable, kind=Credential.Kind.ENVIRONMENT_VARIABLE
        ):
            opened = self._opened(credential)
            if not opened or not opened.get("secret_value"):
                continue
            auth: dict[str, Any] = credential.auth
            networking_of = auth.get("networking") or {"type": "unrestricted"}
            location = auth.get("injection_location") or {}
            credentials.append(
                EnvCredential(
                    id=credential.id,
                    vault_id=credential.vault_id,
                    secret_name=credential.secret_name,
                    secret=opened["secret_value"],
                    hosts=None
                    if networking_of.get("type") == "unrestricted"
                    else tuple(networking_of.get("allowed_hosts") or ()),
                    header=bool(location.get("header", True)),
                    body=bool(location.get("body", False)),
                )
            )
        return SandboxPolicy(
            sandbox.id,
            sandbox.egress_token_hash,
            session.id,
            networking,
            tuple(credentials),
            self._repositories(session.id),
            tuple(usable),
            environment_id=sandbox.environment_id,
        )

    def _repositories(self, session_id: str) -> tuple[Repository, ...]:
        repositories = []
        for secret in RepositorySecret.objects.filter(session_id=session_id):
            opened = self._opened(secret)
            if opened and opened.get("token"):
                repositories.append(Repository(secret.resource_id, secret.url, opened["token"]))
        return tuple(repositories)

    def load_session(self, session_id: str) -> SessionPolicy | None:
        session = (
            Session.objects.filter(id=session_id, deleted_at__isnull=True).only("id", "vault_ids").first()
        )
        if session is None:
            return None
        order = {vault_id: i for i, vault_id in enumerate(session.vault_ids or [])}
        usable = sorted(
            Vault.objects.usable().filter(id__in=list(order)).values_list("id", flat=True),
            key=order.__getitem__,
        )
        found = Credential.objects.usable().filter(
            vault_id__in=usable, kind__in=[Credential.Kind.STATIC_BEARER, Credential.Kind.MCP_OAUTH]
        )
        credentials = []
        for credential in sorted(found, key=lambda c: order[c.vault_id]):
            opened = self._opened(credential)
            token = (opened or {}).get(
                "token" if credential.kind == Credential.Kind.STATIC_BEARER else "access_token"
            )
            if not token:
                continue
            auth: dict[str, Any] = credential.auth
            credentials.append(
                McpCredential(
                    id=credential.id,
                    vault_id=credential.vault_id,
                    kind=credential.kind,
                    url_key=credential.mcp_server,
                    token=token,
                    secret_version=credential.secret_version,
                    expires_at=auth.get("expires_at"),
                    refreshable=bool(auth.get("refresh") and (opened or {}).get("refresh_token")),
                )
            )
        return SessionPolicy(session.id, tuple(credentials), self._repositories(session.id), tuple(usable))


def _with_mcp_servers(networking: dict[str, Any], agent: dict[str, Any]) -> dict[str, Any]:
    """`allow_mcp_servers`: the hosts of the session's agent's MCP servers join the allowed hosts."""
    hosts = [
        host
        for server in agent.get("mcp_servers") or []
        if isinstance(server, dict) and (host := urlsplit(str(server.get("url") or "")).hostname)
    ]
    allowed = list(dict.fromkeys([*(networking.get("allowed_hosts") or []), *hosts]))
    return {**networking, "allowed_hosts": allowed}


class Policies:
    """The policy of each sandbox, cached for `ttl` seconds or until a notice names it; concurrent misses for
    one sandbox share a load."""

    def __init__(self, loader: Loader, *, ttl: float) -> None:
        self.loader = loader
        self.ttl = ttl
        self._cache: dict[str, tuple[float, Any]] = {}
        self._loading: dict[str, asyncio.Future[Any]] = {}
        # Moved by a notice that may concern a load under way: such a load may have read what the notice
        # replaced, so it answers the requests that waited for it and is not kept.
        self._epoch = 0

    async def get(self, sandbox_id: str) -> SandboxPolicy | None:
        policy = await self.of(sandbox_id)
        return policy if isinstance(policy, SandboxPolicy) else None

    async def session(self, session_id: str) -> SessionPolicy | None:
        policy = await self.of(SESSION_KEY + session_id)
        return policy if isinstance(policy, SessionPolicy) else None

    def forget(self, key: str) -> None:
        """Read `key`'s policy afresh next time (a credential of it changed here)."""
        self._cache.pop(key, None)

    def notice(self, key: str) -> None:
        """The database says `<kind>:<id>` changed (`notices.py`): forget every policy read from it.

        `sandbox:` its own; `session:` the session's and those of the sandboxes it holds; `vault:` every policy
        that uses the vault; `environment:` its sandboxes'; `*` all."""
        kind, _, ident = key.partition(":")
        if kind == "sandbox":
            self._cache.pop(ident, None)
            if self._loading.pop(ident, None) is not None:  # a request from now on reads afresh
                self._epoch += 1
            return
        self._epoch += 1
        self._loading.clear()
        if kind == "session":
            self._cache.pop(SESSION_KEY + ident, None)
        stale = [
            cached
            for cached, (_, policy) in self._cache.items()
            if kind not in ("session", "vault", "environment")  # `*`, or a kind not known here
            or (kind == "session" and isinstance(policy, SandboxPolicy) and policy.session_id == ident)
            or (kind == "vault" and policy is not None and ident in policy.vault_ids)
            or (
                kind == "environment" and isinstance(policy, SandboxPolicy) and policy.environment_id == ident
            )
        ]
        for cached in stale:
            del self._cache[cached]

    async def of(self, key: str) -> SandboxPolicy | SessionPolicy | None:
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        pending = self._loading.get(key)
        if pending is not None:
            return await pending
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        epoch = self._epoch
        try:
            policy = await asyncio.to_thread(self.loader.load, key)
        except Exception as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters, if any, get it
            raise
        finally:
            if self._loading.get(key) is future:
                del self._loading[key]
        if len(self._cache) > MAX_CACHED:  # ids that do not exist, asked for many times
            now = time.monotonic()
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now and v[1] is not None}
        if epoch == self._epoch:
            self._cache[key] = (time.monotonic() + self.ttl, policy)
        future.set_result(policy)
        return policy

    async def identify(self, sandbox_id: str, token: str) -> SandboxPolicy | None:
        """The sandbox's policy if `token` is its egress token."""
        if not sandbox_id.startswith("sbx_") or len(sandbox_id) > 40:
            return None
        policy = await self.get(sandbox_id)
        if policy is None or not hmac.compare_digest(policy.token_hash, token_hash(token)):
            return None
        return policy

    async def identify_session(self, password: str, harness_token: str) -> SessionPolicy | None:
        """At the workers' door: the session's policy if `password` is `<session_id>:<EGRESS_HARNESS_TOKEN>`."""
        session_id, sep, token = password.partition(":")
        if (
            not sep
            or not harness_token
            or not hmac.compare_digest(token_hash(token), token_hash(harness_token))
        ):
            return None
        if not session_id or len(session_id) > 40:
            return None
        return await self.session(session_id)


class Auditor:
    """Writes the audit trail on a thread of its own, in order, so a request never waits for the insert.

    Rows are written in batches, one INSERT for what queued in GATHER_SECONDS after the first (so the write
    falls after the answer it audits, not while it is being relayed), and a credential's `last_used_at` is
    moved at most once per LAST_USED_RESOLUTION: a busy proxy writes a row per use without an UPDATE per use."""

    BATCH = 500
    GATHER_SECONDS = 0.05
    LAST_USED_RESOLUTION = 10.0

    def __init__(self) -> None:
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._last_used: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name="egress-audit", daemon=True)
        self._thread.start()

    def write(self, action: str, *, allowed: bool, detail: str, **ids: str) -> None:
        self._queue.put({"action": action, "allowed": allowed, "detail": detail, **ids})

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        done = False
        while not done:
            first = self._queue.get()
            rows = [] if first is None else [first]
            done = first is None
            if not done:
                time.sleep(self.GATHER_SECONDS)
            while not done and len(rows) < self.BATCH:
                try:
                    row = self._queue.get_nowait()
                except queue.Empty:
                    break
                if row is None:
                    done = True
                else:
                    rows.append(row)
            if rows:
                self._write(rows)

    def _write(self, rows: list[dict[str, Any]]) -> None:
        try:
            close_old_connections()
            CredentialUse.objects.bulk_create([CredentialUse(actor=ACTOR, **row) for row in rows])
            now = time.monotonic()
            used = {
                row["credential_id"]
                for row in rows
                if row["action"] == "inject"
                and row.get("credential_id")
                and now - self._last_used.get(row["credential_id"], -1e9) > self.LAST_USED_RESOLUTION
            }
            if used:
                Credential.objects.filter(id__in=used).update(last_used_at=timezone.now())
                self._last_used.update(dict.fromkeys(used, now))
        except Exception:
            logger.exception("egress: %d audit rows could not be written", len(rows))
