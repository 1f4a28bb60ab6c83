"""Benchmark of the sandbox providers: provisioning time and the round trip of one tool call.

    .venv/bin/python bench/sandboxes.py [--quick] [--provisions 20] [--calls 200]

Prints a table and writes bench/results/sandboxes.json and sandboxes.png (sandboxes-quick.* with --quick).

- cold provision: `provision()` of a new container from the image (no pool), p50/p95; its samples taken in
  turn with those of the way sandboxes started before toolbox images (the toolbox copied into each container
  before its start), whose rows follow;
- provision to first result: `provision()` then the first `execute` of `echo hi` returning;
- machine CPU per sandbox: the CPU the whole machine spent (not idle, not waiting on I/O) over one sandbox's
  provision, first call and terminate, whoever spent it (the engine, the kernel, this client): what starting
  sandboxes that go unused costs everyone else. The storage driver is in the results (`docker_storage`): on
  this repository's quota-enforcing btrfs it cost 1.7 times what overlay2 did (930 vs 540 ms p50);
- execute vs raw docker exec, measured interleaved in one run: `execute(handle, "bash",
  {"command": "echo hi"})` (through the sandbox's relay, sandboxes/providers/relays.py) against a raw exec
  of `echo hi` in the same container (exec create, start, inspect: what `docker exec` does), the overhead
  of the first over the second pairwise, and execute as before relays (an exec of the toolbox client per
  call); then the machine's CPU per call of both, over blocks of 20 calls, in turn;
- the same for the local (bubblewrap) provider when bwrap works here.

A warm pool (sandboxes provisioned ahead, handed out on demand) belongs to the Django layer: pass its
measurement as an extra row, `run_rows(extra_rows=[warm_pool_row])`, where `warm_pool_row()` returns a
`Row` (see `timed_row`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/sandboxes.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT  # noqa: E402
from bench.common.app import (  # noqa: E402
    new_agent,
    new_environment,
    new_session,
    provision_sandbox,
    refill_pool,
    terminate_sandboxes,
)
from bench.common.machine import busy_cpu_seconds, machine_info  # noqa: E402
from bench.common.results import publish, pyplot, run, save_figure, stem  # noqa: E402
from sandboxes.providers.base import Provider, Resources  # noqa: E402
from sandboxes.providers.docker import DockerProvider  # noqa: E402
from sandboxes.toolbox.bundle import archive  # noqa: E402

LABELS = {"workbench.sandbox": "bench", "workbench.bench": "sandboxes"}
TARGET_PROVISION_P50_MS = 500.0
TARGET_OVERHEAD_P50_MS = 30.0


@dataclass
class Row:
    name: str
    samples_ms: list[float] = field(default_factory=list)
    target_p50_ms: float | None = None

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p95(self) -> float:
        if len(self.samples_ms) < 2:
            return self.samples_ms[0]
        return statistics.quantiles(self.samples_ms, n=20, method="inclusive")[18]

    @property
    def verdict(self) -> str:
        if self.target_p50_ms is None:
            return ""
        mark = "met" if self.p50 <= self.target_p50_ms else "MISSED"
        return f"p50 <= {self.target_p50_ms:g} ms: {mark}"


def timed_row(
    name: str, action: Callable[[], object], *, samples: int, target_p50_ms: float | None = None
) -> Row:
    """Time `action` `samples` times: the building block for extra rows such as a warm pool's."""
    row = Row(name, target_p50_ms=target_p50_ms)
    for _ in range(samples):
        started = time.perf_counter()
        action()
        row.samples_ms.append((time.perf_counter() - started) * 1000)
    return row


class ToolboxCopiedAtStart(DockerProvider):
    """Sandboxes as they started before toolbox images: from the sandbox's image itself, the toolbox copied
    into each container before its start (the engine's tar helper, a new dockerd process, each time)."""

    def toolbox_image(self, image: str) -> str:
        return str(self._inspect_image(image)["Id"])

    def _start(self, handle: str) -> None:
        self.api.put_archive(handle, "/", archive())
        super()._start(handle)


def provision_rows(
    provider: Provider, label: str, *, samples: int, baseline: tuple[Provider, str] | None = None
) -> list[Row]:
    """Provisioning's rows for `provider`, and for `baseline` (another provider and its label) with samples
    taken in turn with the first's, so that the machine's noise falls on both alike."""
    measured = [(provider, label)] + ([baseline] if baseline else [])
    rows = {
        name: (
            Row(
                f"{name}: cold provision", target_p50_ms=TARGET_PROVISION_P50_MS if name == "docker" else None
            ),
            Row(f"{name}: provision to first result"),
            # The whole machine's CPU, not the wall clock: on Docker the engine and the kernel work for each
            # sandbox (its layers, cgroup and namespaces made and removed) in processes that are not ours.
            Row(f"{name}: machine CPU per sandbox (provision, one call, terminate)"),
        )
        for _, name in measured
    }
    for each in measured:  # one unmeasured, to make what a first sandbox makes (the toolbox image)
        each[0].terminate(each[0].provision(Resources(labels=LABELS)))
    for _ in range(samples):
        for each, name in measured:
            cold, first, cpu = rows[name]
            spent, started = busy_cpu_seconds(), time.perf_counter()
            handle = each.provision(Resources(labels=LABELS))
            provisioned = time.perf_counter()
            try:
                each.execute(handle, "bash", {"command": "echo hi"})
                answered = time.perf_counter()
            finally:
                each.terminate(handle)
            cpu.samples_ms.append((busy_cpu_seconds() - spent) * 1000)
            cold.samples_ms.append((provisioned - started) * 1000)
            first.samples_ms.append((answered - started) * 1000)
    return [row for _, name in measured for row in rows[name]]


CPU_BLOCK = 20  # calls per sample of the machine's CPU per call (its counters tick every 10 ms)


def docker_call_rows(provider: DockerProvider, *, samples: int) -> list[Row]:
    """execute() (through the sandbox's relay), execute() through an exec of the client per call (as before
    relays) and a raw exec of the same command, interleaved so that all see the same machine; and the machine's
    CPU per call of the first two, over blocks of CPU_BLOCK calls each, also in turn."""
    api = provider.api
    per_exec = DockerProvider(relay=False)
    handle = provider.provision(Resources(labels=LABELS))
    raw = Row("docker: raw docker exec (echo hi)")
    execute = Row("docker: execute bash (echo hi)")
    overhead = Row("docker: execute overhead over raw exec", target_p50_ms=TARGET_OVERHEAD_P50_MS)
    one_shot = Row("docker: execute bash, an exec of the client per call (before relays)")
    cpu = Row("docker: machine CPU per execute")
    one_shot_cpu = Row("docker: machine CPU per execute, an exec per call (before relays)")
    try:
        provider.execute(handle, "bash", {"command": "true"})  # the daemon is up: measure calls only
        for n in range(samples + 5):
            started = time.perf_counter()
            exec_id = api.exec_create(handle, ["echo", "hi"])["Id"]
            assert api.exec_start(exec_id) == b"hi\n"
            api.exec_inspect(exec_id)
            middle = time.perf_counter()
            assert provider.execute(handle, "bash", {"command": "echo hi"}) == "hi"
            ended = time.perf_counter()
            assert per_exec.execute(handle, "bash", {"command": "echo hi"}) == "hi"
            last = time.perf_counter()
            if n < 5:  # warm-up
                continue
            raw.samples_ms.append((middle - started) * 1000)
            execute.samples_ms.append((ended - middle) * 1000)
            overhead.samples_ms.append((ended - middle - (middle - started)) * 1000)
            one_shot.samples_ms.append((last - ended) * 1000)
        for _ in range(max(3, samples // CPU_BLOCK // 2)):
            for each, row in ((provider, cpu), (per_exec, one_shot_cpu)):
                spent = busy_cpu_seconds()
                for _ in range(CPU_BLOCK):
                    each.execute(handle, "bash", {"command": "echo hi"})
                row.samples_ms.append((busy_cpu_seconds() - spent) * 1000 / CPU_BLOCK)
    finally:
        provider.terminate(handle)
    return [raw, execute, overhead, one_shot, cpu, one_shot_cpu]


def local_call_rows(provider: Provider, *, samples: int) -> list[Row]:
    handle = provider.provision(Resources(labels=LABELS))
    try:
        provider.execute(handle, "bash", {"command": "true"})
        return [
            timed_row(
                "local: execute bash (echo hi)",
                lambda: provider.execute(handle, "bash", {"command": "echo hi"}),
                samples=samples,
            )
        ]
    finally:
        provider.terminate(handle)


def docker_available() -> DockerProvider | None:
    subprocess.run([ROOT / "scripts" / "start-dockerd.sh"], check=False)
    subprocess.run([ROOT / "scripts" / "build-image.sh"], check=False)
    provider = DockerProvider()
    try:
        provider.api.inspect_image(Resources().image)
    except Exception as error:
        print(f"docker: skipped ({error})", file=sys.stderr)
        return None
    return provider


def local_available() -> Provider | None:
    from sandboxes.providers.local import LocalProvider

    if not shutil.which("bwrap"):
        print("local: skipped (bwrap is not installed)", file=sys.stderr)
        return None
    return LocalProvider()


def run_rows(
    *, provisions: int = 20, calls: int = 200, extra_rows: Iterable[Callable[[], Row | list[Row]]] = ()
) -> list[Row]:
    rows: list[Row] = []
    docker_provider = docker_available()
    if docker_provider is not None:
        before = (
            ToolboxCopiedAtStart(),
            "docker, before toolbox images (the toolbox copied in at each start)",
        )
        rows += provision_rows(docker_provider, "docker", samples=provisions, baseline=before)
        rows += docker_call_rows(docker_provider, samples=calls)
    local_provider = local_available()
    if local_provider is not None:
        rows += provision_rows(local_provider, "local", samples=provisions)
        rows += local_call_rows(local_provider, samples=calls)
    for make in extra_rows:
        made = make()
        rows += made if isinstance(made, list) else [made]
    return rows


def plot(rows: list[Row], path: Path, title: str) -> None:
    """Box plots, lying down so that the rows' names can be read: provisioning on a linear scale, calls on a
    logarithmic one (a relayed call and an exec per call differ 30-fold)."""
    plt = pyplot()
    provision = [row for row in rows if "provision" in row.name]
    calls = [row for row in rows if "provision" not in row.name and "overhead" not in row.name]
    height = 1.2 + 0.45 * max(len(provision), len(calls))
    figure, axes = plt.subplots(1, 2, figsize=(16, height))
    groups = ((axes[0], provision, "provisioning", "linear"), (axes[1], calls, "one call (echo hi)", "log"))
    for axis, group, heading, scale in groups:
        if not group:
            axis.set_visible(False)
            continue
        axis.boxplot([row.samples_ms for row in reversed(group)], vert=False, showfliers=True)
        axis.set_yticks(
            range(1, len(group) + 1), [textwrap.fill(row.name, 48) for row in reversed(group)], fontsize=7
        )
        axis.set_xscale(scale)
        axis.set_xlabel("ms (wall clock, or the machine's CPU where the row says so)")
        axis.set_title(heading)
        for row in group:
            if row.target_p50_ms:
                axis.axvline(row.target_p50_ms, color="tab:red", linestyle="--", linewidth=1)
    save_figure(figure, path, title)


def warm_pool_rows(samples: int) -> list[Row]:
    """Provisioning through the platform's own service, from an environment's warm pool and cold.

    Runs Django against a throw-away SQLite file (the pool's bookkeeping is a few row updates); the pool is
    refilled, untimed, before each timed take.
    """
    folder = tempfile.mkdtemp(prefix="bench-pool-")
    os.environ.update(
        DATABASE_URL=f"sqlite:///{folder}/bench.sqlite3",
        CELERY_BROKER_URL="memory://",
        DJANGO_SETTINGS_MODULE="workbench.settings",
        SANDBOX_PROVIDER="docker",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    agent = new_agent()
    rows = []
    for label, pool, target in (
        ("platform: provision from the warm pool", 1, 50.0),
        ("platform: provision cold (no pool)", 0, None),
    ):
        env = new_environment(label, {"type": "cloud", "sandbox": {"warm_pool": pool}})
        session = new_session(agent=agent, environment=env)
        row = Row(label, target_p50_ms=target)
        for i in range(samples):
            refill_pool(env)
            started = time.perf_counter()
            sandbox = provision_sandbox(session, name=f"hand-{i}")
            row.samples_ms.append((time.perf_counter() - started) * 1000)
            assert bool(sandbox.labels.get("from_pool")) == bool(pool), (
                "the pool did not hand out its sandbox"
            )
            terminate_sandboxes(session)  # a session holds at most SANDBOX_MAX_PER_SESSION hands
        rows.append(row)
        terminate_sandboxes()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provisions", type=int, default=20, help="samples of provisioning (default 20)")
    parser.add_argument("--calls", type=int, default=200, help="samples of each call (default 200)")
    parser.add_argument("--quick", action="store_true", help="few samples, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.provisions, args.calls = 5, 30
    began = time.monotonic()
    rows = run_rows(
        provisions=args.provisions, calls=args.calls, extra_rows=[lambda: warm_pool_rows(args.provisions)]
    )
    machine = machine_info(tools=True)
    result = {
        "benchmark": "sandboxes",
        "quick": args.quick,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "seconds": round(time.monotonic() - began, 1),
        "rows": [{**asdict(row), "p50_ms": row.p50, "p95_ms": row.p95} for row in rows],
    }
    title = f"bench/sandboxes on {machine['nproc']} CPUs, Docker {machine['docker'] or '-'}, {result['at']}"
    publish(stem("sandboxes", args.quick), result, lambda png: plot(rows, png, title))
    return 0


if __name__ == "__main__":
    run(main)
