"""DockerProvider on the real Docker engine, with the default image (workbench-sandbox:latest)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from bench.common.machine import cpu_cgroup, cpu_weight
from sandboxes.providers import docker as docker_provider_module
from sandboxes.providers import get_provider
from sandboxes.providers.base import Provider, Resources, SandboxError, SandboxGone, ToolFailed
from sandboxes.providers.docker import TOOLBOX_BASE_LABEL, TOOLBOX_IMAGE, TOOLBOX_LABEL, DockerProvider
from sandboxes.toolbox.bundle import digest as toolbox_digest
from sandboxes.toolbox.bundle import source_files
from tests.conftest import require

from .conftest import IMAGE, Sandbox, provisioned, sandbox_resources
from .toolset_behaviour import ToolsetBehaviour


@pytest.fixture(scope="module")
def provider(docker_provider: Provider) -> Provider:
    return docker_provider


@pytest.fixture
def sandbox(provider: Provider) -> Iterator[Sandbox]:
    yield from provisioned(provider)


@pytest.fixture
def api(provider: DockerProvider) -> Any:
    return provider.api


class TestDockerToolset(ToolsetBehaviour):
    """The toolset's behaviour, in a docker sandbox."""


def test_get_provider_returns_the_docker_provider() -> None:
    assert isinstance(get_provider("docker"), DockerProvider)
    with pytest.raises(ValueError, match="unknown sandbox provider 'kubernetes'"):
        get_provider("kubernetes")


def test_the_container_is_hardened_and_limited_as_resources_say(new_sandbox: Any, api: Any) -> None:
    sandbox = new_sandbox(cpus=0.5, memory_mb=256, pids=100, env={"PROJECT": "demo"})
    config = api.inspect_container(sandbox.handle)
    host = config["HostConfig"]
    # Root is the toolbox's supervisor alone, with what it needs to drop to the sandbox user (uid 1000).
    assert config["Config"]["User"] == "0:0" and host["CapAdd"] == ["SETUID", "SETGID"]
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == 100 and host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 256 * 1024 * 1024
    assert host["Init"] is True and host["NetworkMode"] == "none"
    assert config["Config"]["Labels"]["workbench.managed"] == "true"
    assert config["Config"]["Labels"]["workbench.sandbox"].startswith("sandbox-")
    assert sandbox.bash("echo $PROJECT; whoami") == "demo\nsandbox"


def test_network_is_given_only_when_resources_ask(new_sandbox: Any, api: Any) -> None:
    sandbox = new_sandbox(network=True)
    assert api.inspect_container(sandbox.handle)["HostConfig"]["NetworkMode"] == "bridge"
    assert "eth0" in sandbox.bash("cat /proc/net/dev")


def test_a_killed_container_raises_sandbox_gone_naming_the_kill(sandbox: Sandbox, api: Any) -> None:
    sandbox.bash("true")
    api.kill(sandbox.handle)
    with pytest.raises(SandboxGone, match=r"the sandbox container was killed \(exit 137\)"):
        sandbox.bash("echo hi")
    assert not sandbox.provider.is_alive(sandbox.handle)


def test_a_container_killed_during_a_call_raises_sandbox_gone(sandbox: Sandbox, api: Any) -> None:
    sandbox.bash("true")
    threading.Timer(0.5, lambda: api.kill(sandbox.handle)).start()
    started = time.monotonic()
    with pytest.raises(SandboxGone, match=r"killed \(exit 137\)"):
        sandbox.bash("sleep 30")
    assert time.monotonic() - started < 5


def test_a_removed_container_raises_sandbox_gone(sandbox: Sandbox, api: Any) -> None:
    api.remove_container(sandbox.handle, force=True)
    with pytest.raises(SandboxGone, match="no longer exists"):
        sandbox.bash("echo hi")
    assert not sandbox.provider.is_alive(sandbox.handle)


def test_a_command_out_of_memory_is_killed_and_the_sandbox_stays(new_sandbox: Any) -> None:
    sandbox = new_sandbox(memory_mb=64)
    result = sandbox.bash("python3 -c 'x = bytearray(200 * 1024 * 1024)'")
    assert result.endswith("[exit code 137]")
    assert sandbox.bash("echo alive") == "alive"


def test_a_toolbox_daemon_killed_by_the_model_is_restarted_by_the_next_call(sandbox: Sandbox) -> None:
    sandbox.bash("cd /tmp")
    with pytest.raises(ToolFailed, match="ended during the call"):
        sandbox.bash("kill -9 $PPID; sleep 5")
    result = sandbox.bash("pwd")
    assert result.startswith("/workspace\n[the sandbox's toolbox restarted since the last call")


def test_pause_holds_calls_and_unpause_resumes_them(sandbox: Sandbox, provider: DockerProvider) -> None:
    sandbox.bash("export KEPT=yes")
    provider.pause(sandbox.handle)
    try:
        with pytest.raises(SandboxError, match="paused"):
            sandbox.bash("echo hi")
        assert provider.is_alive(sandbox.handle)
    finally:
        provider.unpause(sandbox.handle)
    assert sandbox.bash("echo $KEPT") == "yes"


def test_snapshot_commits_the_files_to_an_image_a_new_sandbox_starts_from(
    sandbox: Sandbox, provider: DockerProvider, api: Any
) -> None:
    sandbox.call("write", file_path="state.txt", content="saved")
    reference = provider.snapshot(sandbox.handle, tag=f"workbench-snapshot-test:{sandbox.handle[:12]}")
    restored = Sandbox(provider, provider.provision(sandbox_resources(image=reference)))
    try:
        assert restored.bash("cat state.txt") == "saved"
        assert "restarted" not in restored.bash("echo fresh")
    finally:
        provider.terminate(restored.handle)
        api.remove_image(reference, force=True)


def test_an_image_with_its_own_entrypoint_still_starts_the_sandbox(
    sandbox: Sandbox, provider: DockerProvider, api: Any
) -> None:
    """An environment's image may set an ENTRYPOINT (many do): the sandbox runs its own command all the same,
    not as arguments to that entrypoint."""
    changes = ['ENTRYPOINT ["/bin/false"]']
    image = api.commit(
        sandbox.handle, repository="workbench-entrypoint-test", tag=sandbox.handle[:12], changes=changes
    )
    other = None
    try:
        assert api.inspect_image(image["Id"])["Config"]["Entrypoint"] == ["/bin/false"]
        other = Sandbox(provider, provider.provision(sandbox_resources(image=image["Id"])))
        assert other.bash("echo hi") == "hi"
    finally:
        if other is not None:
            provider.terminate(other.handle)
        api.remove_image(image["Id"], force=True)


def test_sandboxes_start_from_a_toolbox_image_made_once(
    provider: DockerProvider, api: Any, monkeypatch
) -> None:
    """The toolbox goes into an image made from the sandbox's image once, not into each container: a new
    sandbox starts from that image without anything copied in, and works."""
    made = provider.toolbox_image(IMAGE)
    labels = api.inspect_image(made)["Config"]["Labels"]
    assert labels[TOOLBOX_LABEL] == toolbox_digest()
    assert labels[TOOLBOX_BASE_LABEL] == api.inspect_image(IMAGE)["Id"] != made

    def no_copy(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a sandbox had something copied into it at its start")

    monkeypatch.setattr(api, "put_archive", no_copy)
    monkeypatch.setattr(api, "commit", no_copy)
    sandbox = Sandbox(provider, provider.provision(sandbox_resources()))
    try:
        assert api.inspect_container(sandbox.handle)["Image"] == made
        assert (
            sandbox.bash("echo hi; ls /opt/workbench/toolbox | grep -c py$") == f"hi\n{len(source_files())}"
        )
        # A snapshot of a sandbox holds the toolbox (its folder is root's): it is a toolbox image as it is.
        monkeypatch.undo()
        snapshot = provider.snapshot(
            sandbox.handle, tag=f"workbench-snapshot-test:toolbox-{sandbox.handle[:12]}"
        )
        try:
            assert provider.toolbox_image(snapshot) == api.inspect_image(snapshot)["Id"]
        finally:
            api.remove_image(snapshot, force=True)
    finally:
        provider.terminate(sandbox.handle)


def test_another_toolbox_gets_its_own_toolbox_images_and_old_ones_go(
    provider: DockerProvider, api: Any, monkeypatch
) -> None:
    """A new version of the toolbox (or a rebuilt sandbox image) makes a new toolbox image, and a sandbox
    starts from it; of the toolbox images, the TOOLBOX_IMAGES_KEPT made last stay, and one a sandbox runs
    from stays while it does."""
    run = time.time_ns()
    monkeypatch.setattr(docker_provider_module, "TOOLBOX_IMAGES_KEPT", 2)
    made = []
    running = None
    try:
        for n in range(4):
            monkeypatch.setattr(docker_provider_module, "toolbox_digest", lambda n=n: f"test-{run}-{n}")
            made.append(provider.toolbox_image(IMAGE))
            if n == 0:
                running = Sandbox(provider, provider.provision(sandbox_resources()))
                assert api.inspect_container(running.handle)["Image"] == made[0]
                assert running.bash("echo hi") == "hi"
        assert len(set(made)) == 4
        left = {image["Id"] for image in api.images(filters={"reference": TOOLBOX_IMAGE})}
        assert made[0] in left and made[1] not in left and {made[2], made[3]} <= left
    finally:
        if running is not None:
            provider.terminate(running.handle)
        for image in made:
            with contextlib.suppress(docker.errors.APIError):
                api.remove_image(image, force=True)


def test_of_one_toolbox_image_made_twice_at_once_the_one_that_lost_its_tag_goes(
    provider: DockerProvider, api: Any
) -> None:
    """Two processes that make the same toolbox image at once both commit one, and the second takes the tag:
    the first, untagged and unused, goes with the second's prune."""
    base = api.inspect_image(IMAGE)["Id"]
    key = f"test-race-{time.time_ns()}"
    first = provider._make_toolbox_image(key, base)
    second = provider._make_toolbox_image(key, base)
    try:
        left = {image["Id"] for image in api.images(all=True)}
        assert first != second and second in left and first not in left
    finally:
        for image in (first, second):
            with contextlib.suppress(docker.errors.APIError):
                api.remove_image(image, force=True)


def test_a_missing_image_is_a_sandbox_error_that_says_how_to_build_it(provider: Provider) -> None:
    with pytest.raises(SandboxError, match="make image"):
        provider.provision(Resources(image="workbench-sandbox:absent", labels={"workbench.test": "x"}))


def test_an_unreachable_engine_is_a_sandbox_error_saying_so() -> None:
    unreachable = DockerProvider(
        api=docker.APIClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    )
    with pytest.raises(SandboxError, match="not reachable"):
        unreachable.provision(Resources())
    with pytest.raises(SandboxError, match="not reachable"):
        unreachable.execute("0" * 64, "bash", {"command": "true"})


def test_the_engine_yields_the_cpu_to_the_platform(sandbox: Sandbox, api: Any) -> None:
    """scripts/start-dockerd.sh runs the engine in a cgroup of low CPU weight: dockerd, containerd and the shim
    that started this sandbox's container (a start's and a removal's work); the sandbox's own processes stay
    in the group Docker gives them, with a process's weight."""
    pid_file = Path(os.environ.get("DOCKERD_PIDFILE", "/var/run/docker.pid"))
    dockerd = int(pid_file.read_text()) if pid_file.is_file() else 0
    require(
        dockerd > 0 and Path(f"/proc/{dockerd}").is_dir(),
        f"the Docker engine is not a dockerd of this machine started by scripts/start-dockerd.sh ({pid_file})",
    )
    engine = cpu_cgroup(dockerd)
    assert engine.rstrip("/").endswith("/workbench-engine"), f"dockerd is in the cpu cgroup {engine}"
    assert cpu_weight(engine) == pytest.approx(10, abs=0.5)
    init = api.inspect_container(sandbox.handle)["State"]["Pid"]
    shim = int(Path(f"/proc/{init}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert "containerd-shim" in Path(f"/proc/{shim}/cmdline").read_text()
    assert cpu_cgroup(shim) == engine
    assert cpu_cgroup(init) != engine
    assert cpu_weight(cpu_cgroup(init)) >= 100
