"""The docker sandbox's first process: listens on the toolbox's socket as root and keeps a daemon serving it.

Why: the channel between the platform and its toolbox must be one the sandbox user cannot take over.
The socket is bound in SOCKET_DIR, which only root may write, and listened on here, as root: the
client tells it from any socket a sandbox process could make by its peer credentials (SO_PEERCRED
names the process that called listen). The daemon is forked from here and drops to the sandbox user
without exec; a process that changed its uid is not dumpable, and without exec it stays so: no process
of the sandbox user can trace it or take its descriptors (/proc/PID/fd, pidfd_getfd). The sandbox user
can still kill it; a new one is forked on the same listening socket, and calls wait in its backlog.

The container runs this as uid 0 with no capability but CAP_SETUID and CAP_SETGID (to drop to the
sandbox user) and no-new-privileges; every process of the model's is the sandbox user's, with none.

Run (as root): cd /opt/workbench && python3 -E -s -m toolbox.supervisor --uid 1000
"""

from __future__ import annotations

import argparse
import os
import pwd
import socket
import stat
import sys
import time
import traceback

from . import daemon
from .client import SOCKET_DIR, SOCKET_PATH

# A daemon that lived this long is restarted at once; one that dies sooner waits, twice longer each time.
HEALTHY_S = 2.0
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 5.0


def _root_only(path: str) -> None:
    """Refuse a directory on the socket's path that anyone but root could change."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise SystemExit(
            f"{path} must be a directory of root's that no one else may write (it is uid "
            f"{info.st_uid}, mode {stat.filemode(info.st_mode)}): the toolbox's socket cannot be kept safe there"
        )


def listen() -> socket.socket:
    os.makedirs(SOCKET_DIR, mode=0o755, exist_ok=True)
    parts = SOCKET_DIR.strip("/").split("/")
    for depth in range(len(parts) + 1):
        _root_only("/" + "/".join(parts[:depth]))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.lexists(SOCKET_PATH):  # left by a committed container: this one starts afresh
        os.unlink(SOCKET_PATH)
    listener.bind(SOCKET_PATH)
    os.chmod(SOCKET_PATH, 0o600)
    listener.listen(64)
    return listener


def _become(uid: int) -> None:
    """Drop to the sandbox user for good, with its home (docker set root's, the container's user)."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = "/"
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.environ.get("HOME", "/root") == "/root":
        os.environ["HOME"] = home


def _serve(listener: socket.socket, uid: int) -> int:
    """The forked daemon: never returns to the supervisor's loop."""
    try:
        _become(uid)
        daemon.make_undumpable()
        return daemon.run(listener)
    except BaseException:
        traceback.print_exc()
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolbox.supervisor", description=__doc__.splitlines()[0])
    parser.add_argument("--uid", type=int, required=True, help="the sandbox user the daemon runs as")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or args.uid == 0:
        raise SystemExit("the supervisor runs as root and its daemon as the sandbox user, never as root")
    listener = listen()
    delay = FIRST_DELAY_S
    while True:
        started = time.monotonic()
        try:
            pid = os.fork()
        except OSError:  # the sandbox is at its pids limit: wait for room
            pid = None
        if pid == 0:
            os._exit(_serve(listener, args.uid))
        if pid is not None:
            os.waitpid(pid, 0)
            if time.monotonic() - started > HEALTHY_S:
                delay = FIRST_DELAY_S
                continue
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)


if __name__ == "__main__":
    sys.exit(main())
