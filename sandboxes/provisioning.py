"""Where and how an environment's sandboxes are provisioned: its provider, its limits, eager or lazy."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from sandboxes.models import Environment, Sandbox
from sandboxes.providers import Provider, Resources, get_provider


def provisioning_mode(config: dict[str, Any]) -> str:
    """ "lazy" (the first tool call provisions) or "eager" (the turn provisions before its first model call),
    from an environment's config."""
    return (config.get("sandbox") or {}).get("provisioning") or settings.SANDBOX_PROVISIONING


def provider_name(environment: Environment) -> str:
    return (environment.config.get("sandbox") or {}).get("provider") or settings.SANDBOX_PROVIDER


def resources_for(environment: Environment, sandbox: Sandbox) -> Resources:
    limits = environment.config.get("sandbox") or {}
    labels = {
        "workbench.sandbox": sandbox.id,
        "workbench.environment": environment.id,
        "workbench.deployment": settings.WORKBENCH_DEPLOYMENT,
    }
    disk_mb = min(limits.get("disk_mb") or settings.SANDBOX_DISK_MB, settings.SANDBOX_MAX_DISK_MB)
    # The maxima bound what an environment stored before an operator lowered them. No network until
    # egress goes through the credential-adding proxy (the vault's issue).
    return Resources(
        image=limits.get("image") or settings.SANDBOX_IMAGE,
        cpus=min(float(limits.get("cpus", 1.0)), settings.SANDBOX_MAX_CPUS),
        memory_mb=min(int(limits.get("memory_mb", 512)), settings.SANDBOX_MAX_MEMORY_MB),
        pids=min(int(limits.get("pids", 256)), settings.SANDBOX_MAX_PIDS),
        disk_mb=disk_mb if settings.SANDBOX_DISK_QUOTA else None,
        network=False,
        labels=labels,
    )


def provider_of(sandbox: Sandbox) -> Provider:
    return get_provider(sandbox.provider)
