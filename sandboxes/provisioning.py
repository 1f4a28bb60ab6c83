"""Where and how an environment's sandboxes are provisioned: its provider, its limits, eager or lazy."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from sandboxes.models import Environment, Sandbox
from sandboxes.providers import DEPLOYMENT_LABEL, EgressRoute, Provider, Resources, get_provider

logger = logging.getLogger(__name__)
# Where the sandbox finds the CA bundle that trusts the egress proxy, and every variable that tells a
# client so (Python's ssl and requests, curl, git, pip, node).
CA_BUNDLE_IN_SANDBOX = "/etc/ssl/certs/ca-certificates.crt"
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
)
NO_PROXY = "localhost,127.0.0.1,::1"
SESSION_ENV = "WORKBENCH_SESSION_ENV"  # as the toolbox daemon names it (sandboxes/toolbox/daemon.py)
RESERVED = frozenset(
    {
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
    }
    | set(CA_VARIABLES)
    | {"PATH", "HOME", "USER", "SHELL", "PWD"}
)
NO_NETWORK_NOTE = (
    "none: the local (bubblewrap) sandbox provider has no network; this environment's networking needs the "
    "docker provider with SANDBOX_EGRESS on"
)

# What a sandbox's shell gets for the session holding it, from the layers above that sandboxes cannot
# import (the vault's credential placeholders); each source is a function of the sandbox (its session).
SessionEnv = Callable[[Sandbox], dict[str, str]]
_session_env_sources: list[SessionEnv] = []


def add_session_env(source: SessionEnv) -> None:
    if source not in _session_env_sources:
        _session_env_sources.append(source)


def session_env(sandbox: Sandbox) -> dict[str, str]:
    """The variables the session holding `sandbox` gives its shell (none for a free sandbox); never one the
    platform sets itself (the proxy, the CA bundle, PATH...), whatever a credential's secret_name says."""
    env: dict[str, str] = {}
    if sandbox.session_id is None:
        return env
    for source in _session_env_sources:
        env.update(source(sandbox))
    for name in [n for n in env if n in RESERVED or n.startswith(("LD_", "WORKBENCH_"))]:
        logger.warning(
            "sandbox %s: the session variable %s is not set: the platform sets it", sandbox.id, name
        )
        del env[name]
    return env


def egress_gateway() -> str:
    """The proxy's address on the sandboxes' network: the first address of EGRESS_SUBNET."""
    return str(next(ipaddress.ip_network(settings.EGRESS_SUBNET).hosts()))


def egress_bundle() -> Path:
    return Path(settings.EGRESS_DATA_DIR) / "sandbox-ca-bundle.crt"


def egress_route() -> EgressRoute:
    return EgressRoute(
        network=settings.EGRESS_NETWORK,
        subnet=settings.EGRESS_SUBNET,
        bridge=settings.EGRESS_BRIDGE,
        proxy_port=settings.EGRESS_PORT,
        ca_bundle=str(egress_bundle()),
        firewall=settings.EGRESS_FIREWALL,
    )


def has_networking(environment: Environment) -> bool:
    config = environment.config or {}
    return config.get("type", "cloud") == "cloud" and bool(config.get("networking", {"type": "unrestricted"}))


def _egress_env(sandbox: Sandbox) -> dict[str, str]:
    """The proxy variables of a sandbox, with a new identity token; only its hash is kept (on the row)."""
    token = secrets.token_urlsafe(32)
    sandbox.egress_token_hash = hashlib.sha256(token.encode()).hexdigest()
    Sandbox.objects.filter(id=sandbox.id).update(egress_token_hash=sandbox.egress_token_hash)
    proxy = f"http://{sandbox.id}:{token}@{egress_gateway()}:{settings.EGRESS_PORT}"
    env = {name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    env.update({"NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY})
    env.update(dict.fromkeys(CA_VARIABLES, CA_BUNDLE_IN_SANDBOX))
    return env


def provisioning_mode(config: dict[str, Any]) -> str:
    """ "lazy" (the first tool call provisions) or "eager" (the turn provisions before its first model call),
    from an environment's config."""
    return (config.get("sandbox") or {}).get("provisioning") or settings.SANDBOX_PROVISIONING


def speculation_policy(config: dict[str, Any]) -> str:
    """ "auto", "always" or "never": whether a lazy environment's turns provision the sandbox ahead of the first
    tool call (harness/speculation.py), from an environment's config, else SPECULATIVE_PROVISIONING."""
    return (config.get("sandbox") or {}).get("speculative") or settings.SPECULATIVE_PROVISIONING


def idle_seconds(sandbox: Sandbox) -> int:
    """How long `sandbox` may stay idle before it is removed: its environment's idle_ttl_seconds, or
    SPECULATIVE_IDLE_SECONDS if shorter for one provisioned ahead that no call used (or returned unused)."""
    ttl = int((sandbox.environment.config.get("sandbox") or {}).get("idle_ttl_seconds", 3600))
    return min(ttl, settings.SPECULATIVE_IDLE_SECONDS) if sandbox.labels.get("speculative") else ttl


def provider_name(environment: Environment) -> str:
    return (environment.config.get("sandbox") or {}).get("provider") or settings.SANDBOX_PROVIDER


def resources_for(environment: Environment, sandbox: Sandbox) -> Resources:
    limits = environment.config.get("sandbox") or {}
    labels = {
        "workbench.sandbox": sandbox.id,
        "workbench.environment": environment.id,
        DEPLOYMENT_LABEL: settings.WORKBENCH_DEPLOYMENT,
    }
    disk_mb = min(limits.get("disk_mb") or settings.SANDBOX_DISK_MB, settings.SANDBOX_MAX_DISK_MB)
    # A sandbox reaches the outside only through the egress proxy: on docker, with SANDBOX_EGRESS on. The
    # local provider's only network would be the host's own (its loopback services too), so it has none.
    env = session_env(sandbox)
    # Which variables are the session's, so a reset for the next holder replaces them (toolbox/daemon.py).
    env[SESSION_ENV] = ",".join(sorted(env))
    egress = None
    if has_networking(environment):
        if sandbox.provider == "docker" and settings.SANDBOX_EGRESS:
            egress = egress_route()
            env.update(_egress_env(sandbox))
        elif sandbox.provider == "local":
            env["WORKBENCH_NETWORK"] = NO_NETWORK_NOTE
    # The maxima bound what an environment stored before an operator lowered them.
    return Resources(
        image=limits.get("image") or settings.SANDBOX_IMAGE,
        cpus=min(float(limits.get("cpus", 1.0)), settings.SANDBOX_MAX_CPUS),
        memory_mb=min(int(limits.get("memory_mb", 512)), settings.SANDBOX_MAX_MEMORY_MB),
        pids=min(int(limits.get("pids", 256)), settings.SANDBOX_MAX_PIDS),
        disk_mb=disk_mb if settings.SANDBOX_DISK_QUOTA else None,
        network=False,
        egress=egress,
        labels=labels,
        env=env,
    )


def provider_of(sandbox: Sandbox) -> Provider:
    return get_provider(sandbox.provider)
