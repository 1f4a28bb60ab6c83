"""LocalProvider on real bubblewrap: the same toolset, plus what is particular to a local sandbox."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.providers import get_provider
from sandboxes.providers.base import Provider, Resources, SandboxError, SandboxGone
from sandboxes.providers.local import LocalProvider

from .conftest import ROOT, Sandbox, provisioned
from .toolset_behaviour import ToolsetBehaviour


@pytest.fixture(scope="module")
def provider(local_provider: Provider) -> Provider:
    return local_provider


@pytest.fixture
def sandbox(provider: Provider) -> Iterator[Sandbox]:
    yield from provisioned(provider)


def directory(sandbox: Sandbox) -> Path:
    assert isinstance(sandbox.provider, LocalProvider)
    return sandbox.provider.root / sandbox.handle


def init_pid(sandbox: Sandbox) -> int:
    return int(json.loads((directory(sandbox) / "sandbox.json").read_text())["pid"])


class TestLocalToolset(ToolsetBehaviour):
    """The toolset's behaviour, in a local (bubblewrap) sandbox."""


def test_get_provider_returns_the_local_provider() -> None:
    assert isinstance(get_provider("local"), LocalProvider)


def test_a_sandbox_outlives_the_process_that_provisioned_it(provider: LocalProvider) -> None:
    """A Celery worker provisions, exits; another process calls the sandbox by its handle."""
    script = (
        "from sandboxes.providers.local import LocalProvider; from sandboxes.providers.base import Resources; "
        f"p = LocalProvider(root={str(provider.root)!r}); h = p.provision(Resources()); "
        "p.execute(h, 'bash', {'command': 'cd /tmp && export LEFT=by-the-first'}); print(h)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    made = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    sandbox = Sandbox(provider, made.stdout.strip())
    try:
        assert sandbox.bash("pwd; echo $LEFT") == "/tmp\nby-the-first"
    finally:
        provider.terminate(sandbox.handle)


def test_a_killed_sandbox_raises_sandbox_gone(sandbox: Sandbox) -> None:
    sandbox.bash("true")
    os.kill(init_pid(sandbox), signal.SIGKILL)
    with pytest.raises(SandboxGone, match="processes are gone"):
        sandbox.bash("echo hi")
    assert not sandbox.provider.is_alive(sandbox.handle)


def test_a_sandbox_killed_during_a_call_raises_sandbox_gone(sandbox: Sandbox) -> None:
    pid = init_pid(sandbox)
    threading.Timer(0.5, lambda: os.kill(pid, signal.SIGKILL)).start()
    started = time.monotonic()
    with pytest.raises(SandboxGone):
        sandbox.bash("sleep 30")
    assert time.monotonic() - started < 5


def test_a_removed_sandbox_raises_sandbox_gone(sandbox: Sandbox) -> None:
    sandbox.provider.terminate(sandbox.handle)
    with pytest.raises(SandboxGone, match="no longer exists"):
        sandbox.bash("echo hi")


def test_terminate_kills_every_process_of_the_sandbox(sandbox: Sandbox) -> None:
    sandbox.bash("nohup sleep 600 >/dev/null 2>&1 &")
    pid = init_pid(sandbox)
    sandbox.provider.terminate(sandbox.handle)
    assert not Path(f"/proc/{pid}").exists()
    assert not directory(sandbox).exists()
    leftover = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True)
    assert leftover.stdout == ""


def test_the_host_is_kept_out(sandbox: Sandbox) -> None:
    assert sandbox.bash("ls /etc/shadow /root /home 2>&1; true").count("No such file") == 2
    assert sandbox.bash("cat /etc/passwd | cut -d: -f1 | paste -sd' '") == "root sandbox nobody"
    assert sandbox.bash("touch /usr/x 2>&1 | grep -c 'Read-only'") == "1"
    assert sandbox.bash("ls /proc | grep -c '^[0-9]'").isdigit()
    assert int(sandbox.bash("ls /proc | grep -c '^[0-9]*$'")) < 10  # its own pid namespace


def test_a_symlink_planted_for_the_socket_is_not_followed(sandbox: Sandbox) -> None:
    """The provider (often root) must not be led by the sandbox to another socket of the host: it calls
    the socket it made outside the sandbox, whatever the sandbox plants in its /tmp."""
    decoy = directory(sandbox).parent / f"{sandbox.handle}-decoy.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(decoy))
        listener.listen(1)
        listener.settimeout(0.5)
        sandbox.bash(
            f"ln -s {decoy} /tmp/.toolbox/planted && mv -f /tmp/.toolbox/planted /tmp/.toolbox/daemon.sock"
        )
        assert sandbox.bash("echo still-the-daemon") == "still-the-daemon"
        with pytest.raises(TimeoutError):
            listener.accept()
    decoy.unlink()


def test_without_bwrap_provisioning_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxError, match="apt-get install -y bubblewrap"):
        LocalProvider(root=tmp_path).provision(Resources())
