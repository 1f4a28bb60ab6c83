"""Sandbox providers: the backends a sandbox can run on (no Django in this layer).

provider = get_provider("docker")          # or "local" (bubblewrap, for machines without Docker)
handle = provider.provision(Resources(labels={"workbench.sandbox": sandbox_id}))
provider.execute(handle, "bash", {"command": "ls"})   # -> the tool's text output
provider.terminate(handle)
"""

from __future__ import annotations

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

__all__ = [
    "PROVIDERS",
    "Cancelled",
    "EgressRoute",
    "Provider",
    "Resources",
    "SandboxError",
    "SandboxGone",
    "ToolFailed",
    "ToolInputError",
    "get_provider",
]


def get_provider(name: str) -> Provider:
    """A provider by name; the docker SDK is imported only when the docker provider is asked for."""
    if name == "docker":
        from .docker import DockerProvider

        return DockerProvider()
    if name == "local":
        from .local import LocalProvider

        return LocalProvider()
    raise ValueError(f"unknown sandbox provider {name!r}: choose one of {', '.join(PROVIDERS)}")
