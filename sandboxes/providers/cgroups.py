"""A cgroup per local sandbox (pids, memory, cpu), when this process may create one (as root).

Both layouts are handled: the unified hierarchy (cgroup v2, /sys/fs/cgroup/cgroup.controllers) and
the per-controller hierarchies of cgroup v1. When neither can be used, `create` returns no groups and
the local provider falls back to rlimits.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "workbench-local"
CPU_PERIOD_US = 100_000


def create(name: str, *, pids: int, memory_mb: int, cpus: float) -> list[str]:
    """The directories of the new cgroup(s) limiting pids, memory and cpu; [] if not possible."""
    if os.geteuid() != 0:
        return []
    memory = str(memory_mb * 1024 * 1024)
    quota = str(max(1000, int(cpus * CPU_PERIOD_US)))
    created: list[str] = []
    try:
        if (ROOT / "cgroup.controllers").exists():
            parent = ROOT / PARENT
            parent.mkdir(exist_ok=True)
            for level in (ROOT, parent):
                (level / "cgroup.subtree_control").write_text("+pids +memory +cpu")
            group = parent / name
            group.mkdir()
            created.append(str(group))
            _write(
                group, {"pids.max": str(pids), "memory.max": memory, "cpu.max": f"{quota} {CPU_PERIOD_US}"}
            )
            _write(group, {"memory.swap.max": "0"}, optional=True)
            return created
        limits = {
            "pids": {"pids.max": str(pids)},
            "memory": {"memory.limit_in_bytes": memory},
            "cpu": {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": quota},
        }
        for controller, files in limits.items():
            if controller == "cpu" and not (ROOT / "cpu").is_dir():
                continue  # a cpu limit is welcome, not required
            group = ROOT / controller / PARENT / name
            group.mkdir(parents=True)
            created.append(str(group))
            _write(group, files)
        _write(ROOT / "memory" / PARENT / name, {"memory.memsw.limit_in_bytes": memory}, optional=True)
        return created
    except OSError:
        remove(created)
        return []


def join(groups: list[str]) -> None:
    """Move the calling process into the groups (run in the child, before it execs the sandbox)."""
    for group in groups:
        with open(os.path.join(group, "cgroup.procs"), "w") as file:
            file.write("0")


def remove(groups: list[str], *, timeout_s: float = 3.0) -> None:
    """Remove the groups once their processes have exited (rmdir fails while any remain)."""
    deadline = time.monotonic() + timeout_s
    for group in groups:
        while True:
            try:
                os.rmdir(group)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)


def _write(group: Path, files: dict[str, str], *, optional: bool = False) -> None:
    for name, value in files.items():
        if optional:
            with contextlib.suppress(OSError):
                (group / name).write_text(value)
        else:
            (group / name).write_text(value)
