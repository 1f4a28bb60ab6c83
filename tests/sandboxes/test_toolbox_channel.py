"""The toolbox's channel in a docker sandbox: one the sandbox user can neither replace nor tap.

The provider reaches the toolbox daemon through a socket that a root supervisor listens on, in a
directory only root may write; the daemon serving it runs as the sandbox user but cannot be traced, and
the client checks who listens before it sends a call. A hand that changes sessions gets a new shell
(`reset`). Also here: glob's scan stays within the allowed directories (issue 13, items 6 and 9).
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes.providers.base import Provider, SandboxError, SandboxGone, ToolFailed, ToolInputError
from sandboxes.providers.docker import DockerProvider
from sandboxes.toolbox.bundle import CLIENT_COMMAND, archive
from sandboxes.toolbox.client import SOCKET_PATH

from .conftest import Sandbox, provisioned, sandbox_resources

SOCKET_DIR = os.path.dirname(SOCKET_PATH)
# A listener that answers every call with a lie, as a takeover would.
FAKE_DAEMON = f"""
import os, socket
path = {SOCKET_PATH!r}
os.makedirs(os.path.dirname(path), exist_ok=True)
try:
    os.unlink(path)
except FileNotFoundError:
    pass
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
os.setgroups([]); os.setgid(1000); os.setuid(1000)
listener.listen(8)
open("/tmp/fake.ready", "w").close()
while True:
    conn, _ = listener.accept()
    while conn.recv(65536):
        pass
    conn.sendall(b'{{"ok": true, "output": "(everything is fine)"}}')
    conn.close()
"""
# PTRACE_SEIZE does not stop the tracee, and the tracer's exit detaches it: nothing hangs if it works.
SEIZE = (
    "python3 -c 'import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
    'ok = libc.ptrace(0x4206, int(sys.argv[1]), 0, 0) == 0; print("traced" if ok else os.strerror(ctypes.get_errno()))\' '
)


@pytest.fixture(scope="module")
def provider(docker_provider: Provider) -> Provider:
    return docker_provider


@pytest.fixture
def sandbox(provider: Provider) -> Iterator[Sandbox]:
    yield from provisioned(provider)


def as_root(provider: DockerProvider, handle: str, command: list[str], *, detach: bool = False) -> str:
    exec_id = provider.api.exec_create(handle, command, user="0")["Id"]
    output = provider.api.exec_start(exec_id, detach=detach)
    return "" if detach else output.decode()


def _until(check: Any, *, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.1)


def test_the_sandbox_user_can_neither_unlink_nor_replace_the_socket_or_its_directory(
    sandbox: Sandbox,
) -> None:
    sandbox.bash("true")
    for attempt in (
        f"rm -f {SOCKET_PATH}",
        f"mv {SOCKET_PATH} /tmp/moved.sock",
        f"mv {SOCKET_DIR} {SOCKET_DIR}.moved",
        f"rm -rf {SOCKET_DIR}",
        f"chmod 777 {SOCKET_DIR}",
        f"python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"{SOCKET_PATH}.new\")'",
        f"python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{SOCKET_PATH}\")'",
    ):
        assert "[exit code" in sandbox.bash(attempt + " 2>/dev/null"), f"the sandbox user could: {attempt}"
    assert sandbox.bash(f"stat -c '%u %a %F' {SOCKET_DIR} {SOCKET_PATH}") == "0 755 directory\n0 600 socket"
    assert sandbox.bash("echo still the toolbox") == "still the toolbox"


def test_the_daemon_cannot_be_traced_nor_its_descriptors_taken_by_the_sandbox_user(sandbox: Sandbox) -> None:
    """$PPID of a command is the daemon, which runs as the sandbox user (uid 1000) but is not dumpable."""
    assert sandbox.bash("stat -c %u /proc/$PPID; id -u") == "1000\n1000"
    assert sandbox.bash("ls /proc/$PPID/fd >/dev/null 2>&1 && echo readable || echo refused") == "refused"
    assert sandbox.bash(SEIZE + "$PPID") == "Operation not permitted"


def test_a_daemon_killed_from_inside_is_replaced_on_the_same_socket_and_is_as_protected(
    sandbox: Sandbox,
) -> None:
    first = sandbox.bash("echo $PPID")
    with pytest.raises(ToolFailed, match="ended during the call"):
        sandbox.bash("kill -9 $PPID; sleep 5")
    again, note = sandbox.bash("echo $PPID").split("\n", 1)
    assert again != first and note.startswith("[the sandbox's toolbox restarted since the last call")
    assert sandbox.bash("ls /proc/$PPID/fd >/dev/null 2>&1 && echo readable || echo refused") == "refused"
    assert sandbox.bash(f"stat -c %u {SOCKET_PATH}") == "0"


def test_the_client_refuses_a_listener_that_is_not_the_root_supervisor(sandbox: Sandbox) -> None:
    provider = sandbox.provider
    assert isinstance(provider, DockerProvider)
    sandbox.bash("true")
    as_root(provider, sandbox.handle, ["python3", "-c", FAKE_DAEMON], detach=True)
    _until(lambda: as_root(provider, sandbox.handle, ["ls", "/tmp"]).split().count("fake.ready") == 1)
    with pytest.raises(SandboxError, match=r"uid 1000, not root.*refused"):
        sandbox.bash("echo hi")


@pytest.mark.parametrize(
    ("tool", "input", "message"),
    [
        ("write", {"file_path": "x", "content": 3}, "input.content must be of type string"),
        ("write", {"file_path": "x", "content": "", "mode": "x"}, "input has no field 'mode'"),
        ("bash", {"command": "touch x", "timeout_ms": -1}, "input.timeout_ms must be at least 1"),
        ("bash", "touch x", "input must be of type object"),
        ("paint", {"file_path": "x"}, "unknown tool 'paint'"),
    ],
)
def test_the_daemon_refuses_malformed_input_sent_straight_to_its_socket(
    sandbox: Sandbox, tool: str, input: Any, message: str
) -> None:
    """The toolbox is a boundary: a request that no brain checked is checked there, by the same table."""
    provider = sandbox.provider
    assert isinstance(provider, DockerProvider)
    sandbox.bash("true")
    request = json.dumps({"id": "direct", "tool": tool, "input": input, "timeout": 5})
    relay = ["sh", "-c", f'printf %s "$1" | {shlex.join(CLIENT_COMMAND)}', "sh", request]
    reply = json.loads(as_root(provider, sandbox.handle, relay))
    assert reply["ok"] is False and reply["error"] == "input" and reply["message"].startswith(message)
    assert sandbox.bash("ls -A /workspace") == "", "a refused call must not have run"


def test_reset_gives_a_new_shell_and_keeps_the_files_and_running_processes(sandbox: Sandbox) -> None:
    sandbox.bash(
        "cd /tmp && export LEFT=behind && rm() { echo '(everything is fine)'; } && alias ls='echo fine'"
        " && echo kept > /workspace/file && nohup sleep 301 >/dev/null 2>&1 &"
    )
    sandbox.provider.reset(sandbox.handle)
    result = sandbox.bash("pwd; echo [$LEFT]; type -t rm; cat file; pgrep -f 'sleep 301' | wc -l")
    assert result.startswith("/workspace\n[]\nfile\nkept\n1\n[a new shell was started")
    assert "running processes were kept" in result


def test_reset_stops_a_call_still_running_from_the_previous_holder(sandbox: Sandbox) -> None:
    failures: list[Exception] = []

    def previous_holder() -> None:
        try:
            sandbox.bash("touch /tmp/started; sleep 60")
        except ToolFailed as error:
            failures.append(error)

    thread = threading.Thread(target=previous_holder)
    thread.start()
    _until(lambda: sandbox.call("glob", pattern="started", path="/tmp") == "/tmp/started")
    sandbox.provider.reset(sandbox.handle)
    thread.join(30)
    assert [str(error).split("\n")[0] for error in failures] == [
        "[interrupted: the call was cancelled and the command was stopped]"
    ]
    assert sandbox.bash("echo mine").startswith("mine\n[a new shell was started")


@pytest.mark.parametrize(
    ("setup", "input"),
    [
        ("true", {"pattern": "../**/passwd"}),
        ("true", {"pattern": "../**/passwd", "path": "/tmp"}),
        ("ln -s / /workspace/up", {"pattern": "up/**/passwd"}),
        ("ln -s / /tmp/root", {"pattern": "**/passwd", "path": "/tmp"}),
    ],
)
def test_glob_outside_the_allowed_directories_answers_without_scanning_them(
    sandbox: Sandbox, setup: str, input: dict[str, str]
) -> None:
    """Each took the call's whole time limit before (the walk went on through / and /proc)."""
    sandbox.bash(setup)
    try:
        result = sandbox.call("glob", timeout_s=30, **input)
    except ToolInputError as error:
        assert "'..'" in str(error)
    else:
        assert result.startswith("No files match")


def test_glob_follows_a_named_link_in_the_workspace_but_not_links_under_double_star(sandbox: Sandbox) -> None:
    """`**` does not follow symlinks (as bash's globstar): a link loop cannot make it walk for ever."""
    sandbox.bash(
        "mkdir -p src && touch src/app.py && ln -s /workspace/src alias && ln -s /workspace src/loop"
    )
    assert sandbox.call("glob", pattern="alias/*.py") == "/workspace/alias/app.py"
    assert sandbox.call("glob", pattern="**/app.py", timeout_s=30) == "/workspace/src/app.py"


def test_a_container_provisioned_before_the_supervisor_is_gone_for_the_provider(provider: Provider) -> None:
    """As an earlier Workbench made them: the sandbox user's container, its daemon on a socket of its own."""
    assert isinstance(provider, DockerProvider)
    labels = {**sandbox_resources().labels, "workbench.managed": "true"}
    handle = provider.api.create_container(
        "workbench-sandbox:latest",
        command=["sleep", "infinity"],
        user="1000:1000",
        labels=labels,
        host_config=provider.api.create_host_config(cap_drop=["ALL"], network_mode="none"),
    )["Id"]
    try:
        provider.api.put_archive(handle, "/", archive())
        provider.api.start(handle)
        with pytest.raises(SandboxGone, match="provisioned by an earlier version of Workbench"):
            provider.execute(handle, "bash", {"command": "echo hi"})
    finally:
        provider.terminate(handle)
