"""Sandbox providers: the backends a sandbox can run on (no Django in this layer).

provider = get_provider("docker")          # or "local" (bubblewrap, for machines without Docker)
handle = provider.provision(Resources(labels={"workbench.sandbox": sandbox_id}))
provider.execute(handle, "bash", {"command": "ls"})   # -> the tool's text output
provider.terminate(handle)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from .base import (
    Cancelled,
    EgressRoute,
    Provider,
    Resources,
    SandboxError,
    SandboxGone,
    ToolFailed,
    ToolInputError,
)

PROVIDERS = ("docker", "local")
# The label naming the deployment (WORKBENCH_DEPLOYMENT) that made a sandbox or a checkout image: an engine may
# serve others too, and a deployment reaps, caps and removes only its own.
DEPLOYMENT_LABEL = "workbench.deployment"

__all__ = [
    "PROVIDERS",
    "DEPLOYMENT_LABEL",
    "Cancelled",
    "EgressRoute",
    "Provider",
    "Resources",
    "SandboxError",
    "SandboxGone",
    "ToolFailed",
    "ToolInputError",
    "get_provider",
    "held_by",
]

logger = logging.getLogger(__name__)


def get_provider(name: str) -> Provider:
    """A provider by name; the docker SDK is imported only when the docker provider is asked for."""
    if name == "docker":
        from .docker import DockerProvider

        return DockerProvider()
    if name == "local":
        from .local import LocalProvider

        return LocalProvider()
    raise ValueError(f"unknown sandbox provider {name!r}: choose one of {', '.join(PROVIDERS)}")


def held_by(
    deployment: str, providers: tuple[str, ...] = PROVIDERS
) -> Iterator[tuple[Provider, dict[str, dict[str, str]]]]:
    """Each provider that answers, with what it still holds (running or not) labelled as `deployment`'s:
    handle -> labels. One that does not answer (no Docker engine) is left out."""
    for name in providers:
        try:
            provider = get_provider(name)
            handles = provider.list_handles()
        except (SandboxError, OSError) as error:
            logger.info("provider %s unavailable: %s", name, error)
            continue
        mine = {h: labels for h, labels in handles.items() if labels.get(DEPLOYMENT_LABEL) == deployment}
        yield provider, mine
