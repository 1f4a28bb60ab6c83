"""The sandbox's disk when the model fills it: how the toolbox notices, keeps working, and says so.

The toolbox's own files (call scripts, outputs, its log) live on the sandbox's disk, under the quota
the model fills. On a full quota docker's btrfs refuses even an empty file, and the call that would
free space could not run. So the toolbox needs nothing of a full disk to run a call:
- a call's output goes to /dev/shm (memory) while the disk is full (`output.spool`), and its script
  through a pipe when no file can be made for it (`shell.py`);
- it holds a small reserve on the disk, given up when the disk fills and taken back once it has room:
  some ways of freeing space need room themselves (btrfs refuses `truncate` on a full quota), and
  so do the model's first small steps. A reserve alone would not do: the model's next command may
  fill what it gave back.
Whether the disk is full is seen by allocating a little past the reserve and giving it back: docker's
btrfs quota shows in no statvfs, and two syscalls per call (~0.1 ms) are all it costs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from .client import RUNTIME_DIR

# The sandbox's quota in MB, set by the provider: the daemon says it when the disk is full.
DISK_MB_ENV = "WORKBENCH_DISK_MB"
FULL_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT})
RESERVE_PATH = RUNTIME_DIR + "/disk.reserve"
RESERVE_BYTES = 4 * 1024 * 1024
# The disk counts as full when less than this is free beyond the reserve.
ROOM_BYTES = 1024 * 1024


def is_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in FULL_ERRORS


def full_message(detail: str = "") -> str:
    """What the model is told; `detail` (", so ...") says what the full disk stopped."""
    quota = os.environ.get(DISK_MB_ENV, "")
    quota = f": its quota is {quota} MB" if quota.isdigit() else ""
    return f"the sandbox's disk is full{quota}{detail}; free space, e.g. remove large files, then retry"


class Disk:
    """Whether the sandbox's disk is full, holding the toolbox's reserve on it while it is not."""

    def __init__(self, reserve_path: str = RESERVE_PATH):
        self.reserve_path = reserve_path
        self.full = False
        self._reserve: int | None = None  # the reserve's descriptor, while it is held
        self._lock = threading.Lock()

    def check(self) -> bool:
        """Whether the disk is full now: the reserve is given up when it is, and taken back when not."""
        with self._lock:
            try:
                if self._reserve is None:
                    self._reserve = self._claim()
                os.posix_fallocate(self._reserve, RESERVE_BYTES, ROOM_BYTES)
                os.ftruncate(self._reserve, RESERVE_BYTES)
            except OSError as error:
                if not is_full(error):  # e.g. the model took the toolbox's folder away: not known full
                    self.full = False
                    return False
                self._give_back()
            self.full = self._reserve is None
            return self.full

    def has_room(self) -> bool:
        """Whether a call's files may go on the disk: as last seen, and checked again while full."""
        return not (self.full and self.check())

    def _claim(self) -> int:
        os.makedirs(os.path.dirname(self.reserve_path), mode=0o700, exist_ok=True)
        fd = os.open(self.reserve_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(self.reserve_path)
            raise
        return fd

    def _give_back(self) -> None:
        # Unlinking works on a full btrfs quota where truncating does not; the space is freed on close.
        with contextlib.suppress(OSError):
            os.unlink(self.reserve_path)
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None


SANDBOX_DISK = Disk()
