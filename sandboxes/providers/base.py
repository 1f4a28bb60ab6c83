"""The interface every sandbox provider implements: a hand the harness can call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class SandboxError(Exception):
    """The provider could not do what was asked (engine down, provisioning failed)."""


class SandboxGone(SandboxError):
    """The sandbox no longer exists or stopped (killed, OOM, lost by the engine): provision a new one."""


class ToolInputError(Exception):
    """The tool's input is not acceptable (missing field, path outside the workspace, unknown tool)."""


class ToolFailed(Exception):
    """The tool ran and failed in a way the model should see as an error result (e.g. edit found no match)."""


@dataclass(frozen=True)
class EgressRoute:
    """The way out of a sandbox that has networking: an internal network whose only open door on the host
    is the egress proxy, and the CA bundle (the system's and the proxy's) the sandbox trusts."""

    network: str
    subnet: str
    bridge: str
    proxy_port: int
    ca_bundle: str  # a host path, mounted read-only over the image's bundle
    firewall: bool = True


@dataclass(frozen=True)
class Resources:
    """What a sandbox is provisioned with; built from an Environment by the caller."""

    image: str = "workbench-sandbox:latest"
    cpus: float = 1.0
    memory_mb: int = 512
    pids: int = 256
    disk_mb: int | None = None  # the writable file system's quota; None: no quota
    network: bool = False
    egress: EgressRoute | None = None  # docker only; `network` is the local provider's host network
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


Cancelled = Callable[[], bool]


@runtime_checkable
class Provider(Protocol):
    name: str
    capabilities: frozenset[str]  # optional extras, e.g. {"pause", "snapshot"}; never assumed

    def provision(self, resources: Resources) -> str:
        """Create a sandbox and return its handle once it can execute."""
        ...

    def execute(
        self,
        handle: str,
        name: str,
        input: dict[str, Any],
        *,
        timeout_s: float | None = None,
        cancelled: Cancelled | None = None,
    ) -> str:
        """Run toolset tool `name` with `input` inside the sandbox and return its text output."""
        ...

    def reset(self, handle: str, *, env: dict[str, str] | None = None, unused: bool = False) -> None:
        """Prepare a sandbox that changed sessions for its new holder: check that its toolbox answers on
        the channel the provider made (not one the sandbox replaced), stop the calls still running, and
        start a new shell, whose session variables (the credentials' placeholders) are `env` instead of the
        previous holder's. The files, and the processes already running, stay. The next call's result says
        the shell is new, unless `unused` (no call ever ran in the sandbox: the new shell replaces nothing a
        call made). Raises SandboxError, or ToolFailed when the old shell could not be replaced."""
        ...

    def is_alive(self, handle: str) -> bool: ...

    def terminate(self, handle: str) -> None: ...

    def list_handles(self) -> dict[str, dict[str, str]]:
        """Every sandbox this provider manages that still exists, with its labels (for the reaper)."""
        ...
