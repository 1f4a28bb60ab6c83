"""The egress proxy as a real process (from .venv-egress) against the test database, a Docker network of this
run's own for its sandboxes, and local servers that stand for the outside: two echoing HTTPS hosts
(127.0.0.1 and 127.0.0.2) and a git server that requires a token. The proxy's workers' door listens on
loopback (`door_url`, with `harness_token`); tests' own servers for it (MCP servers, token endpoints) listen
on 127.0.0.3 (DOOR_HOST), which the proxy may reach on any port.

Sandboxes reach the host's loopback only through the proxy, so the tests' commands in a sandbox clear
NO_PROXY (which lists 127.0.0.1 for the sandbox's own loopback) to send those addresses to the proxy.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from tests.conftest import ROOT, VAULT_KEYRING, child_env, free_port, require
from tests.git_server import GitServer, git_http_server
from tests.vault.egress.servers import EchoServer, TestCA, echo_server, make_ca
from vault import crypto

EGRESS_PYTHON = ROOT / ".venv-egress" / "bin" / "python"
GIT_TOKEN = "ghp_canary_git_7d1e0c9a5b3f"
RUN = uuid.uuid4().hex[:8]
STREAMED_OVER = 2048
DOOR_HOST = "127.0.0.3"
POLICY_CACHE_SECONDS = 600


@dataclass
class Egress:
    gateway: str
    port: int
    control_url: str
    network: str
    echo: EchoServer  # on 127.0.0.1
    other: EchoServer  # on 127.0.0.2
    git: GitServer
    ca: TestCA
    log: Path
    keyring_file: Path
    door_url: str  # the workers' door (EGRESS_HARNESS_URL)
    harness_token: str
    bundle: Path  # the CA bundle the proxy writes (EGRESS_CA_FILE for the workers)

    child_settings: dict[str, str] = field(default_factory=dict)  # the sandbox network's, for child processes

    def child_env(self) -> dict[str, str]:
        """What a worker or web server started by a test needs to use this proxy: its sandboxes' network,
        the workers' door, and the control endpoint."""
        return {
            **self.child_settings,
            "EGRESS_HARNESS_URL": self.door_url,
            "EGRESS_HARNESS_TOKEN": self.harness_token,
            "EGRESS_CA_FILE": str(self.bundle),
            "EGRESS_CONTROL_URL": self.control_url,
            "EGRESS_CONTROL_TOKEN": "control-token",
        }

    def harness_settings(self) -> dict[str, Any]:
        """The settings a worker (this test process) uses to speak through the door."""
        return {
            "EGRESS_HARNESS_URL": self.door_url,
            "EGRESS_HARNESS_TOKEN": self.harness_token,
            "EGRESS_CA_FILE": str(self.bundle),
        }


def _taken_subnets() -> list[ipaddress.IPv4Network]:
    import docker

    client = docker.from_env(version="auto")
    taken = []
    for network in client.api.networks():
        for pool in (network.get("IPAM") or {}).get("Config") or []:
            if pool.get("Subnet") and ":" not in pool["Subnet"]:
                taken.append(ipaddress.ip_network(pool["Subnet"]))
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout.split()
    for word in routes:
        if "/" in word:
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(word, strict=False))
    return taken


def _free_subnet() -> str:
    taken = _taken_subnets()
    start = int(RUN, 16) % 200
    for i in range(200):
        candidate = ipaddress.ip_network(f"10.214.{(start + i) % 200 + 20}.0/24")
        if not any(candidate.overlaps(other) for other in taken):
            return str(candidate)
    raise RuntimeError("no free /24 under 10.214.0.0/16 for the test's sandbox network")


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the egress proxy exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the egress proxy did not come up:\n{log.read_text()[-4000:]}")


def _remove_firewall(bridge: str) -> None:
    iptables = shutil.which("iptables")
    if not iptables:
        return
    listed = subprocess.run([iptables, "-w", "-S", "INPUT"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        if f"-i {bridge} " in line + " ":
            subprocess.run([iptables, "-w", "-D", *line.split()[1:]], capture_output=True)


@pytest.fixture(scope="module")
def egress(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: Any) -> Iterator[Egress]:
    """The proxy, its network and the outside's servers, for a module of tests."""
    import docker

    require(EGRESS_PYTHON.exists(), "no .venv-egress: run scripts/egress-venv.sh (make test does)")
    require(shutil.which("iptables") is not None and os.geteuid() == 0, "needs root and iptables")
    try:
        engine = docker.from_env(version="auto")
        engine.ping()
    except docker.errors.DockerException as error:
        require(False, f"no Docker engine ({error}); `make test` starts one")
    from sandboxes.providers.docker import DockerProvider
    from sandboxes.provisioning import egress_gateway, egress_route

    folder = tmp_path_factory.mktemp("egress")
    ca = make_ca(folder / "tls", ["127.0.0.1", "127.0.0.2"])
    subnet = _free_subnet()
    port = free_port()
    control_port = free_port()
    door_port = free_port()
    harness_token = f"harness-{uuid.uuid4().hex}"
    names = {
        "SANDBOX_EGRESS": True,
        "EGRESS_NETWORK": f"workbench-egress-test-{RUN}",
        "EGRESS_BRIDGE": f"wbe-t{RUN}",
        "EGRESS_SUBNET": subnet,
        "EGRESS_PORT": port,
        "EGRESS_DATA_DIR": folder / "data",
        "REPOSITORY_PLAIN_HOSTS": ["127.0.0.1"],
    }
    overridden = override_settings(**names)
    overridden.enable()
    git_root = folder / "git"
    git_root.mkdir()
    process = None
    try:
        with (
            echo_server("127.0.0.1", ca) as echo,
            echo_server("127.0.0.2", ca) as other,
            git_http_server(git_root, token=GIT_TOKEN) as git,
        ):
            DockerProvider().prepare_egress(egress_route())
            log = folder / "egress.log"
            # A file, as `manage.py vault_key rotate` rewrites it while the proxy runs.
            keyring_file = folder / "keyring.json"
            crypto.write_atomically(keyring_file, crypto.dump(VAULT_KEYRING), 0o600)
            with django_db_blocker.unblock():
                env = child_env(
                    **{k: (",".join(v) if isinstance(v, list) else str(v)) for k, v in names.items()},
                    VAULT_KEY_FILE=str(keyring_file),
                    EGRESS_PRIVATE_ALLOWED=(
                        f"127.0.0.1:{echo.port},127.0.0.2:{other.port},127.0.0.1:{git.port},{DOOR_HOST}"
                    ),
                    EGRESS_HARNESS_LISTEN=f"127.0.0.1:{door_port}",
                    EGRESS_HARNESS_TOKEN=harness_token,
                    EGRESS_UPSTREAM_CA=str(ca.ca_file),
                    EGRESS_CONTROL_URL=f"http://127.0.0.1:{control_port}",
                    EGRESS_CONTROL_TOKEN="control-token",
                    # Long: a change must reach the proxy by the database's notice at its commit, not by
                    # the cache running out, or the tests that change a policy fail.
                    EGRESS_CACHE_SECONDS=str(POLICY_CACHE_SECONDS),
                    # Small, so that longer answers take the streaming path (scrubbed chunk by chunk).
                    EGRESS_BUFFER_BYTES=str(STREAMED_OVER),
                    DATABASE_POOL="false",
                )
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    [str(EGRESS_PYTHON), "-m", "vault.egress"], cwd=ROOT, env=env, stdout=out, stderr=out
                )
            _wait_healthy(f"http://127.0.0.1:{control_port}", process, log)
            yield Egress(
                gateway=egress_gateway(),
                port=port,
                control_url=f"http://127.0.0.1:{control_port}",
                network=names["EGRESS_NETWORK"],
                echo=echo,
                other=other,
                git=git,
                ca=ca,
                log=log,
                keyring_file=keyring_file,
                door_url=f"http://127.0.0.1:{door_port}",
                harness_token=harness_token,
                bundle=folder / "data" / "sandbox-ca-bundle.crt",
                child_settings={
                    k: (",".join(v) if isinstance(v, list) else str(v)) for k, v in names.items()
                },
            )
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        overridden.disable()
        for container in engine.containers.list(all=True, filters={"network": names["EGRESS_NETWORK"]}):
            container.remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):
            engine.networks.get(names["EGRESS_NETWORK"]).remove()
        _remove_firewall(names["EGRESS_BRIDGE"])
        from sandboxes.providers import docker as docker_provider

        docker_provider._prepared.discard(names["EGRESS_NETWORK"])


def healthz(egress: Egress) -> dict[str, Any]:
    with urllib.request.urlopen(f"{egress.control_url}/healthz", timeout=2) as answer:
        return json.loads(answer.read())
