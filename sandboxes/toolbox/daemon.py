"""The toolbox daemon: owns the sandbox's persistent shell and runs the tool calls sent to its socket.

One daemon per sandbox, serving a unix socket its launcher already listens on; it never binds one
itself, so no socket path the sandbox user can write is ever the channel. In docker the supervisor
(the container's first process, as root) forks it, and it drops to the sandbox user without exec (see
`supervisor.py`); the local provider starts it as the sandbox's main process with the host's listening
socket (`--listen-fd`). Either way it is not dumpable: the sandbox's other processes, of the same uid,
can neither trace it nor take its descriptors. A request is one JSON object, sent whole before the
sender shuts down its side of the connection; the reply is one JSON object, after which the daemon
closes the connection:

    {"id": "<call id>", "tool": "bash", "input": {...}, "timeout": 120}
    {"cancel": "<call id>"}
    {"reset": true}    the sandbox changed hands: stop every call and start a new shell (the files
                       and the processes already running stay); with "env", the new holder's
                       session variables; with "unused": true, no call ever ran in the sandbox, and
                       the next result does not say the shell is new
    -> {"ok": true, "output": "..."}
    -> {"ok": false, "error": "input" | "failed" | "sandbox", "message": "..."}

Run: cd /opt/workbench && python3 -E -s -m toolbox.daemon --listen-fd N [--max-processes N] [--max-memory-mb N]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import re
import resource
import socket
import sys
import threading
import traceback
from typing import Any

from . import disk
from .call import Call
from .client import RUNTIME_DIR
from .errors import Failed, InputError
from .files import WORKSPACE
from .procs import PIDS_LIMIT_ENV, PidsWatchdog, pids_limit
from .shell import RESET_NOTE, Shell
from .tools import Toolset

STARTED_PATH = RUNTIME_DIR + "/daemon.started"
LOG_PATH = RUNTIME_DIR + "/daemon.log"
# The session variables of the sandbox's current holder, as the last reset set them: a daemon forked again
# (it died) starts with them, not with the first holder's, which the container's environment still has.
SESSION_ENV_PATH = RUNTIME_DIR + "/session-env.json"
CALL_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
DEFAULT_TIMEOUT_S = 120.0
MAX_REQUEST_BYTES = 64 * 1024 * 1024
AT_LIMIT = "the sandbox is at its process limit: try again in a moment, or restart the shell (restart: true)"
# A stopped call needs up to shell.INTERRUPT_GRACE_S to end before its shell can be replaced.
RESET_TIMEOUT_S = 10.0
HANDED_OVER_NOTE = (
    "[a new shell was started, as this sandbox changed hands: its files and running processes were kept; "
    "the old shell's working directory, variables, functions and jobs are gone]"
)
PR_SET_DUMPABLE = 4
# The variables of the session holding the sandbox (its credentials' placeholders), by name: what a reset
# replaces.
SESSION_ENV = "WORKBENCH_SESSION_ENV"


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": kind, "message": message}


class Daemon:
    def __init__(self, toolset: Toolset):
        self.toolset = toolset
        self._calls: dict[str, Call] = {}
        # A cancel can overtake its call (two connections): remember recent ones.
        self._early_cancels: collections.deque[str] = collections.deque(maxlen=64)
        self._lock = threading.Lock()

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            try:
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
            except RuntimeError:  # at the process limit no thread can start
                with conn, contextlib.suppress(OSError, ValueError):
                    conn.settimeout(1.0)
                    _receive(conn)
                    conn.sendall(json.dumps(_error("failed", AT_LIMIT)).encode())

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                reply = self.dispatch(json.loads(_receive(conn)))
            except ValueError as error:
                reply = _error("input", f"the request is not valid: {error}")
            with contextlib.suppress(OSError):  # the caller went away (its exec was stopped)
                conn.sendall(json.dumps(reply).encode())

    def dispatch(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise ValueError("expected a JSON object")
        if "cancel" in request:
            self.cancel(str(request["cancel"]))
            return {"ok": True, "output": ""}
        if request.get("reset") is True:
            env = request.get("env")
            if env is not None and not (
                isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
            ):
                raise ValueError("env must map variable names to strings")
            try:
                self.reset(env, note=None if request.get("unused") is True else HANDED_OVER_NOTE)
            except Failed as error:
                return _error("failed", str(error))
            return {"ok": True, "output": ""}
        call_id = request.get("id")
        if not isinstance(call_id, str) or not CALL_ID.fullmatch(call_id):
            raise ValueError("id must be 1 to 64 letters, digits, - or _")
        timeout = request.get("timeout") or DEFAULT_TIMEOUT_S
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        call = Call(call_id, float(timeout))
        with self._lock:
            self._calls[call_id] = call
            if call_id in self._early_cancels:
                call.cancel.set()
        try:
            output = self.toolset.run(str(request.get("tool")), request.get("input"), call)
            return {"ok": True, "output": output}
        except InputError as error:
            return _error("input", str(error))
        except Failed as error:
            return _error("failed", str(error))
        except Exception as error:
            if disk.is_full(error):
                return _error("failed", disk.full_message())
            _log_failure()
            return _error("failed", f"the toolbox failed: {error!r}")
        finally:
            with self._lock:
                self._calls.pop(call_id, None)

    def cancel(self, call_id: str) -> None:
        with self._lock:
            call = self._calls.get(call_id)
            if call:
                call.cancel.set()
            else:
                self._early_cancels.append(call_id)

    def reset(self, env: dict[str, str] | None = None, *, note: str | None = HANDED_OVER_NOTE) -> None:
        """Serve a new holder: the previous one's calls stop, and its shell's state does not carry over;
        with `env`, the new shell has the new holder's session variables instead of the previous one's.
        The next call's result says `note`, if any."""
        with self._lock:
            for call in self._calls.values():
                call.cancel.set()
            self._early_cancels.clear()
        if env is not None:
            self.toolset.shell.env = with_session_env(self.toolset.shell.env, env)
            _save_session_env(env)
        self.toolset.shell.renew(note, timeout_s=RESET_TIMEOUT_S)


def with_session_env(base: dict[str, str], session: dict[str, str]) -> dict[str, str]:
    """`base` with the variables of the session it had (named by SESSION_ENV) replaced by `session`'s."""
    previous = set(filter(None, base.get(SESSION_ENV, "").split(",")))
    env = {name: value for name, value in base.items() if name not in previous}
    env.update(session)
    env[SESSION_ENV] = ",".join(sorted(session))
    return env


def _save_session_env(env: dict[str, str]) -> None:
    try:
        with open(SESSION_ENV_PATH + ".new", "w") as file:
            json.dump(env, file)
        os.replace(SESSION_ENV_PATH + ".new", SESSION_ENV_PATH)
    except OSError:  # a full disk: a restarted daemon would start with an older holder's variables
        _log_failure()


def _saved_session_env() -> dict[str, str] | None:
    try:
        with open(SESSION_ENV_PATH) as file:
            saved = json.load(file)
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in saved.items()} if isinstance(saved, dict) else None


def _log_failure() -> None:
    """The traceback of the toolbox's own failure, for its log, which a full disk may refuse: the
    caller still answers."""
    with contextlib.suppress(OSError):
        os.write(2, traceback.format_exc().encode(errors="replace"))


def _receive(conn: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise ValueError(f"larger than {MAX_REQUEST_BYTES // (1024 * 1024)} MiB")
        chunks.append(chunk)


def _sandbox_identity() -> str:
    """The boot and the start time of the sandbox's pid 1: new with each sandbox, kept when only the
    daemon restarts (also in a container committed to an image and started again)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        with open("/proc/1/stat", "rb") as file:
            started = file.read().rsplit(b")", 1)[1].split()[19].decode()  # field 22, starttime
    except OSError:
        return ""
    return f"{boot} {started}"


def _first_start() -> bool:
    identity = _sandbox_identity()
    try:
        with open(STARTED_PATH) as file:
            seen = file.read()
    except FileNotFoundError:
        seen = ""
    if seen != identity:
        with open(STARTED_PATH, "w") as file:
            file.write(identity)
    return seen != identity


def _open_log() -> int:
    """The daemon's log; a daemon started on a full disk (docker forks a new one when it dies) logs
    nowhere rather than not start."""
    try:
        os.makedirs(RUNTIME_DIR, mode=0o700, exist_ok=True)
        return os.open(LOG_PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as error:
        if not disk.is_full(error):
            raise
        return os.open(os.devnull, os.O_WRONLY)


def make_undumpable() -> None:
    """Keep the sandbox's other processes, of the same uid, from tracing this one or reading its
    descriptors (/proc/PID/fd, pidfd_getfd): the listening socket above all. A process that changed
    its uid is already so; one started by exec as the sandbox user is not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def inherited_listener(fd: int) -> socket.socket:
    """The listening unix socket at `fd`, close-on-exec from now on: no tool or shell inherits it."""
    try:
        os.set_inheritable(fd, False)
        listener = socket.socket(fileno=fd)
    except OSError as error:
        raise SystemExit(f"--listen-fd {fd} is not an open socket: {error}") from None
    if listener.family != socket.AF_UNIX or not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise SystemExit(f"--listen-fd {fd} is not a unix socket that listens")
    return listener


def set_limits(*, max_processes: int | None, max_memory_mb: int | None) -> None:
    # Set inside the sandbox's user namespace, RLIMIT_NPROC counts this sandbox's processes only.
    if max_processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    if max_memory_mb:
        limit = max_memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run(listener: socket.socket) -> int:
    """Serve the sandbox's calls on `listener` until killed (the caller set the user and the limits)."""
    log = _open_log()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)  # sys.stderr now writes to the log: tracebacks of the toolbox's own failures

    hidden = (PIDS_LIMIT_ENV, disk.DISK_MB_ENV)
    env = {name: value for name, value in os.environ.items() if name not in hidden}
    first = _first_start()
    if not first and (saved := _saved_session_env()) is not None:
        env = with_session_env(env, saved)
    cwd = WORKSPACE if os.path.isdir(WORKSPACE) else env.get("HOME", "/")
    shell = Shell(cwd=cwd, env=env)
    shell.start()
    disk.SANDBOX_DISK.check()  # takes the reserve
    if not first:
        shell.announce(
            f"[the sandbox's toolbox restarted since the last call, with a new shell: {RESET_NOTE}]"
        )

    limit = pids_limit()
    if limit:
        note = (
            f"[the sandbox stayed at its process limit ({limit}), so every process started from the "
            f"shell was killed and a new shell started: {RESET_NOTE}]"
        )
        PidsWatchdog(limit, lambda: shell.contain(note)).start()

    Daemon(Toolset(shell)).serve(listener)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolbox.daemon", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--listen-fd",
        type=int,
        required=True,
        metavar="N",
        help="serve on this inherited unix socket, which already listens",
    )
    parser.add_argument("--max-processes", type=int, help="RLIMIT_NPROC for the daemon and all it starts")
    parser.add_argument("--max-memory-mb", type=int, help="RLIMIT_AS (per process) for the same")
    args = parser.parse_args(argv)
    listener = inherited_listener(args.listen_fd)
    make_undumpable()
    set_limits(max_processes=args.max_processes, max_memory_mb=args.max_memory_mb)
    return run(listener)


if __name__ == "__main__":
    sys.exit(main())
