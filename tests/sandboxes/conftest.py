"""Fixtures for the sandbox providers, on a real Docker engine and real bubblewrap.

The engine is found, or started with scripts/start-dockerd.sh; the image is built with
scripts/build-image.sh when missing (minutes, once). Outside CI a missing engine or bwrap skips the
tests with the reason; under CI=true it fails them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandboxes.providers.base import Provider, Resources, SandboxError
from tests.conftest import IN_CI, ROOT, require

IMAGE = "workbench-sandbox:latest"
RUN_ID = uuid.uuid4().hex[:8]


@dataclass
class Sandbox:
    """A provisioned sandbox and the provider that runs it, with shorthands for calls."""

    provider: Provider
    handle: str

    def call(self, tool: str, *, timeout_s: float | None = None, cancelled: Any = None, **input: Any) -> str:
        return self.provider.execute(self.handle, tool, input, timeout_s=timeout_s, cancelled=cancelled)

    def bash(self, command: str, **input: Any) -> str:
        return self.call("bash", command=command, **input)


def sandbox_resources(**overrides: Any) -> Resources:
    """Resources labelled as this test run's, so that leftovers can be found and removed."""
    labels = {"workbench.sandbox": f"sandbox-{uuid.uuid4().hex[:8]}", "workbench.test": RUN_ID}
    return Resources(**{"labels": labels, **overrides})


def _docker_api() -> Any:
    import docker

    try:
        api = docker.from_env(version="auto", timeout=10).api
        api.ping()
        return api
    except Exception:
        return None


def _image_exists(api: Any) -> bool:
    import docker.errors

    try:
        api.inspect_image(IMAGE)
        return True
    except docker.errors.ImageNotFound:
        return False


@pytest.fixture(scope="session")
def docker_provider() -> Iterator[Provider]:
    from sandboxes.providers.docker import DockerProvider

    api = _docker_api()
    if api is None and (os.geteuid() == 0 or IN_CI):
        started = subprocess.run(
            [ROOT / "scripts" / "start-dockerd.sh"], capture_output=True, text=True, timeout=300
        )
        print(started.stderr, file=sys.stderr)
        api = _docker_api()
    require(api is not None, "no Docker engine answers and scripts/start-dockerd.sh could not start one")
    if not _image_exists(api):
        print(f"building {IMAGE} with scripts/build-image.sh (minutes, once)", file=sys.stderr)
        subprocess.run([ROOT / "scripts" / "build-image.sh"], timeout=1800)
    require(_image_exists(api), f"the image {IMAGE} is missing and scripts/build-image.sh did not build it")
    provider = DockerProvider()
    yield provider
    for handle, labels in provider.list_handles().items():
        if labels.get("workbench.test") == RUN_ID:
            provider.terminate(handle)


def _bwrap_works() -> str | None:
    """None if bubblewrap can make a sandbox here, else why not."""
    if not shutil.which("bwrap"):
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    probe = subprocess.run(
        ["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"bwrap cannot create namespaces here: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def local_provider() -> Iterator[Provider]:
    from sandboxes.providers.local import LocalProvider

    problem = _bwrap_works()
    require(problem is None, problem or "")
    # Not under pytest's tmp_path: as root the sandboxes run as nobody, who must reach the directory.
    root = Path(tempfile.mkdtemp(prefix="workbench-test-sandboxes-"))
    root.chmod(0o711)
    provider = LocalProvider(root=root)
    try:
        provider.rootfs_of(IMAGE)
    except SandboxError:
        print("unpacking the local sandboxes' root file system with scripts/build-image.sh", file=sys.stderr)
        subprocess.run([ROOT / "scripts" / "build-image.sh"], timeout=1800)
    yield provider
    for handle in provider.list_handles():
        provider.terminate(handle)
    shutil.rmtree(root, ignore_errors=True)


def provisioned(provider: Provider, **overrides: Any) -> Iterator[Sandbox]:
    handle = provider.provision(sandbox_resources(**overrides))
    try:
        yield Sandbox(provider, handle)
    finally:
        provider.terminate(handle)


@pytest.fixture
def new_sandbox(request: pytest.FixtureRequest) -> Iterator[Callable[..., Sandbox]]:
    """Provision more sandboxes (with other resources) of the module's provider; all are removed."""
    provider: Provider = request.getfixturevalue("provider")
    handles: list[str] = []

    def make(**overrides: Any) -> Sandbox:
        handle = provider.provision(sandbox_resources(**overrides))
        handles.append(handle)
        return Sandbox(provider, handle)

    yield make
    for handle in handles:
        provider.terminate(handle)
