"""What the egress proxy allows and adds, as pure functions of what it loaded (no I/O, no Django models).

A sandbox's traffic is judged by its environment's `networking`, the session's repositories and the
`environment_variable` credentials of the session's vaults; `state.py` loads those, `addon.py` applies
these rules to each request and response.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from vault.rules import host_matches, mcp_url_key

PLACEHOLDER_PREFIX = "wbph_"
REDACTED = "[redacted by the egress proxy]"
REPOSITORY_USERNAME = "x-access-token"
# The hosts each package manager fetches from, allowed when an environment's networking is limited with
# allow_package_managers.
PACKAGE_HOSTS = (
    # pip
    "pypi.org",
    "files.pythonhosted.org",
    "pypi.python.org",
    # npm, yarn
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    # apt
    "deb.debian.org",
    "security.debian.org",
    "archive.ubuntu.com",
    "security.ubuntu.com",
    "ports.ubuntu.com",
    # cargo
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    # gem
    "rubygems.org",
    "index.rubygems.org",
    # go
    "proxy.golang.org",
    "sum.golang.org",
)


def placeholder(credential_id: str) -> str:
    """What the sandbox holds in place of an environment_variable credential's value: deterministic, so the
    same variable reads the same in every sandbox of a session, and says nothing of the secret."""
    return f"{PLACEHOLDER_PREFIX}{credential_id}"


@dataclass(frozen=True)
class EnvCredential:
    """An environment_variable credential as the proxy applies it (its secret opened)."""

    id: str
    vault_id: str
    secret_name: str
    secret: str
    hosts: tuple[str, ...] | None  # None: unrestricted
    header: bool = True
    body: bool = False

    @property
    def placeholder(self) -> str:
        return placeholder(self.id)

    def allows(self, host: str) -> bool:
        return self.hosts is None or host_matches(host, list(self.hosts))


@dataclass(frozen=True)
class Repository:
    """A session's repository and its token: added to git's requests under `url` only."""

    resource_id: str
    url: str
    token: str

    def authorization(self) -> str:
        raw = f"{REPOSITORY_USERNAME}:{self.token}".encode()
        return "Basic " + base64.b64encode(raw).decode()


@dataclass(frozen=True)
class SandboxPolicy:
    """Everything the proxy needs for one sandbox's traffic, for the session that holds it now."""

    sandbox_id: str
    token_hash: str
    session_id: str
    networking: dict[str, Any]
    credentials: tuple[EnvCredential, ...] = ()
    repositories: tuple[Repository, ...] = ()
    vault_ids: tuple[str, ...] = field(default=())
    environment_id: str = ""

    def repository_hosts(self) -> list[str]:
        return [host for r in self.repositories if (host := urlsplit(r.url).hostname)]

    def secrets(self) -> list[tuple[bytes, bytes]]:
        """(secret, what replaces it) for every form a response could carry back to the sandbox."""
        pairs = [(c.secret.encode(), c.placeholder.encode()) for c in self.credentials if c.secret]
        for repository in self.repositories:
            basic = repository.authorization().removeprefix("Basic ").encode()
            pairs += [(basic, REDACTED.encode()), (repository.token.encode(), REDACTED.encode())]
        # The longest first, so a secret holding another is replaced whole.
        return sorted(pairs, key=lambda pair: -len(pair[0]))


@dataclass(frozen=True)
class McpCredential:
    """An MCP credential (static_bearer or mcp_oauth) as the workers' door applies it: its token opened."""

    id: str
    vault_id: str
    kind: str
    url_key: str  # vault.rules.mcp_url_key of its mcp_server_url
    token: str
    secret_version: int
    expires_at: str | None = None  # mcp_oauth: RFC 3339
    refreshable: bool = False  # mcp_oauth with refresh settings and a refresh token

    def expired(self, now: float, margin: float) -> bool:
        if not self.expires_at:
            return False
        moment = datetime.fromisoformat(self.expires_at.replace("Z", "+00:00"))
        return moment.timestamp() <= now + margin


@dataclass(frozen=True)
class SessionPolicy:
    """What the workers' door adds for one session: the MCP credentials of its vaults (the first vault the
    session lists wins for a server), and its repositories' tokens."""

    session_id: str
    credentials: tuple[McpCredential, ...] = ()
    repositories: tuple[Repository, ...] = ()
    vault_ids: tuple[str, ...] = ()

    def credential_for(self, url: str) -> McpCredential | None:
        key = mcp_url_key(url)
        return next((c for c in self.credentials if c.url_key == key), None)

    def secrets(self) -> list[tuple[bytes, bytes]]:
        pairs = [(c.token.encode(), REDACTED.encode()) for c in self.credentials if c.token]
        for repository in self.repositories:
            basic = repository.authorization().removeprefix("Basic ").encode()
            pairs += [(basic, REDACTED.encode()), (repository.token.encode(), REDACTED.encode())]
        return sorted(pairs, key=lambda pair: -len(pair[0]))


# --- Hosts -----------------------------------------------------------------------------------------------


def host_refusal(host: str, networking: dict[str, Any], repository_hosts: Iterable[str] = ()) -> str | None:
    """Why `host` is refused under an environment's `networking` (None: allowed)."""
    host = host.lower().rstrip(".")
    if networking.get("type", "unrestricted") == "unrestricted":
        return None
    allowed = list(networking.get("allowed_hosts") or [])
    if host_matches(host, allowed) or host in {h.lower() for h in repository_hosts}:
        return None
    if networking.get("allow_package_managers") and host_matches(host, list(PACKAGE_HOSTS)):
        return None
    shown = ", ".join(allowed) or "none"
    extra = (
        "" if networking.get("allow_package_managers") else " (package manager hosts are not allowed either)"
    )
    return (
        f"the host {host} is not allowed by this sandbox's environment: its networking is limited to "
        f"allowed_hosts [{shown}]{extra}"
    )


PrivateAllowed = list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]]


def private_allowed(entries: Iterable[str]) -> PrivateAllowed:
    """EGRESS_PRIVATE_ALLOWED's entries: an address or network (CIDR), optionally `:port` (IPv4 only)."""
    allowed: PrivateAllowed = []
    for entry in entries:
        entry = entry.strip()
        if not entry:
            continue
        address, port = entry, None
        if entry.count(":") == 1:
            address, _, number = entry.partition(":")
            port = int(number)
        allowed.append((ipaddress.ip_network(address, strict=False), port))
    return allowed


def address_refusal(address: str, port: int, allowed: PrivateAllowed) -> str | None:
    """Why connecting to `address` is refused (None: allowed): every loopback, private, link-local,
    multicast, reserved or unspecified address is, unless EGRESS_PRIVATE_ALLOWED lists it."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    if ip.is_global and not ip.is_multicast:
        return None
    if any(ip in network and (want is None or want == port) for network, want in allowed):
        return None
    kind = next(
        name
        for name, flag in (
            ("loopback", ip.is_loopback),
            ("link-local", ip.is_link_local),
            ("multicast", ip.is_multicast),
            ("unspecified", ip.is_unspecified),
            ("private", ip.is_private),
            ("non-public", True),
        )
        if flag
    )
    return f"the destination {address} is a {kind} address, which sandboxes may not reach"


# --- Credentials -----------------------------------------------------------------------------------------


@dataclass
class Substitution:
    """What substituting placeholders in one request did."""

    value: bytes
    injected: set[str] = field(default_factory=set)  # credential ids
    refused: set[str] = field(default_factory=set)


def substitute(data: bytes, credentials: Iterable[EnvCredential], host: str, *, where: str) -> Substitution:
    """`data` with each credential's placeholder replaced by its secret, where the credential allows `host`
    and its injection_location allows `where` ("header" or "body"); a placeholder it may not replace stays
    as it is, and is counted as refused."""
    result = Substitution(data)
    for credential in credentials:
        mark = credential.placeholder.encode()
        if mark not in result.value:
            continue
        permitted = credential.header if where == "header" else credential.body
        if permitted and credential.allows(host):
            result.value = result.value.replace(mark, credential.secret.encode())
            result.injected.add(credential.id)
        else:
            result.refused.add(credential.id)
    return result


def refusal_detail(credential: EnvCredential, host: str, where: str) -> str:
    if not credential.allows(host):
        return (
            f"the placeholder of {credential.secret_name} was sent in a request {where} to {host}, which the "
            f"credential's networking does not allow ({', '.join(credential.hosts or ())}); passed unchanged"
        )
    return (
        f"the placeholder of {credential.secret_name} was sent in a request {where}, where the credential's "
        f"injection_location does not allow it; passed unchanged"
    )


def scrub(data: bytes, secrets: list[tuple[bytes, bytes]]) -> bytes:
    for secret, replacement in secrets:
        if secret in data:
            data = data.replace(secret, replacement)
    return data


class StreamScrubber:
    """Scrubs a response streamed in chunks: it holds back the last (longest secret - 1) bytes of each chunk,
    so a secret split across two chunks is still found whole."""

    def __init__(self, secrets: list[tuple[bytes, bytes]]):
        self.secrets = secrets
        self.keep = max((len(s) for s, _ in secrets), default=1) - 1
        self.held = b""

    def __call__(self, chunk: bytes) -> bytes:
        data = scrub(self.held + chunk, self.secrets)
        if not chunk:  # the end of the body
            self.held = b""
            return data
        cut = max(len(data) - self.keep, 0)
        self.held = data[cut:]
        return data[:cut]


# --- Repositories ----------------------------------------------------------------------------------------


def _base(url: str) -> tuple[str, str, int | None, str]:
    parts = urlsplit(url)
    path = parts.path.rstrip("/").removesuffix(".git")
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port, path


def repository_for(
    url: str, repositories: Iterable[Repository], *, plain_hosts: Iterable[str] = ()
) -> Repository | None:
    """The repository whose token a request to `url` gets: the same scheme, host and port, and a path under
    the repository's (with or without `.git`). Plain http only for hosts in REPOSITORY_PLAIN_HOSTS."""
    scheme, host, port, path = _base(url)
    if scheme != "https" and host not in set(plain_hosts):
        return None
    for repository in repositories:
        r_scheme, r_host, r_port, r_path = _base(repository.url)
        if (r_scheme, r_host, r_port) != (scheme, host, port) or not r_path:
            continue
        rest = path.removeprefix(r_path)
        if rest != path and (rest.startswith("/") or rest.startswith(".git/")):
            return repository
    return None
