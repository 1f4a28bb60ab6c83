"""The docker provider's relays, on the real Docker engine: call after call goes through one `docker exec` of
the toolbox's relay that the process keeps per sandbox, instead of an exec of the client per call
(sandboxes/providers/relays.py, sandboxes/toolbox/relay.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes.providers import docker as docker_provider_module
from sandboxes.providers import relays as relays_module
from sandboxes.providers.base import Provider, SandboxError, ToolFailed
from sandboxes.providers.docker import DockerProvider
from sandboxes.providers.relays import KEPT_PER_SANDBOX, Relays, relays

from .conftest import Sandbox, provisioned, sandbox_resources

# Ends every relay of the container but itself (its own command line names relay.py too).
KILL_RELAYS = (
    "import os, signal\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    if int(pid) != os.getpid() and b'relay.py' in open(f'/proc/{pid}/cmdline', 'rb').read():\n"
    "        os.kill(int(pid), signal.SIGKILL)\n"
)


@pytest.fixture(scope="module")
def provider(docker_provider: Provider) -> Provider:
    return docker_provider


@pytest.fixture
def sandbox(provider: Provider) -> Iterator[Sandbox]:
    yield from provisioned(provider)


@pytest.fixture
def api(provider: DockerProvider) -> Any:
    return provider.api


def relay_processes(api: Any, handle: str) -> list[str]:
    return [row[-1] for row in api.top(handle)["Processes"] if "relay.py" in row[-1]]


def as_root(api: Any, handle: str, command: list[str]) -> bytes:
    exec_id = api.exec_create(handle, command, user="0")["Id"]
    output: bytes = api.exec_start(exec_id)
    assert api.exec_inspect(exec_id)["ExitCode"] == 0, output
    return output


def kept_relay_id(handle: str) -> str:
    relay = relays().take(handle)
    assert relay is not None, "no relay kept for the sandbox"
    relays().give_back(handle, relay)
    return relay.exec_id


def eventually(check: Any, timeout_s: float = 10.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < give_up, "not within the time"
        time.sleep(0.1)


def test_call_after_call_goes_through_the_one_relay_the_process_keeps(sandbox: Sandbox, api: Any) -> None:
    assert sandbox.bash("echo first") == "first"
    first = kept_relay_id(sandbox.handle)
    for n in range(5):
        assert sandbox.bash(f"echo {n}") == str(n)
    assert kept_relay_id(sandbox.handle) == first
    assert relays().count(sandbox.handle) == 1
    assert len(relay_processes(api, sandbox.handle)) == 1


def test_calls_at_once_each_take_a_relay_and_the_process_keeps_a_few(sandbox: Sandbox, api: Any) -> None:
    results: dict[int, str] = {}

    def call(n: int) -> None:
        results[n] = sandbox.bash(f"sleep 0.5; echo {n}")

    threads = [threading.Thread(target=call, args=(n,)) for n in range(KEPT_PER_SANDBOX + 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {n: str(n) for n in range(KEPT_PER_SANDBOX + 2)}
    assert relays().count(sandbox.handle) == KEPT_PER_SANDBOX
    # The ones not kept were closed, and their relays in the sandbox ended with their input.
    eventually(lambda: len(relay_processes(api, sandbox.handle)) == KEPT_PER_SANDBOX)


def test_a_relay_that_ended_in_the_sandbox_is_not_used_again(sandbox: Sandbox, api: Any) -> None:
    sandbox.bash("true")
    ended = kept_relay_id(sandbox.handle)
    as_root(api, sandbox.handle, ["python3", "-c", KILL_RELAYS])
    eventually(lambda: not relay_processes(api, sandbox.handle))
    assert sandbox.bash("echo still") == "still"
    assert kept_relay_id(sandbox.handle) != ended


def test_a_relay_idle_past_its_reuse_time_is_replaced(
    sandbox: Sandbox, api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox.bash("true")
    old = kept_relay_id(sandbox.handle)
    monkeypatch.setattr(relays_module, "REUSE_S", 0.0)
    assert sandbox.bash("echo new") == "new"
    monkeypatch.undo()
    assert kept_relay_id(sandbox.handle) != old
    eventually(lambda: len(relay_processes(api, sandbox.handle)) == 1)  # the old one ended with its input


def test_a_call_sent_to_a_paused_sandbox_fails_and_never_runs(
    sandbox: Sandbox, provider: DockerProvider, api: Any
) -> None:
    """The relay, frozen with its container, cannot say it read the call; the provider gives up on it
    within seconds without letting it run, and the relay, thawed, finds its input ended and does not."""
    sandbox.bash("true")  # a relay is kept
    provider.pause(sandbox.handle)
    try:
        began = time.monotonic()
        with pytest.raises(SandboxError, match="paused"):
            sandbox.bash("touch /workspace/ran")
        assert time.monotonic() - began < 5
    finally:
        provider.unpause(sandbox.handle)
    eventually(lambda: not relay_processes(api, sandbox.handle))
    assert sandbox.bash("ls -a /workspace") == ".\n.."


def test_a_call_stopped_before_the_relay_said_it_read_it_never_runs(sandbox: Sandbox, api: Any) -> None:
    """Cancelled at once: the relay's READ comes after the stop, and is not answered with GO."""
    sandbox.bash("true")
    with pytest.raises(ToolFailed, match="interrupted"):
        sandbox.bash("touch /workspace/ran", cancelled=lambda: True)
    eventually(lambda: len(relay_processes(api, sandbox.handle)) == 0)  # it ended with its input
    assert sandbox.bash("ls -a /workspace") == ".\n.."


def test_a_sandbox_whose_toolbox_has_no_relay_is_called_through_a_client_per_call(
    sandbox: Sandbox, api: Any
) -> None:
    """A sandbox made by a Workbench before relays (its toolbox has no relay.py) still takes calls, each
    once: the relay that could not start never read the call."""
    relays().drop(sandbox.handle)
    as_root(api, sandbox.handle, ["rm", "/opt/workbench/toolbox/relay.py"])
    try:
        assert sandbox.bash("echo once >> /workspace/calls; cat /workspace/calls") == "once"
        assert sandbox.handle in docker_provider_module._without_relay
        assert sandbox.bash("echo again") == "again"
        assert relays().count(sandbox.handle) == 0
    finally:
        docker_provider_module._without_relay.discard(sandbox.handle)


def test_terminate_closes_the_sandboxs_relays(provider: DockerProvider) -> None:
    sandbox = Sandbox(provider, provider.provision(sandbox_resources()))
    sandbox.bash("true")
    assert relays().count(sandbox.handle) == 1
    provider.terminate(sandbox.handle)
    assert relays().count(sandbox.handle) == 0


def test_a_forked_process_starts_with_relays_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = relays()
    assert relays() is mine
    monkeypatch.setattr(relays_module.os, "getpid", lambda: -1)
    theirs = relays()
    assert isinstance(theirs, Relays) and theirs is not mine
