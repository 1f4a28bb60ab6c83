"""The toolbox as the host puts it into a sandbox (docker: once into an image each sandbox starts from; the local
provider binds it)."""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
SANDBOX_PARENT = "/opt/workbench"
SANDBOX_DIR = SANDBOX_PARENT + "/toolbox"
CLIENT = SANDBOX_DIR + "/client.py"
SANDBOX_UID = 1000
# Started from SANDBOX_PARENT; -E -s: the sandbox's PYTHON* variables and user site do not apply.
# The daemon serves a socket its launcher listens on: add `--listen-fd N`.
DAEMON_COMMAND = ["python3", "-E", "-s", "-m", "toolbox.daemon"]
# Docker's first process, as root: it listens, and forks the daemon as the sandbox user.
SUPERVISOR_COMMAND = ["python3", "-E", "-s", "-m", "toolbox.supervisor", "--uid", str(SANDBOX_UID)]
# -I -S: no site, no environment, no script directory: a bare interpreter starts fastest.
CLIENT_COMMAND = ["python3", "-I", "-S", CLIENT]
# The client's way for call after call over one exec (see relay.py).
RELAY_COMMAND = ["python3", "-I", "-S", SANDBOX_DIR + "/relay.py"]


def source_files() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.py"))


@functools.cache
def digest() -> str:
    """What identifies this toolbox (the archive is the same bytes in every process: no times, fixed owners)."""
    return hashlib.sha256(archive()).hexdigest()[:32]


@functools.cache
def archive() -> bytes:
    """A tar of /opt/workbench/toolbox (root-owned, read-only to the sandbox user) and a /workspace
    owned by the sandbox user, so that any image with python3 can be a sandbox."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("opt", "opt/workbench", "opt/workbench/toolbox"):
            tar.addfile(_entry(name, tarfile.DIRTYPE, mode=0o755))
        for path in source_files():
            data = path.read_bytes()
            entry = _entry(f"opt/workbench/toolbox/{path.name}", tarfile.REGTYPE, mode=0o644)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
        tar.addfile(_entry("workspace", tarfile.DIRTYPE, mode=0o755, owner=SANDBOX_UID))
    return buffer.getvalue()


def _entry(name: str, kind: bytes, *, mode: int, owner: int = 0) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = kind
    entry.mode = mode
    entry.uid = entry.gid = owner
    entry.mtime = 0
    return entry
