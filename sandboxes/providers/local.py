"""LocalProvider: a sandbox is a directory plus a bubblewrap (`bwrap`) namespace, for machines
without Docker.

A sandbox `<root>/<handle>/` holds `disk/` with `workspace/` (bound at /workspace), `tmp/` (/tmp)
and `home/` (/home/sandbox) — with a disk quota, `disk/` is a loop-mounted ext4 image `disk.img` of
that size —, `etc/` (its passwd, group and hosts), `control/` (the toolbox daemon's socket, mode 0700,
never bound into the sandbox), `sandbox.json` (labels, resources, the outside pid of the sandbox's
init and its start time, its keeper's pid and uid, its cgroups) and `bwrap.log`. Its root file
system is the Debian tree the docker image is built from, unpacked by scripts/build-image.sh under
`$WORKBENCH_LOCAL_ROOTFS` (default `<repo>/.cache/rootfs`), one folder per image name
(`resources.image`, with `_` for `/` and `:`), bound read-only as /.

The toolbox daemon is the sandbox's main process, detached from whoever provisioned it: the sandbox
outlives the worker that made it, and any process on the machine can call it through its handle.
The provider binds the daemon's socket in `control/`, the sandbox's keeper listens on it and bwrap
hands it to the daemon (`--listen-fd`); a call connects to it directly (no exec per call) and first
checks, by SO_PEERCRED, that the listener is that keeper (its pid and uid, recorded at provisioning).

Each sandbox's bwrap runs under a keeper (`keeper.py`) with --die-with-parent. Every process that
uses the provider's root holds a shared lock on `<root>/.alive` (a Celery worker's main process from
its start), and the keeper ends the sandbox, and unmounts its disk, once none does: sandboxes stop
with the server however it stops (SIGKILL too: the kernel drops the locks of a dead process), and
outlive a worker that dies while another process of the server still holds the root. (A shutdown
hook or `make run`'s trap would miss a SIGKILL; --die-with-parent under the worker would kill the
sandboxes of every session with one worker's death.) The reaper removes what is left of them.

What holds, compared with the docker provider:
- namespaces: user (uid 1000 inside; outside, the caller's uid, or `nobody` when the caller is
  root; no nested user namespace), pid, mount, ipc, uts, cgroup, and network (only loopback) unless
  `resources.network`;
- no capabilities, no_new_privs, a new session, and a seccomp filter (`seccomp.py`: mounts,
  namespaces, ptrace, modules, kexec, bpf, perf, io_uring, keyrings, the clock, TIOCSTI...);
- a read-only root from the image's file system, no host file but the toolbox (read-only at
  /opt/workbench/toolbox); a read-only /dev with a 64 MiB /dev/shm; private /workspace, /tmp, home;
- no host path in any /proc/*/cmdline inside (bwrap reads its arguments from a file descriptor) and
  no host environment in its init's;
- pids, memory and cpu limits from a cgroup per sandbox when the caller can create one (root, with
  cgroup v1 or v2); otherwise pids by RLIMIT_NPROC (set inside the sandbox's user namespace, so it
  counts this sandbox only) and memory by RLIMIT_AS;
- `resources.disk_mb` bounds /workspace, /tmp and home together (one ext4 image; root only: without
  root a disk quota is refused, and `disk_mb=None` leaves disk use unbounded).
What does not hold:
- without a cgroup, RLIMIT_AS bounds each process's address space, not the sandbox's total, and
  breaks programs that reserve large address ranges (JVMs, some JITs); there is no cpu limit, and
  /dev/shm's memory is not counted;
- `resources.network` shares the host's network namespace, its loopback services included (docker
  gives the sandbox its own bridge);
- /proc/self/mountinfo names the host folders its mounts come from (as docker's names its layers);
- the toolbox daemon is the sandbox's main process: if it is killed, the sandbox is gone (docker
  restarts the daemon and keeps the container); no pause or snapshot.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sandboxes.toolbox.bundle import DAEMON_COMMAND, SANDBOX_DIR, SANDBOX_PARENT, SANDBOX_UID, SOURCE_DIR
from sandboxes.toolbox.client import DAEMON_START_TIMEOUT_S
from sandboxes.toolbox.disk import DISK_MB_ENV
from sandboxes.toolbox.procs import PIDS_LIMIT_ENV

from . import cgroups, protocol, seccomp
from .base import Cancelled, Resources, SandboxError, SandboxGone, ToolFailed

HANDLE = re.compile(r"local-[0-9a-f]{12}")
NOBODY = 65534
DEFAULT_ROOTFS = Path(__file__).resolve().parents[2] / ".cache" / "rootfs"
KEEPER = Path(__file__).with_name("keeper.py")
ALIVE = ".alive"
CONTROL_SOCKET = ("control", "daemon.sock")
GONE_SETTLE_S = 2.0
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHM_BYTES = 64 * 1024 * 1024
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
# An ext4 made for one sandbox and thrown away with it: no journal, no blocks kept back for root (the
# sandbox's user gets the whole quota), inode tables left to be written as used (the image stays sparse).
MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard"]
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"


class LocalProvider:
    name = "local"
    capabilities: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        root: str | os.PathLike[str] | None = None,
        run_as: tuple[int, int] | None = None,
        rootfs: str | os.PathLike[str] | None = None,
    ):
        self.root = Path(root) if root else default_root()
        self.rootfs = Path(rootfs or os.environ.get("WORKBENCH_LOCAL_ROOTFS") or DEFAULT_ROOTFS)
        # Root's files are not the sandbox's business: as root, run sandboxes as nobody.
        self.run_as = run_as if run_as is not None or os.geteuid() != 0 else (NOBODY, NOBODY)
        hold_root(self.root)

    # -- lifecycle

    def provision(self, resources: Resources) -> str:
        if not shutil.which("bwrap"):
            raise SandboxError("bubblewrap is not installed: apt-get install -y bubblewrap")
        if resources.disk_mb and os.geteuid() != 0:
            raise SandboxError(
                "the local provider bounds a sandbox's disk with a loop-mounted image, which needs root: "
                "run the workers as root, or set SANDBOX_DISK_QUOTA=off to run sandboxes without a disk quota"
            )
        rootfs = self.rootfs_of(resources.image)
        handle = f"local-{uuid.uuid4().hex[:12]}"
        directory = self._directory(handle)
        fds: list[int] = []
        process = None
        groups: list[str] = []
        try:
            self._make_directory(directory, disk_mb=resources.disk_mb)
            groups = cgroups.create(
                handle, pids=resources.pids, memory_mb=resources.memory_mb, cpus=resources.cpus
            )
            listen_fd = _control_socket(directory).detach()
            fds.append(listen_fd)
            seccomp_fd = seccomp.memfd()
            fds.append(seccomp_fd)
            info_read, info_write = os.pipe()  # bwrap's --info-fd: it writes the sandbox's pid there
            fds += [info_read, info_write]
            options = self._options(rootfs, directory, resources, seccomp_fd=seccomp_fd, info_fd=info_write)
            args_fd = _memfd("workbench-bwrap-args", b"".join(option.encode() + b"\0" for option in options))
            fds.append(args_fd)
            command = self._command(resources, args_fd=args_fd, listen_fd=listen_fd, cgroup=bool(groups))
            passed = [listen_fd, seccomp_fd, info_write, args_fd]
            process = _spawn_keeper(
                self.root, directory, command, groups=groups, pass_fds=passed, listen_fd=listen_fd
            )
            for fd in passed:  # only the keeper holds them now: EOF on info_read means bwrap is gone
                os.close(fd)
                fds.remove(fd)
            pid = _child_pid(process, info_read)
            meta = {
                "labels": dict(resources.labels),
                "resources": asdict(resources),
                "pid": pid,
                "started": _start_time(pid),
                "keeper": {"pid": process.pid, "uid": os.geteuid()},
                "cgroups": groups,
                "created": time.time(),
            }
            (directory / "sandbox.json").write_text(json.dumps(meta))
            # A cancel of a call that never was: answered once the daemon serves, and it changes nothing.
            probe = json.dumps({"cancel": f"provisioned-{handle}"}).encode()
            self._call(handle, protocol.Request(handle, probe, DAEMON_START_TIMEOUT_S), None)
        except BaseException as error:
            if process is not None and process.poll() is None:
                process.kill()  # and with it bwrap (--die-with-parent)
            said = _tail(directory / "bwrap.log")
            self.terminate(handle)
            cgroups.remove(groups)
            if isinstance(error, SandboxError | ToolFailed | OSError | seccomp.UnsupportedArch):
                raise SandboxError(f"the local sandbox did not start: {error}. {said}".strip()) from None
            raise
        finally:
            for fd in fds:
                os.close(fd)
        return handle

    def is_alive(self, handle: str) -> bool:
        meta = self._meta(handle)
        return meta is not None and _alive(meta)

    def terminate(self, handle: str) -> None:
        """Kill the sandbox's init (the kernel then kills everything in its pid namespace), unmount
        its disk and delete its directory; nothing happens if it is already gone."""
        directory = self._directory(handle)
        meta = self._meta(handle)
        if meta is not None:
            if _alive(meta):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(meta["pid"], signal.SIGKILL)
                deadline = time.monotonic() + 3.0
                while _alive(meta) and time.monotonic() < deadline:
                    time.sleep(0.01)
            cgroups.remove(meta.get("cgroups") or [])
        _unmount(directory / "disk")
        shutil.rmtree(directory, ignore_errors=True)
        _reap_keepers()

    def list_handles(self) -> dict[str, dict[str, str]]:
        if not self.root.is_dir():
            return {}
        handles = {}
        for entry in self.root.iterdir():
            if HANDLE.fullmatch(entry.name):
                meta = self._meta(entry.name)
                handles[entry.name] = meta["labels"] if meta else {}
        return handles

    # -- calls

    def execute(
        self,
        handle: str,
        name: str,
        input: dict[str, Any],
        *,
        timeout_s: float | None = None,
        cancelled: Cancelled | None = None,
    ) -> str:
        return self._call(handle, protocol.build_request(name, input, timeout_s=timeout_s), cancelled)

    def reset(self, handle: str, *, env: dict[str, str] | None = None, unused: bool = False) -> None:
        """For a sandbox that changed hands: the connection's peer check proves the channel is the one
        made at provisioning, and the daemon stops the old holder's calls and starts a new shell (with the
        new session's variables, `env`)."""
        self._call(handle, protocol.reset_request(env, unused=unused), None)

    def _call(self, handle: str, request: protocol.Request, cancelled: Cancelled | None) -> str:
        meta = self._meta(handle)
        if meta is None:
            raise SandboxGone(self._gone_reason(handle))
        reply = bytearray()

        def feed(chunk: bytes) -> None:
            reply.extend(chunk)
            if len(reply) > protocol.MAX_REPLY_BYTES:
                raise SandboxError("the sandbox's toolbox sent a reply larger than any it should")

        finished, stopped = protocol.exchange(
            self._connect(handle, meta),
            request,
            cancelled=cancelled,
            cancel=lambda: self._cancel(handle, meta, request),
            feed=feed,
        )
        if finished and reply:
            return protocol.parse_reply(bytes(reply))
        if stopped:
            raise protocol.interrupted(stopped, request)
        # The daemon dies first when the sandbox is killed; its init follows within moments.
        settle = time.monotonic() + GONE_SETTLE_S
        while time.monotonic() < settle:
            if not _alive(meta):
                raise SandboxGone(self._gone_reason(handle))
            time.sleep(0.02)
        raise ToolFailed("the sandbox's toolbox ended during the call without a reply")

    def _cancel(self, handle: str, meta: dict[str, Any], request: protocol.Request) -> None:
        try:
            sock = self._connect(handle, meta, timeout_s=1.0)
        except SandboxError:
            return
        with sock, contextlib.suppress(OSError):
            sock.sendall(request.cancel_payload)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(1.0)
            while sock.recv(65536):
                pass

    def _connect(
        self, handle: str, meta: dict[str, Any], *, timeout_s: float = DAEMON_START_TIMEOUT_S
    ) -> socket.socket:
        """A connection to the sandbox's daemon, waiting for it to listen (it may be starting)."""
        deadline = time.monotonic() + timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                _connect_without_symlinks(sock, self._directory(handle), CONTROL_SOCKET)
                _check_peer(sock, meta)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
            except SandboxError:
                sock.close()
                raise
            except OSError as error:
                sock.close()
                raise SandboxError(f"cannot reach the sandbox's toolbox: {error}") from None
            if not _alive(meta):
                raise SandboxGone(self._gone_reason(handle))
            if time.monotonic() > deadline:
                raise SandboxError(f"the sandbox's toolbox did not answer within {timeout_s:g} s")
            time.sleep(0.005)

    def copy_in(self, handle: str, archive: bytes) -> None:
        """Unpack a tar (paths relative to /workspace) into the workspace, owned by the sandbox's user."""
        workspace = self._directory(handle) / "disk" / "workspace"
        if not workspace.is_dir():
            raise SandboxGone(self._gone_reason(handle))
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(workspace, filter="data")
            names = tar.getnames()
        if self.run_as:
            for name in names:
                os.chown(workspace / name, *self.run_as, follow_symlinks=False)

    # -- the sandbox's directory

    def _directory(self, handle: str) -> Path:
        if not HANDLE.fullmatch(handle):
            raise SandboxGone(f"{handle!r} is not a local sandbox handle")
        return self.root / handle

    def rootfs_of(self, image: str) -> Path:
        """The unpacked file system of `image`: a folder only root or this process's user may change."""
        path = self.rootfs / re.sub(r"[^A-Za-z0-9._-]", "_", image)
        try:
            info = path.stat()
        except FileNotFoundError:
            raise SandboxError(
                f"there is no root file system for the image {image!r} at {path}: `SANDBOX_IMAGE={image} "
                "scripts/build-image.sh` unpacks it (from the Docker engine's image of that name, or the one "
                "it builds)"
            ) from None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
            raise SandboxError(
                f"the root file system {path} must be a folder owned by root (or uid {os.geteuid()}) that no one "
                "else may write: unpack it again with scripts/build-image.sh --force"
            )
        return path

    def _meta(self, handle: str) -> dict[str, Any] | None:
        try:
            meta: dict[str, Any] = json.loads((self._directory(handle) / "sandbox.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return meta

    def _gone_reason(self, handle: str) -> str:
        if not self._directory(handle).exists():
            return "the local sandbox no longer exists (its directory was removed)"
        return "the local sandbox's processes are gone (killed, or its toolbox exited)"

    def _make_directory(self, directory: Path, *, disk_mb: int | None) -> None:
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        directory.mkdir(mode=0o711)
        (directory / "control").mkdir(mode=0o700)
        (directory / "etc").mkdir(mode=0o755)
        (directory / "etc" / "passwd").write_text(
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/home/sandbox:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (directory / "etc" / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        (directory / "etc" / "hosts").write_text(HOSTS)
        disk = directory / "disk"
        disk.mkdir(mode=0o755)
        if disk_mb:
            _mount_disk(directory / "disk.img", disk, size_mb=disk_mb)
        for name in ("workspace", "tmp", "home"):
            (disk / name).mkdir(mode=0o755)
        if self.run_as:
            for name in ("workspace", "tmp", "home"):
                os.chown(disk / name, *self.run_as)
            (disk / "tmp").chmod(0o1777)

    def _options(
        self, rootfs: Path, directory: Path, resources: Resources, *, seccomp_fd: int, info_fd: int
    ) -> list[str]:
        """bwrap's options, which it reads from a file descriptor: none shows in /proc/*/cmdline."""
        options = ["--unshare-all", "--unshare-user", "--disable-userns"]
        options += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        if resources.network:
            options.append("--share-net")
        options += ["--new-session", "--die-with-parent", "--cap-drop", "ALL", "--hostname", "sandbox"]
        options += ["--ro-bind", str(rootfs), "/"]
        for name in ("passwd", "group", "hosts"):
            options += ["--ro-bind", str(directory / "etc" / name), f"/etc/{name}"]
        if resources.network and Path("/etc/resolv.conf").exists():
            options += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        options += ["--proc", "/proc", "--dev", "/dev"]
        options += ["--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]
        options += ["--remount-ro", "/dev"]  # after /dev/shm: bwrap's /dev is writable otherwise
        disk = directory / "disk"
        options += ["--bind", str(disk / "workspace"), "/workspace"]
        options += ["--bind", str(disk / "tmp"), "/tmp"]
        options += ["--bind", str(disk / "home"), "/home/sandbox"]
        options += ["--ro-bind", str(SOURCE_DIR), SANDBOX_DIR, "--chdir", SANDBOX_PARENT, "--clearenv"]
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": "/home/sandbox",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "LANG": "C.UTF-8",
            "HOSTNAME": "sandbox",
            **resources.env,
            PIDS_LIMIT_ENV: str(resources.pids),
            DISK_MB_ENV: str(resources.disk_mb or ""),
        }
        for name, value in env.items():
            options += ["--setenv", name, value]
        options += ["--seccomp", str(seccomp_fd), "--info-fd", str(info_fd)]
        return options

    def _command(self, resources: Resources, *, args_fd: int, listen_fd: int, cgroup: bool) -> list[str]:
        """What the keeper runs; bwrap's init keeps it as its /proc/1/cmdline: no host path in it."""
        command = ["bwrap", "--args", str(args_fd), "--", *DAEMON_COMMAND, "--listen-fd", str(listen_fd)]
        if not cgroup:
            command += ["--max-processes", str(resources.pids), "--max-memory-mb", str(resources.memory_mb)]
        if self.run_as:
            uid, gid = self.run_as
            command = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *command]
        return command


# -- the server's hold on a root

_held: dict[Path, int] = {}


def default_root() -> Path:
    return Path(
        os.environ.get("WORKBENCH_LOCAL_SANDBOXES") or Path(tempfile.gettempdir()) / "workbench-sandboxes"
    )


def hold_root(root: Path) -> None:
    """Hold a shared lock on the root's liveness file for as long as this process lives.

    Each sandbox's keeper ends it once no process holds one (keeper.py): the sandboxes of a root live
    while any process of the server that uses it does. The descriptor is inherited by fork (a Celery
    pool's children share the parent's hold) and closed on exec.
    """
    root = root.absolute()
    if root in _held:
        return
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    fd = os.open(root / ALIVE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    _held[root] = fd


# -- the toolbox's channel


def _control_socket(directory: Path) -> socket.socket:
    """The daemon's socket, bound in a folder the sandbox never sees (the keeper listens on it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        fd = os.open(directory / CONTROL_SOCKET[0], os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            # Through /proc/self/fd: a socket path may be at most ~108 bytes, a root's path longer.
            sock.bind(f"/proc/self/fd/{fd}/{CONTROL_SOCKET[1]}")
        finally:
            os.close(fd)
    except BaseException:
        sock.close()
        raise
    return sock


def _check_peer(sock: socket.socket, meta: dict[str, Any]) -> None:
    """Refuse a socket that the sandbox's keeper did not listen on (SO_PEERCRED names the process
    that called listen): whoever put another one in its place, the call's input does not go to it."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    keeper = meta["keeper"]
    if (pid, uid) != (keeper["pid"], keeper["uid"]):
        raise SandboxError(
            f"refusing the sandbox's toolbox socket: pid {pid} (uid {uid}) listens on it, not the sandbox's "
            f"keeper (pid {keeper['pid']}); terminate the sandbox and provision a new one"
        )


class _NotASocket(OSError):
    pass


def _connect_without_symlinks(sock: socket.socket, directory: Path, parts: tuple[str, ...]) -> None:
    """Connect to the socket at directory/parts, following no symlink on the way.

    Each step is opened with O_NOFOLLOW and the connection goes to the inode found, through
    /proc/self/fd (which also lifts the ~108-byte limit on socket paths).
    """
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            flags = os.O_PATH | os.O_NOFOLLOW | (0 if part == parts[-1] else os.O_DIRECTORY)
            next_fd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise _NotASocket(f"{directory.joinpath(*parts)} is not a socket")
        sock.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


# -- the disk


def _mount_disk(image: Path, mountpoint: Path, *, size_mb: int) -> None:
    """A sparse ext4 image of `size_mb`, loop-mounted: the sandbox's writable folders live in it."""
    with open(image, "wb") as file:
        file.truncate(size_mb * 1024 * 1024)
    env = {"PATH": SANDBOX_PATH}
    for command in ([*MKFS, str(image)], ["mount", "-o", MOUNT_OPTIONS, str(image), str(mountpoint)]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SandboxError(
                f"cannot make the sandbox's {size_mb} MB disk ({command[0]}: {done.stderr.strip()}); set "
                "SANDBOX_DISK_QUOTA=off to run sandboxes without a disk quota"
            )


def _unmount(mountpoint: Path) -> None:
    if os.path.ismount(mountpoint):
        subprocess.run(
            ["umount", "--lazy", str(mountpoint)],
            env={"PATH": SANDBOX_PATH},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


# -- starting bwrap

# Keepers this process started: polled now and then so that none stays a zombie here.
_keepers: list[subprocess.Popen[bytes]] = []


def _reap_keepers() -> None:
    _keepers[:] = [process for process in _keepers if process.poll() is None]


def _spawn_keeper(
    root: Path, directory: Path, command: list[str], *, groups: list[str], pass_fds: list[int], listen_fd: int
) -> subprocess.Popen[bytes]:
    """Start the sandbox's keeper (which starts bwrap) in its own session, so that the sandbox does
    not depend on this process; `-I -S`: a bare interpreter, which starts fastest."""
    _reap_keepers()
    keeper = [sys.executable, "-I", "-S", str(KEEPER), "--lock", str(root.absolute() / ALIVE)]
    keeper += ["--log", str(directory / "bwrap.log"), "--listen-fd", str(listen_fd)]
    for fd in pass_fds:
        keeper += ["--fd", str(fd)]
    for group in groups:
        keeper += ["--cgroup", group]
    if os.path.ismount(directory / "disk"):
        keeper += ["--unmount", str(directory / "disk"), "--remove", str(directory / "disk.img")]
    process = subprocess.Popen(
        [*keeper, "--", *command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=pass_fds,
        start_new_session=True,
        env={"PATH": SANDBOX_PATH},
        cwd="/",
    )
    _keepers.append(process)
    return process


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _child_pid(process: subprocess.Popen[bytes], info: int) -> int:
    """The outside pid of the sandbox's init, which bwrap writes as JSON to its info fd."""
    data = b""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([info], [], [], 0.1)
        if ready:
            chunk = os.read(info, 4096)
            data += chunk
            try:
                return int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                if not chunk:
                    break
        elif process.poll() is not None:
            break
    raise SandboxError(f"bwrap exited (its keeper with code {process.poll()}) before the sandbox started")


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else int(fields[19])


def _alive(meta: dict[str, Any]) -> bool:
    """Whether the sandbox's init still runs (the same process: its start time guards against pid reuse)."""
    started = _start_time(meta["pid"])
    return started is not None and started == meta["started"]


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return f"bwrap said: {text[-500:]}" if text else ""
