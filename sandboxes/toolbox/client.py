"""Relay one request to the toolbox daemon: runs inside a docker sandbox, as root, once per tool call.

The provider runs `python3 -I -S client.py` (one `docker exec`), writes the request to its stdin and
reads the daemon's reply from its stdout; `relay.py` relays call after call the same way (`call`) over
one exec the provider keeps. The client neither parses nor builds JSON: it only moves bytes, so it
starts in about the time of a bare interpreter.

The socket is the supervisor's (see `supervisor.py`): bound in SOCKET_DIR, which only root may write,
and listened on by root. Before sending anything the client asks the kernel who listens
(SO_PEERCRED gives the credentials of the process that called listen); anything but root is some
process of the sandbox's own, and the call is refused. While a daemon restarts, a connection waits in
the socket's backlog; the client starts nothing itself.

This file is also the one source of the toolbox's paths: the daemon and the providers import them.
"""

# `socket` imports `enum` and costs ~12 ms at start-up, the bulk of this program's run time; the
# C module has everything a unix-socket client needs.
import _socket
import json
import sys
import time

SOCKET_DIR = "/run/toolbox"
SOCKET_PATH = SOCKET_DIR + "/daemon.sock"
LISTENER_UID = 0
# The daemon's own files (call scripts, outputs, its log): the sandbox user's, as its commands are.
RUNTIME_DIR = "/tmp/.toolbox"
DAEMON_START_TIMEOUT_S = 10.0
# relay.py's frames' length prefix; it leaves after RELAY_IDLE_S unused.
RELAY_HEADER_BYTES = 4
RELAY_IDLE_S = 120.0


class NotTheToolbox(OSError):
    pass


def connect(path=SOCKET_PATH, timeout_s=DAEMON_START_TIMEOUT_S, listener_uid=LISTENER_UID):
    """A connection to the toolbox's socket, once it exists (the container may be starting), that a
    process of `listener_uid` listens on."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {path} after {timeout_s:.0f} s")
        time.sleep(0.005)
    # struct ucred: pid, uid, gid, each a C int
    uid = int.from_bytes(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)[4:8], sys.byteorder)
    if uid != listener_uid:
        sock.close()
        raise NotTheToolbox(
            f"{path} is listened on by a process of uid {uid}, not root as the toolbox's supervisor is: "
            "a process in the sandbox replaced it, so the call was refused"
        )
    return sock


def _failure(kind, message):
    return json.dumps({"ok": False, "error": kind, "message": message}).encode()


def call(request):
    """(the daemon's reply to one request, whether the daemon replied): a connection of its own, its
    listener checked first. Without a reply, the failure is worded as the daemon words one."""
    try:
        sock = connect()
    except (OSError, TimeoutError) as error:
        return _failure("sandbox", f"the sandbox's toolbox is unreachable: {error}"), False
    try:
        try:
            sock.sendall(request)
            sock.shutdown(_socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered without reading it all (an error): relay that answer
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        sock.close()
    if not chunks:
        return _failure(
            "failed",
            "the sandbox's toolbox ended during the call (was it killed?); a new one takes the next call",
        ), False
    return b"".join(chunks), True


def main():
    reply, replied = call(sys.stdin.buffer.read())
    sys.stdout.buffer.write(reply)
    sys.stdout.buffer.flush()
    return 0 if replied else 3


if __name__ == "__main__":
    sys.exit(main())
