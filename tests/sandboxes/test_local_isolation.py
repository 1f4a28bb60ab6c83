"""What a local (bubblewrap) sandbox keeps from its user, as the docker provider does: a seccomp filter,
the image's read-only root, no host path or environment in /proc, a disk quota, a toolbox channel the
sandbox cannot reach, and no process left once no server process holds the provider's root."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes.providers.base import Provider, Resources, SandboxError
from sandboxes.providers.local import LocalProvider
from tests.conftest import child_env

from .conftest import ROOT, Sandbox

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def provider(local_provider: Provider) -> Provider:
    return local_provider


@pytest.fixture
def sandbox(new_sandbox: Callable[..., Sandbox]) -> Sandbox:
    return new_sandbox()


def directory(sandbox: Sandbox) -> Path:
    assert isinstance(sandbox.provider, LocalProvider)
    return sandbox.provider.root / sandbox.handle


def meta(sandbox: Sandbox) -> dict[str, object]:
    return dict(json.loads((directory(sandbox) / "sandbox.json").read_text()))


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


# -- the seccomp filter

SYSCALLS = r"""
import ctypes, errno, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
numbers = {"x86_64": {"keyctl": 250, "bpf": 321, "perf_event_open": 298, "mount": 165, "ptrace": 101},
           "aarch64": {"keyctl": 219, "bpf": 280, "perf_event_open": 241, "mount": 40, "ptrace": 117}}
for name, number in numbers[os.uname().machine].items():
    result = libc.syscall(number, 0, 0, 0, 0, 0)
    print(name, errno.errorcode.get(ctypes.get_errno(), "ok") if result < 0 else "ok")
tty = os.open("/dev/tty", os.O_RDWR)
try:
    fcntl.ioctl(tty, termios.TIOCSTI, b"x")
    print("TIOCSTI ok")
except OSError as error:
    print("TIOCSTI", errno.errorcode[error.errno])
"""


def test_the_seccomp_filter_denies_what_docker_s_does_and_normal_tools_work(sandbox: Sandbox) -> None:
    assert sandbox.bash("unshare -U true 2>&1; echo $?").endswith("Operation not permitted\n1")
    assert sandbox.bash("unshare -n true 2>&1; echo $?").endswith("Operation not permitted\n1")
    sandbox.call("write", file_path="syscalls.py", content=SYSCALLS)
    assert sandbox.bash("python3 syscalls.py").splitlines() == [
        "keyctl EPERM",
        "bpf EPERM",
        "perf_event_open EPERM",
        "mount EPERM",
        "ptrace EPERM",
        "TIOCSTI EPERM",
    ]
    assert sandbox.bash("grep '^Seccomp:' /proc/self/status") == "Seccomp:\t2"
    # Forks, threads, pipes, a subprocess and the usual tools are untouched.
    assert sandbox.bash("git init -q repo && cd repo && git status --short | wc -l") == "0"
    assert sandbox.bash(
        'python3 -c \'import subprocess; print(subprocess.check_output(["echo", "hi"]))\''
    ) == ("b'hi\\n'")
    assert sandbox.bash("echo needle > hay.txt; rg -c needle hay.txt; (sleep 0.1 &) ; wait") == "1"


# -- the root file system


@pytest.fixture
def host_only_files() -> Iterator[list[Path]]:
    """Files that exist on the host only: /usr/local/etc/npmrc (made for the test if missing) and a marker."""
    made = []
    npmrc = Path("/usr/local/etc/npmrc")
    marker = Path(f"/usr/local/share/workbench-host-only-{os.getpid()}")
    for path in (npmrc, marker):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("host only\n")
            made.append(path)
    yield [npmrc, marker]
    for path in made:
        path.unlink()


def test_the_root_is_the_image_s_read_only_and_holds_no_host_file(
    sandbox: Sandbox, host_only_files: list[Path]
) -> None:
    for path in host_only_files:
        assert sandbox.bash(f"test -e {path}; echo $?") == "1", path
    assert sandbox.bash(f"test -e {ROOT}; echo $?") == "1"
    assert sandbox.bash(". /etc/os-release; echo $ID $VERSION_CODENAME") == "debian bookworm"
    for path in ("/x", "/usr/x", "/etc/x", "/opt/workbench/toolbox/x", "/dev/x"):
        assert "Read-only file system" in sandbox.bash(f"touch {path} 2>&1; true"), path
    assert sandbox.bash("touch /workspace/x /tmp/x ~/x /dev/shm/x && echo written") == "written"


# -- /proc


def test_no_process_inside_shows_a_host_path_or_the_host_s_environment(sandbox: Sandbox) -> None:
    sandbox.bash("sleep 300 >/dev/null 2>&1 &")
    cmdlines = sandbox.bash(r"for f in /proc/[0-9]*/cmdline; do echo \"$f: $(tr '\0' ' ' < $f)\"; done")
    assert "/proc/1/cmdline: bwrap" in cmdlines and "sleep 300" in cmdlines
    assert isinstance(sandbox.provider, LocalProvider)
    for host_path in ("/work/", str(ROOT), str(sandbox.provider.root), str(sandbox.provider.rootfs), "/tmp/"):
        assert host_path not in cmdlines
    environ = sandbox.bash(r"tr '\0' '\n' < /proc/1/environ").splitlines()
    assert [line.split("=")[0] for line in environ] == ["PATH"]
    # bwrap's own output goes to its keeper, not to a host file the sandbox could write through /proc/1/fd.
    assert "pipe:" in sandbox.bash("readlink /proc/1/fd/1 /proc/1/fd/2")


# -- the disk quota


@pytest.mark.parametrize("folder", ["/workspace", "/tmp", "/home/sandbox"])
def test_writing_past_the_disk_quota_fails_with_enospc_and_the_host_disk_stays_bounded(
    new_sandbox: Callable[..., Sandbox], folder: str
) -> None:
    sandbox = new_sandbox(disk_mb=64)
    # While the disk is full the toolbox cannot store a command's output either (it lives on the same
    # disk): the results go to /dev/shm, read once space is freed.
    sandbox.bash(
        f"head -c 100M /dev/zero > {folder}/big 2>/dev/shm/error; echo $? > /dev/shm/code; "
        f"du -m {folder}/big | cut -f1 > /dev/shm/size; "
        "head -c 1M /dev/zero > /workspace/more 2>/dev/shm/shared; true"
    )
    # The host holds what was written, within the quota: the image is sparse and as large as the quota.
    image = directory(sandbox) / "disk.img"
    assert image.stat().st_size == 64 * MIB
    assert image.stat().st_blocks * 512 <= 64 * MIB
    written = subprocess.run(["du", "-smx", str(directory(sandbox))], capture_output=True, text=True)
    assert int(written.stdout.split()[0]) <= 66
    said = sandbox.bash(f"rm {folder}/big; cat /dev/shm/error /dev/shm/code /dev/shm/size /dev/shm/shared")
    error, code, size, shared = said.splitlines()
    assert (error, code) == ("head: error writing 'standard output': No space left on device", "1")
    assert 40 <= int(size) <= 64
    assert shared == "head: error writing 'standard output': No space left on device"  # one quota for all
    assert sandbox.bash("head -c 30M /dev/zero > /tmp/again && echo fits") == "fits"  # freed is free again


def test_terminate_unmounts_and_removes_the_disk(new_sandbox: Callable[..., Sandbox]) -> None:
    sandbox = new_sandbox(disk_mb=64)
    disk = directory(sandbox) / "disk"
    assert os.path.ismount(disk)
    sandbox.provider.terminate(sandbox.handle)
    assert not os.path.ismount(disk)
    assert not directory(sandbox).exists()


def test_a_disk_quota_without_root_is_refused_with_what_to_do(
    provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match="needs root.*SANDBOX_DISK_QUOTA=off"):
        provider.provision(Resources(disk_mb=64))


# -- the toolbox's channel

FAKE_DAEMON = r"""
import json, os, socket
path = "/tmp/.toolbox/daemon.sock"
os.makedirs("/tmp/.toolbox", exist_ok=True)
if os.path.lexists(path):
    os.unlink(path)
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
listener.listen(8)
open("/tmp/fake.ready", "w").close()
while True:
    conn, _ = listener.accept()
    request = conn.recv(1 << 20)
    with open("/tmp/fake.log", "ab") as log:
        log.write(request + b"\n")
    conn.sendall(json.dumps({"ok": True, "output": "(everything is fine)"}).encode())
    conn.close()
"""


def test_a_fake_daemon_in_the_sandbox_does_not_get_the_calls(sandbox: Sandbox) -> None:
    """Issue 13 item 6: the model replaces the toolbox's socket with its own; the platform's calls must
    still reach the real daemon, and the fake must see none of them."""
    sandbox.call("write", file_path="/tmp/fake.py", content=FAKE_DAEMON)
    sandbox.bash(
        "nohup python3 /tmp/fake.py >/dev/null 2>&1 & while [ ! -e /tmp/fake.ready ]; do sleep 0.05; done"
    )
    assert sandbox.bash("echo real; echo AWS_SECRET=x > creds.env") == "real"
    assert sandbox.call("read", file_path="creds.env").rstrip().endswith("AWS_SECRET=x")
    assert sandbox.bash("cat /tmp/fake.log 2>/dev/null | wc -c") == "0"
    # Nothing of the host's channel is in the sandbox's reach.
    sockets = sandbox.bash(
        "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null; true"
    )
    assert sockets == "/tmp/.toolbox/daemon.sock"  # the fake's


def test_a_listener_that_is_not_the_sandbox_s_daemon_is_refused(sandbox: Sandbox) -> None:
    assert sandbox.bash("echo before") == "before"
    path = directory(sandbox) / "control" / "daemon.sock"
    path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fake:
        fake.bind(str(path))
        fake.listen(1)
        with pytest.raises(
            SandboxError, match="refusing the sandbox's toolbox socket.*not the sandbox's keeper"
        ):
            sandbox.bash("echo secret-input")
        fake.settimeout(1.0)
        connection, _ = fake.accept()
        with connection:
            connection.settimeout(1.0)
            assert connection.recv(1024) == b""  # closed without a byte of the request


def test_reset_gives_a_new_shell_over_the_checked_channel_and_keeps_files_and_jobs(sandbox: Sandbox) -> None:
    sandbox.bash("cd /tmp && export LEFT=by-the-last-holder && echo kept > /workspace/file")
    sandbox.bash("nohup sleep 300 >/dev/null 2>&1 &")
    sandbox.provider.reset(sandbox.handle)
    said = sandbox.bash("pwd; echo ${LEFT:-unset}; cat /workspace/file; pgrep -c -x sleep")
    assert said.startswith("/workspace\nunset\nkept\n1\n"), said
    assert "changed hands" in said
    path = directory(sandbox) / "control" / "daemon.sock"
    path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fake:
        fake.bind(str(path))
        fake.listen(1)
        with pytest.raises(SandboxError, match="refusing the sandbox's toolbox socket"):
            sandbox.provider.reset(sandbox.handle)


def test_the_control_folder_is_the_server_s_alone(sandbox: Sandbox) -> None:
    control = directory(sandbox) / "control"
    assert control.stat().st_uid == os.geteuid()
    assert control.stat().st_mode & 0o777 == 0o700


# -- the end of the server

PROVISION_AND_DIE = r"""
import json, os, signal, sys
from pathlib import Path
from sandboxes.providers.base import Resources
from sandboxes.providers.local import LocalProvider

provider = LocalProvider(root=sys.argv[1])
handle = provider.provision(Resources(disk_mb=64 if os.geteuid() == 0 else None))
provider.execute(handle, "bash", {"command": "nohup sleep 600 >/dev/null 2>&1 &"})
init = json.loads((provider.root / handle / "sandbox.json").read_text())["pid"]


def tree(pid):
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid] + [p for child in children for p in tree(int(child))]


def started(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


print(json.dumps({"handle": handle, "pids": {pid: started(pid) for pid in tree(init)}}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as a worker killed with -9: no handler, no cleanup
"""


def test_a_sandbox_ends_when_no_process_of_the_server_holds_its_root() -> None:
    """The provisioning process is SIGKILLed and no other process uses the root: every process of
    its sandbox ends, and its disk is unmounted (while another process holds the root, the sandbox
    outlives the worker: test_local_provider's test_a_sandbox_outlives_the_process_that_provisioned_it)."""
    root = Path(tempfile.mkdtemp(prefix="workbench-test-shutdown-"))
    root.chmod(0o711)
    pids: dict[int, str | None] = {}
    try:
        made = subprocess.run(
            [sys.executable, "-c", PROVISION_AND_DIE, str(root)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert made.returncode == -signal.SIGKILL, made.stderr
        started = json.loads(made.stdout)
        pids = {int(pid): start for pid, start in started["pids"].items()}
        assert len(pids) >= 4  # bwrap's init, the daemon, its shell, the sleep
        deadline = time.monotonic() + 10
        left = pids
        while left and time.monotonic() < deadline:
            left = {pid: start for pid, start in left.items() if _start_time(pid) == start}
            time.sleep(0.05)
        assert left == {}, f"processes of the sandbox still run: {sorted(left)}"
        disk = root / started["handle"] / "disk"
        while os.path.ismount(disk) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.ismount(disk)
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        leftover = LocalProvider(root=root)
        for handle in leftover.list_handles():
            leftover.terminate(handle)
        subprocess.run(["rm", "-rf", str(root)], check=False)


def _held(lock: Path) -> bool:
    """Whether some process holds a lock on the file (a shared one keeps an exclusive one out)."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_celery_worker_holds_the_local_root_from_its_start_until_it_dies(tmp_path: Path) -> None:
    """Its pool's children come and go (a hard time limit replaces one): the main process holds the root."""
    root = tmp_path / "sandboxes"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workbench", "worker", "--pool", "prefork", "--concurrency", "1",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"],
        cwd=ROOT, env=child_env(WORKBENCH_LOCAL_SANDBOXES=str(root)), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        lock = root / ".alive"
        deadline = time.monotonic() + 60
        while not (lock.exists() and _held(lock)):
            assert worker.poll() is None and time.monotonic() < deadline, "the worker never held the root"
            time.sleep(0.1)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + 10
        while _held(lock) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _held(lock)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
