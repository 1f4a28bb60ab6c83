"""The keeper of one local sandbox: bwrap's parent, so that the sandbox ends with the server.

Every process that uses a local provider root holds a shared flock on `<root>/.alive` for as long as
it lives (`local.hold_root`); the kernel drops it however the process ends, SIGKILL included. The
keeper starts bwrap with `--die-with-parent` and waits for an exclusive lock on that file: it gets
one only when no process of the server holds the root any more, and then exits, which kills bwrap
and with it every process of the sandbox. A pool process that dies while the worker's main process
(or any other holder) lives leaves the sandbox running (the reaper ends it when no row claims it).

It listens on the toolbox's socket, which the provider bound in a folder the sandbox never sees, and
which bwrap hands to the daemon: SO_PEERCRED of every connection to it then names this process, which
the provider checks before each call (a socket put there by anyone else names another).

It also keeps bwrap's own output out of the sandbox's reach: bwrap's stdout and stderr are a pipe to
the keeper (the sandbox could write to its init's fds), of which it logs the first LOG_LIMIT bytes.
When the sandbox has ended it unmounts the sandbox's disk image and removes it.

Run by the local provider as `python3 -I -S keeper.py --lock PATH --log PATH [...] -- COMMAND`; only
the standard library, so that it starts as fast as a bare interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import threading

LOG_LIMIT = 64 * 1024
LISTEN_BACKLOG = 64
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _log_output(read: int, log: int) -> None:
    """Copy bwrap's output to the log up to LOG_LIMIT bytes, then drain it unlogged."""
    written = 0
    while chunk := os.read(read, 65536):
        if written < LOG_LIMIT:
            written += os.write(log, chunk[: LOG_LIMIT - written])


def _end_with_the_server(lock_path: str, process: subprocess.Popen[bytes]) -> None:
    fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)  # granted once no process holds the root (shared locks)
    os.close(fd)  # a server starting again need not wait for this sandbox to end
    with contextlib.suppress(ProcessLookupError):
        process.kill()  # --die-with-parent: bwrap's death kills the sandbox's init and all under it


def _join_cgroups(groups: list[str]) -> None:
    for group in groups:
        with open(os.path.join(group, "cgroup.procs"), "w") as file:
            file.write("0")


def _remove_disk(mountpoint: str | None, image: str | None) -> None:
    if mountpoint and os.path.ismount(mountpoint):
        subprocess.run(["umount", "--lazy", mountpoint], env={"PATH": PATH}, check=False)
    if image:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(image)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="keeper", description=__doc__.splitlines()[0])
    parser.add_argument("--lock", required=True, help="the provider root's liveness lock file")
    parser.add_argument("--log", required=True, help="where bwrap's output goes")
    parser.add_argument("--fd", type=int, action="append", default=[], help="a descriptor to pass to bwrap")
    parser.add_argument("--listen-fd", type=int, help="a bound socket to listen on (pass it with --fd too)")
    parser.add_argument("--cgroup", action="append", default=[], help="a cgroup directory bwrap starts in")
    parser.add_argument("--unmount", help="the sandbox's disk mount point, unmounted when it ends")
    parser.add_argument("--remove", help="the sandbox's disk image, removed when it ends")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    if args.listen_fd is not None:
        listener = socket.socket(fileno=args.listen_fd)
        listener.listen(LISTEN_BACKLOG)
        listener.detach()  # the descriptor stays open, for bwrap
    read, write = os.pipe()
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=write,
            pass_fds=args.fd,
            preexec_fn=(lambda: _join_cgroups(args.cgroup)) if args.cgroup else None,
            env={"PATH": PATH},
            cwd="/",
        )
    except OSError as error:
        os.write(log, f"keeper: cannot start {command[:1]}: {error}\n".encode())
        _remove_disk(args.unmount, args.remove)
        return 1
    finally:
        os.close(write)
        for fd in args.fd:
            os.close(fd)  # only bwrap holds them now (the provider waits for EOF on the info fd)
    logger = threading.Thread(target=_log_output, args=(read, log), daemon=True)
    logger.start()
    threading.Thread(target=_end_with_the_server, args=(args.lock, process), daemon=True).start()
    # bwrap's death signal is bound to this thread: it must be the one that waits.
    code = process.wait()
    logger.join(timeout=1.0)  # what bwrap said last (its pipe ends with the sandbox's processes)
    _remove_disk(args.unmount, args.remove)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
