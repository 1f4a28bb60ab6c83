"""Relay one request to the toolbox daemon: runs inside the sandbox, once per tool call.

The provider runs `python3 -I -S client.py` (one `docker exec`), writes the request to its stdin and
reads the daemon's reply from its stdout. The relay neither parses nor builds JSON: it only moves
bytes, so it starts in about the time of a bare interpreter. If no daemon answers (it was never
started, or the model killed it), the client starts one and waits for its socket.

This file is also the one source of the daemon's paths: the daemon and the providers import them.
"""

# `socket` imports `enum` and costs ~12 ms at start-up, the bulk of this program's run time; the
# C module has everything a unix-socket client needs.
import _socket
import os
import sys
import time

RUNTIME_DIR = "/tmp/.toolbox"
SOCKET_PATH = RUNTIME_DIR + "/daemon.sock"
LOCK_PATH = RUNTIME_DIR + "/daemon.lock"
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMON_START_TIMEOUT_S = 10.0


def _daemon_running():
    """Whether a daemon holds the lock (it may still be starting and not listen yet)."""
    import fcntl

    try:
        fd = os.open(LOCK_PATH, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _start_daemon():
    import subprocess

    subprocess.run(
        [sys.executable, "-E", "-s", "-m", "toolbox.daemon", "--detach"],
        cwd=PACKAGE_PARENT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def connect(path=SOCKET_PATH, timeout_s=DAEMON_START_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    started = False
    while True:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
        if not started and not _daemon_running():
            _start_daemon()
            started = True
        if time.monotonic() > deadline:
            raise TimeoutError(f"the toolbox daemon did not answer on {path} within {timeout_s:.0f} s")
        time.sleep(0.005)


def _fail(kind, message):
    import json

    sys.stdout.write(json.dumps({"ok": False, "error": kind, "message": message}))
    return 3


def main():
    request = sys.stdin.buffer.read()
    try:
        sock = connect()
    except (OSError, TimeoutError) as error:
        return _fail("sandbox", f"the sandbox's toolbox is unreachable: {error}")
    try:
        sock.sendall(request)
        sock.shutdown(_socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon answered without reading it all (an error): relay that answer
    out = sys.stdout.buffer
    replied = False
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        out.write(chunk)
        replied = True
    out.flush()
    if not replied:
        return _fail(
            "failed",
            "the sandbox's toolbox ended during the call (was it killed?); the next call starts a new one",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
