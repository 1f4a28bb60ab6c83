"""The docker provider's relays, on the real Docker engine: call after call goes through one `docker exec` of
the toolbox's relay that the process keeps per sandbox, instead of an exec of the client per call
(sandboxes/providers/relays.py, sandboxes/toolbox/relay.py)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes.providers import docker as docker_provider_module
from sandboxes.providers import relays as relays_module
from sandboxes.providers.base import Provider, SandboxError, ToolFailed
from sandboxes.providers.docker import DockerProvider
from sandboxes.providers.protocol import build_request
from sandboxes.providers.relays import EMPTY_FRAME, KEPT_PER_SANDBOX, Relay, Relays, relays

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
    sandbox.bash("true")
    assert relays().count(sandbox.handle) == 1  # the call goes to the kept relay, not to a new exec
    provider.pause(sandbox.handle)
    try:
        began = time.monotonic()
        with pytest.raises(SandboxError, match="paused"):
            sandbox.bash("touch /workspace/ran")
        assert docker_provider_module.PAUSED_LOOK_S <= time.monotonic() - began < 5
    finally:
        provider.unpause(sandbox.handle)
    eventually(lambda: not relay_processes(api, sandbox.handle))
    assert sandbox.bash("ls -a /workspace") == ".\n.."


def test_a_call_running_when_its_sandbox_is_paused_waits_for_it(
    sandbox: Sandbox, provider: DockerProvider, api: Any
) -> None:
    """Once GO went the call may run: a pause then holds it, and it answers once unpaused (it is not
    reported as failed while it would go on)."""
    sandbox.bash("true")

    def started() -> bool:
        exec_id = api.exec_create(sandbox.handle, ["test", "-e", "/workspace/started"], user="0")["Id"]
        api.exec_start(exec_id)
        return api.exec_inspect(exec_id)["ExitCode"] == 0

    def pause_while_it_runs() -> None:
        eventually(started)
        provider.pause(sandbox.handle)
        time.sleep(2 * docker_provider_module.PAUSED_LOOK_S + 0.5)  # past the provider's look
        provider.unpause(sandbox.handle)

    pauser = threading.Thread(target=pause_while_it_runs)
    pauser.start()
    try:
        assert sandbox.bash("touch /workspace/started; sleep 1.5; echo done") == "done"
    finally:
        pauser.join()


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


def test_a_forked_process_starts_with_relays_of_its_own() -> None:
    """The child neither uses nor shuts down its parent's streams, and has locks of its own."""
    mine = relays()
    left, right = socket.socketpair()
    mine.give_back("a-sandbox", Relay("exec", left))
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report, and leave without running pytest's cleanup
        os.close(read)
        theirs = relays()
        os.write(write, b"fresh" if theirs is not mine and theirs.count("a-sandbox") == 0 else b"inherited")
        os._exit(0)
    os.close(write)
    said = os.read(read, 64)
    os.waitpid(child, 0)
    os.close(read)
    assert said == b"fresh"
    assert relays() is mine and mine.count("a-sandbox") == 1
    mine.drop("a-sandbox")
    right.close()


def test_a_give_back_closes_every_relay_idle_past_its_reuse_time() -> None:
    """Relays of sandboxes this process never calls again are closed by the next give-back of any."""
    pool = Relays()
    (old, old_peer), (new, new_peer) = socket.socketpair(), socket.socketpair()
    stale = Relay("stale", old)
    pool.give_back("gone-sandbox", stale)
    stale.idle_since -= relays_module.REUSE_S + 1
    pool.give_back("live-sandbox", Relay("fresh", new))
    assert pool.count("gone-sandbox") == 0 and pool.count("live-sandbox") == 1
    assert old.fileno() == -1 and old_peer.recv(1) == b""  # closed, and its peer saw the end
    pool.drop("live-sandbox")
    old_peer.close()
    new_peer.close()


def mux(data: bytes, stream: int = 1) -> bytes:
    """`data` as the engine sends an exec's output: an 8-byte header (stream, size), then the bytes."""
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def test_the_relays_stream_is_read_whole_however_it_is_cut() -> None:
    """READ, then GO and the reply's frame, each cut at every byte and mixed with stderr: the relay asks to
    run the call once, the reply is whole only at its last byte, and nothing is left over."""
    reply = b'{"ok": true, "output": "hi"}'
    request = build_request("bash", {"command": "echo hi"}, timeout_s=None)
    for cut in range(1, len(reply)):
        left, right = socket.socketpair()
        relay = Relay("exec", left)
        relay.opening(request)
        asked = [relay.feed(bytes([byte])) for byte in mux(b"oops", stream=2) + mux(EMPTY_FRAME)]
        assert asked.count(True) == 1 and asked[-1] is True
        assert not relay.has_reply()  # no GO yet
        relay.go()
        stream = mux(len(reply).to_bytes(4, "big") + reply[:cut]) + mux(reply[cut:])
        for n in range(len(stream)):
            relay.feed(stream[n : n + 1])
            assert relay.has_reply() == (n == len(stream) - 1)
        assert relay.take_reply() == reply and relay.frames.empty
        left.close()
        right.close()


def test_a_relay_that_says_anything_but_read_first_is_refused() -> None:
    left, right = socket.socketpair()
    relay = Relay("exec", left)
    relay.opening(build_request("bash", {"command": "true"}, timeout_s=None))
    with pytest.raises(SandboxError, match="READ"):
        relay.feed(mux(b"\x00\x00\x00\x05hello"))
    left.close()
    right.close()
