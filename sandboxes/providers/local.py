"""LocalProvider: a sandbox is a directory plus a bubblewrap (`bwrap`) namespace, for machines
without Docker.

A sandbox `<root>/<handle>/` holds `workspace/` (bound at /workspace), `tmp/` (/tmp), `home/`
(/home/sandbox), `etc/` (its passwd and group), `sandbox.json` (labels, resources, the outside pid of
the sandbox's init and its start time, its cgroups) and `bwrap.log`. The toolbox daemon is the
sandbox's main process, detached from whoever provisioned it: the sandbox outlives the worker that
made it, and any process on the machine can call it through its handle. Calls go straight to the
daemon's socket, which the host sees at `tmp/.toolbox/daemon.sock`: no exec per call.

What holds, compared with the docker provider:
- namespaces: user (uid 1000 inside; outside, the caller's uid, or `nobody` when the caller is
  root), pid, mount, ipc, uts, cgroup, and network (only loopback) unless `resources.network`;
- no capabilities, no_new_privs, a new session (no TIOCSTI to the caller's terminal);
- a read-only /usr (and /bin, /lib...), an allowlist of /etc (no /etc/shadow or host secrets), and
  private /workspace, /tmp and home;
- pids, memory and cpu limits from a cgroup per sandbox when the caller can create one (root, with
  cgroup v1 or v2); otherwise pids by RLIMIT_NPROC (set inside the sandbox's user namespace, so it
  counts this sandbox only) and memory by RLIMIT_AS.
What does not hold:
- without a cgroup, RLIMIT_AS bounds each process's address space, not the sandbox's total, and
  breaks programs that reserve large address ranges (JVMs, some JITs); there is no cpu limit;
- no seccomp filter (docker applies its default profile);
- `resources.network` shares the host's network namespace, its loopback services included (docker
  gives the sandbox its own bridge);
- the sandbox sees the host's /usr: `resources.image` is not used;
- the toolbox daemon is the sandbox's main process: if it is killed, the sandbox is gone (docker
  restarts the daemon and keeps the container);
- disk use is not bounded (docker's is not either without a storage quota); no pause or snapshot.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sandboxes.toolbox.bundle import DAEMON_COMMAND, SANDBOX_DIR, SANDBOX_PARENT, SANDBOX_UID, SOURCE_DIR
from sandboxes.toolbox.client import DAEMON_START_TIMEOUT_S
from sandboxes.toolbox.procs import PIDS_LIMIT_ENV

from . import cgroups, protocol
from .base import Cancelled, Resources, SandboxError, SandboxGone, ToolFailed

HANDLE = re.compile(r"local-[0-9a-f]{12}")
NOBODY = 65534
# What programs need from /etc; the rest of the host's /etc stays out of the sandbox.
ETC_ALLOWLIST = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "gitconfig",
    "host.conf",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "protocols",
    "services",
    "ssl",
    "timezone",
)
GONE_SETTLE_S = 2.0
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LocalProvider:
    name = "local"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, *, root: str | os.PathLike[str] | None = None, run_as: tuple[int, int] | None = None):
        default = Path(tempfile.gettempdir()) / "workbench-sandboxes"
        self.root = Path(root or os.environ.get("WORKBENCH_LOCAL_SANDBOXES") or default)
        # Root's files are not the sandbox's business: as root, run sandboxes as nobody.
        self.run_as = run_as if run_as is not None or os.geteuid() != 0 else (NOBODY, NOBODY)

    # -- lifecycle

    def provision(self, resources: Resources) -> str:
        bwrap = shutil.which("bwrap")
        if not bwrap:
            raise SandboxError("bubblewrap is not installed: apt-get install -y bubblewrap")
        handle = f"local-{uuid.uuid4().hex[:12]}"
        directory = self._directory(handle)
        self._make_directory(directory)
        groups = cgroups.create(
            handle, pids=resources.pids, memory_mb=resources.memory_mb, cpus=resources.cpus
        )
        info_read, info_write = os.pipe()  # bwrap's --info-fd: it writes the sandbox's pid there
        command = self._command(bwrap, directory, resources, info_fd=info_write, cgroup=bool(groups))
        process = None
        try:
            process = _spawn(command, log=directory / "bwrap.log", groups=groups, pass_fd=info_write)
            os.close(info_write)  # only bwrap holds it now: EOF on info_read means bwrap is gone
            info_write = -1
            pid = _child_pid(process, info_read)
            meta = {
                "labels": dict(resources.labels),
                "resources": asdict(resources),
                "pid": pid,
                "started": _start_time(pid),
                "cgroups": groups,
                "created": time.time(),
            }
            (directory / "sandbox.json").write_text(json.dumps(meta))
            self._connect(handle, meta).close()
        except BaseException as error:
            if process is not None and process.poll() is None:
                process.kill()
            said = _tail(directory / "bwrap.log")
            self.terminate(handle)
            cgroups.remove(groups)
            if isinstance(error, SandboxError | OSError):
                raise SandboxError(f"the local sandbox did not start: {error}. {said}".strip()) from None
            raise
        finally:
            os.close(info_read)
            if info_write >= 0:
                os.close(info_write)
        return handle

    def is_alive(self, handle: str) -> bool:
        meta = self._meta(handle)
        return meta is not None and _alive(meta)

    def terminate(self, handle: str) -> None:
        """Kill the sandbox's init (the kernel then kills everything in its pid namespace) and
        delete its directory; nothing happens if it is already gone."""
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
        shutil.rmtree(directory, ignore_errors=True)

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
        request = protocol.build_request(name, input, timeout_s=timeout_s)
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
                _connect_without_symlinks(sock, self._directory(handle), ("tmp", ".toolbox", "daemon.sock"))
                return sock
            except _NotASocket as error:
                sock.close()
                raise SandboxError(f"cannot reach the sandbox's toolbox: {error}") from None
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
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
        workspace = self._directory(handle) / "workspace"
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

    def _make_directory(self, directory: Path) -> None:
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        directory.mkdir(mode=0o711)
        for name in ("workspace", "tmp", "home", "etc"):
            (directory / name).mkdir(mode=0o755)
        (directory / "etc" / "passwd").write_text(
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/home/sandbox:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (directory / "etc" / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        if self.run_as:
            for name in ("workspace", "tmp", "home"):
                os.chown(directory / name, *self.run_as)
            (directory / "tmp").chmod(0o1777)

    def _command(
        self, bwrap: str, directory: Path, resources: Resources, *, info_fd: int, cgroup: bool
    ) -> list[str]:
        command = [
            bwrap,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
        ]
        if resources.network:
            command.append("--share-net")
        command += [
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = Path("/") / name
            if path.is_symlink():
                command += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                command += ["--ro-bind", str(path), str(path)]
        etc = [Path("/etc") / name for name in ETC_ALLOWLIST] + sorted(Path("/etc").glob("python3*"))
        if resources.network:
            etc.append(Path("/etc/resolv.conf"))
        for path in etc:
            if path.exists():
                command += ["--ro-bind", str(path), str(path)]
        for name in ("passwd", "group"):
            command += ["--ro-bind", str(directory / "etc" / name), f"/etc/{name}"]
        command += ["--proc", "/proc", "--dev", "/dev"]
        command += ["--bind", str(directory / "workspace"), "/workspace"]
        command += ["--bind", str(directory / "tmp"), "/tmp"]
        command += ["--bind", str(directory / "home"), "/home/sandbox"]
        command += ["--ro-bind", str(SOURCE_DIR), SANDBOX_DIR, "--chdir", SANDBOX_PARENT, "--clearenv"]
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": "/home/sandbox",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "LANG": "C.UTF-8",
            "HOSTNAME": "sandbox",
            **resources.env,
            PIDS_LIMIT_ENV: str(resources.pids),
        }
        for name, value in env.items():
            command += ["--setenv", name, value]
        command += ["--info-fd", str(info_fd), "--", *DAEMON_COMMAND]
        if not cgroup:
            command += ["--max-processes", str(resources.pids), "--max-memory-mb", str(resources.memory_mb)]
        if self.run_as:
            uid, gid = self.run_as
            command = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *command]
        return command


class _NotASocket(OSError):
    pass


def _connect_without_symlinks(sock: socket.socket, directory: Path, parts: tuple[str, ...]) -> None:
    """Connect to the socket at directory/parts, following no symlink on the way.

    The sandbox owns everything under its tmp/: a symlink planted there must not make the provider
    (often root) connect to some other socket of the host. Each step is opened with O_NOFOLLOW and
    the connection goes to the inode found, through /proc/self/fd (which also lifts the ~108-byte
    limit on socket paths).
    """
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            flags = os.O_PATH | os.O_NOFOLLOW | (0 if part == parts[-1] else os.O_DIRECTORY)
            next_fd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise _NotASocket(f"{directory.joinpath(*parts)} is not a socket (the sandbox replaced it)")
        sock.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


# bwrap processes this one started: polled now and then so that none stays a zombie here.
_spawned: list[subprocess.Popen[bytes]] = []


def _spawn(command: list[str], *, log: Path, groups: list[str], pass_fd: int) -> subprocess.Popen[bytes]:
    """Start bwrap in its own session, so that the sandbox does not depend on this process."""
    _spawned[:] = [process for process in _spawned if process.poll() is None]
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            pass_fds=(pass_fd,),
            start_new_session=True,
            preexec_fn=(lambda: cgroups.join(groups)) if groups else None,
            cwd="/",
        )
    _spawned.append(process)
    return process


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
    raise SandboxError(f"bwrap exited with code {process.poll()} before the sandbox started")


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
