"""The machine a benchmark's figures came from, and where its CPU went meanwhile (Linux's /proc)."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def machine_info(*, tools: bool = False) -> dict[str, Any]:
    """The CPUs, memory, kernel, load and versions; the database's durability settings on PostgreSQL; with
    `tools`, the Docker engine's and git's versions, the engine's storage driver and its CPU weight."""
    import django
    import psycopg
    from django.db import connection

    settings = {}
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for name in (
                "server_version",
                "fsync",
                "synchronous_commit",
                "full_page_writes",
                "shared_buffers",
                "wal_sync_method",
            ):
                cursor.execute(f"SHOW {name}")
                settings[name] = cursor.fetchone()[0]
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    info: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gib": round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1),
        "kernel": platform.release(),
        "load_average_at_start": load_average(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "postgresql": settings,
    }
    if tools:
        info["docker"] = version_of(["docker", "version", "--format", "{{.Server.Version}}"])
        info["docker_storage"] = version_of(["docker", "info", "--format", "{{.Driver}}"])
        info["docker_cpu_weight"] = engine_cpu_weight()
        info["git"] = version_of(["git", "--version"])
    return info


def cpu_cgroup(pid: int) -> str:
    """The cpu cgroup of a process, as /proc/PID/cgroup names it ("/" is the root): v1's cpu controller's,
    else the unified hierarchy's."""
    found = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
        if number == "0":
            found = path
    if found is None:
        raise ValueError(f"process {pid} is in no cpu cgroup")
    return found


def cpu_weight(group: str) -> float:
    """A cgroup's CPU weight, where a process's is 100: cgroup v2's cpu.weight, or v1's cpu.shares / 10.24."""
    if group == "/":
        return 100.0
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return float(Path(f"/sys/fs/cgroup{group}/cpu.weight").read_text())
    return round(int(Path(f"/sys/fs/cgroup/cpu{group}/cpu.shares").read_text()) / 10.24, 1)


def engine_cpu_weight(pid_file: Path = Path("/var/run/docker.pid")) -> float | None:
    """The CPU weight of this machine's dockerd (scripts/start-dockerd.sh gives it 10); None for an engine
    elsewhere."""
    with contextlib.suppress(OSError, ValueError):
        return cpu_weight(cpu_cgroup(int(pid_file.read_text())))
    return None


def warn_if_busy(machine: dict[str, Any]) -> None:
    if machine["load_average_at_start"][0] > 0.5:
        print(
            f"note: load average {machine['load_average_at_start'][0]} before starting; other work on this "
            "machine will make the figures noisy",
            flush=True,
        )


def version_of(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip()


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_jiffies() -> list[float]:
    """The machine's CPU time so far, all CPUs, by state: user, nice, system, idle, iowait, irq, softirq,
    steal, ... (in clock ticks)."""
    return [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def busy(before: list[float], now: list[float]) -> float:
    """The share of the CPUs' time between two `cpu_jiffies()` that was neither idle nor waiting on I/O."""
    return 1 - ((now[3] + now[4]) - (before[3] + before[4])) / max(1e-9, sum(now) - sum(before))


def stolen(before: list[float], now: list[float]) -> float:
    """The share of the CPUs' time between two `cpu_jiffies()` a hypervisor gave to other guests (steal): on a
    shared virtual machine, a slowness of the whole machine that no process here is charged for."""
    if len(now) < 8 or len(before) < 8:
        return 0.0
    return round((now[7] - before[7]) / max(1e-9, sum(now) - sum(before)), 3)


def busy_cpu_seconds() -> float:
    """The CPU seconds the machine has spent so far, all CPUs, neither idle nor waiting on I/O."""
    now = cpu_jiffies()
    return (sum(now) - now[3] - now[4]) / os.sysconf("SC_CLK_TCK")


def btrfs_commits() -> tuple[int, float, float] | None:
    """(transaction commits, their total ms, the last one's ms) of the machine's btrfs filesystems (the
    Docker engine's storage, when it is btrfs), summed, from /sys/fs/btrfs/*/commit_stats; None if none.
    A long commit holds up every writer of that filesystem, the engine's container starts and removals."""
    commits = total = last = 0.0
    found = False
    for stats in Path("/sys/fs/btrfs").glob("*/commit_stats"):
        with contextlib.suppress(OSError, ValueError):
            fields = dict(line.split() for line in stats.read_text().splitlines() if len(line.split()) == 2)
            commits += int(fields["commits"])
            total += float(fields["total_commit_ms"])
            last = max(last, float(fields["last_commit_ms"]))
            found = True
    return (int(commits), total, last) if found else None


def cpu_pressure_us() -> float | None:
    """Microseconds, since boot, that some runnable task waited for a CPU (Linux PSI), if the kernel says."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return float(Path("/proc/pressure/cpu").read_text().split()[4].split("=")[1])
    return None


def process_stats() -> Iterator[tuple[int, str, list[str]]]:
    """Every process still there: its pid, its command name and the fields of /proc/<pid>/stat after the name
    (state first; utime and stime are [11:13], with the children's [11:15])."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()


def cpu_seconds_by_part(
    groups: dict[str, list[int]], singles: dict[str, int], postmaster: int | None
) -> dict[str, float]:
    """CPU seconds so far of our processes by part: `groups` are process groups (a leader and what it forked),
    `singles` single processes, PostgreSQL the postmaster and its children, this client its own process, and
    the Docker engine (dockerd, containerd and the shims) is shared with anything else on this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    leaders = {pid: name for name, pids in groups.items() for pid in pids}
    single = {pid: name for name, pid in singles.items()}
    totals: dict[str, float] = dict.fromkeys([*groups, *singles, "postgresql", "docker engine (shared)"], 0.0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    totals["this client"] = usage.ru_utime + usage.ru_stime
    for pid, comm, fields in process_stats():
        ppid, pgrp = int(fields[1]), int(fields[2])
        seconds = sum(int(x) for x in fields[11:15]) / tick  # utime, stime, cutime, cstime
        if pid in single:
            totals[single[pid]] += seconds
        elif pgrp in leaders:
            totals[leaders[pgrp]] += seconds
        elif postmaster is not None and (pid == postmaster or ppid == postmaster):
            totals["postgresql"] += seconds
        elif comm in ("dockerd", "containerd") or comm.startswith("containerd-shim"):
            totals["docker engine (shared)"] += seconds
    return totals
