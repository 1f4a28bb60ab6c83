"""Benchmark of a session's clone: from the network (a `git daemon` on loopback) against from the workers'
repository cache (sandboxes/mirrors.py), side by side in one run.

    .venv/bin/python bench/clone.py [--quick] [--samples 20] [--files 3000] [--commits 40]

Prints a table and writes bench/results/clone.json and clone.png (clone-quick.* with --quick).

A repository of meaningful size is generated (`--files` Python files, `--commits` commits each rewriting a
share of them) and served by `git daemon` on 127.0.0.1. Each sample first pushes one more commit to it
(untimed), then times `repository_archive` (the worker's whole clone: git, then the tar copied into a
sandbox) twice, in alternating order: with the cache off (a clone from the daemon, as before the cache) and
with it on (the mirror, warm, fetched incrementally from the daemon as the session, then the clone from the
mirror). Both for the default checkout (one commit deep) and a commit checkout (all history). The cache's
clone of a state is kept, so a next row times one more clone from the cache of the same state (another
session's: its fetch, then the kept tar read instead of a clone). A further row
per checkout is a session taking a warm pool sandbox prepared with the repository
(config.sandbox.pool_repository): the pool's checkout is made from the mirror (untimed: the refill's work,
before any session asks), and the session's side is timed: its proof of access (ls-remote and the fetch as
the session) and the comparison, with nothing to clone or copy. The first fill of the mirror is one more
row. No egress proxy: the clone as a public repository's.

Loopback makes the network free: the daemon's clone pays only for packing and indexing. Against a remote
across a real network (GitHub), the network clone also pays the transfer of the whole tree, which the cache
replaces by the transfer of what changed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/clone.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common.machine import machine_info  # noqa: E402
from bench.common.results import pct, publish, pyplot, run, save_figure, say, stem  # noqa: E402

NOTE = (
    "Each sample pushes one commit, then times the worker's clone (git and the tar for the sandbox) from "
    "`git daemon` on loopback and from the cache (ls-remote and an incremental fetch from the daemon, then a "
    "clone from the mirror), in alternating order, then once more from the cache (the same state: its fetch, "
    "then the clone kept from the first read instead of made). Loopback makes the network free, so the "
    "daemon's clone pays "
    "only what the cache's does too (packing, indexing, checkout); across a real network the daemon's side "
    "would also pay the transfer of the tree, and the cache only that of the new commit. The prepared pool row "
    "times a session keeping a warm pool sandbox's checkout: its fetch as itself, nothing cloned or copied."
)


class PreparedSandbox:
    """Stands in for a warm pool sandbox: takes the refill's checkout, and fails the row if the session's side
    copies or runs anything (the prepared checkout must stand)."""

    def copy_in(self, handle: str, archive: bytes) -> None:
        self.archive = archive

    def execute(self, *args: object, **kwargs: object) -> str:
        raise AssertionError("the prepared checkout did not stand: the session's side removed it")


GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]


def generate(work: Path, *, files: int, commits: int) -> None:
    """A repository at `work` of `files` files in 40 packages, and `commits` commits, the first adding every
    file and each later one rewriting a twentieth of them."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    rng = random.Random(1)
    for commit in range(commits):
        touched = range(files) if commit == 0 else rng.sample(range(files), max(files // 20, 1))
        for i in touched:
            path = work / f"pkg{i % 40}" / f"module{i}.py"
            path.parent.mkdir(exist_ok=True)
            path.write_text(
                "".join(f"def f{j}(x):\n    return x * {rng.randint(0, 10**6)}\n\n" for j in range(30))
            )
        subprocess.run([*GIT, "-C", str(work), "add", "-A"], check=True)
        subprocess.run([*GIT, "-C", str(work), "commit", "-qm", f"commit {commit}"], check=True)


def push_one_more(work: Path, served: Path, n: int) -> str:
    (work / "CHANGES.txt").write_text(f"change {n}\n")
    subprocess.run([*GIT, "-C", str(work), "add", "CHANGES.txt"], check=True)
    subprocess.run([*GIT, "-C", str(work), "commit", "-qm", f"change {n}"], check=True)
    subprocess.run(["git", "-C", str(work), "push", "-q", str(served), "main"], check=True)
    return subprocess.run(
        ["git", "-C", str(work), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def row(name: str, samples: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "n": len(samples),
        "p50_ms": pct(samples, 0.5),
        "p95_ms": pct(samples, 0.95),
        **extra,
        "samples_ms": [round(s, 1) for s in samples],
    }


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(9, 4))
    axis.boxplot(
        [r["samples_ms"] for r in rows], orientation="horizontal", tick_labels=[r["name"] for r in rows]
    )
    axis.set_xlabel("ms (clone + tar; a prepared pool sandbox: the session's proof alone)")
    axis.set_xscale("log")
    save_figure(figure, path, title)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20, help="samples of each row (default 20)")
    parser.add_argument("--files", type=int, default=3000, help="files in the repository (default 3000)")
    parser.add_argument("--commits", type=int, default=40, help="commits in its history (default 40)")
    parser.add_argument("--quick", action="store_true", help="few samples, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.samples = 5
    began = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="bench-clone-"))
    os.environ.update(
        DATABASE_URL=f"sqlite:///{folder}/bench.sqlite3",
        CELERY_BROKER_URL="memory://",
        DJANGO_SETTINGS_MODULE="workbench.settings",
        REPOSITORY_PLAIN_HOSTS="127.0.0.1",
        EGRESS_HARNESS_URL="",
        REPOSITORY_CACHE_DIR=str(folder / "cache"),
    )
    import django

    django.setup()
    from django.test import override_settings

    from sandboxes import mirrors
    from sandboxes.repositories import checkout_repositories, prepare_checkout, repository_archive

    daemon = None
    try:
        say(f"generating a repository of {args.files} files and {args.commits} commits ...")
        work, served = folder / "work", folder / "served" / "repo.git"
        generate(work, files=args.files, commits=args.commits)
        subprocess.run(["git", "clone", "-q", "--bare", str(work), str(served)], check=True)
        subprocess.run(["git", "-C", str(served), "gc", "-q"], check=True)
        port = free_port()
        daemon = subprocess.Popen(
            [
                "git",
                "daemon",
                "--listen=127.0.0.1",
                f"--port={port}",
                "--reuseaddr",
                "--export-all",
                f"--base-path={served.parent}",
                str(served.parent),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"git://127.0.0.1:{port}/repo.git"
        for _ in range(100):
            if subprocess.run(["git", "ls-remote", url], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        session = "sesn_bench_clone"

        def clone(checkout: dict[str, str] | None, *, cache: bool) -> Callable[[], bytes]:
            resource = {
                "type": "github_repository",
                "url": url,
                "mount_path": "/workspace/repo",
                "checkout": checkout,
            }

            def action() -> bytes:
                with override_settings(REPOSITORY_CACHE_DIR=str(folder / "cache") if cache else ""):
                    return repository_archive(resource, session_id=session)

            return action

        def taken_prepared(checkout: dict[str, str] | None) -> float:
            """A session's take of a pool sandbox prepared (untimed) from the mirror as it is now: timed."""
            repository = {"url": url, "mount_path": "/workspace/repo", "checkout": checkout}
            pooled = PreparedSandbox()
            prepared = prepare_checkout(pooled, "pooled", repository)
            if prepared is None:
                raise RuntimeError("the mirror did not give the pool its checkout")
            errors: list[dict[str, Any]] = []
            started = time.perf_counter()
            kept = checkout_repositories(
                pooled,
                "pooled",
                [{"type": "github_repository", **repository}],
                errors.append,
                session_id=session,
                prepared=prepared,
            )
            took = (time.perf_counter() - started) * 1000
            if not kept or errors:
                raise RuntimeError(f"the prepared checkout did not stand: {errors}")
            return took

        first_fill = timed(clone(None, cache=True))
        archive_bytes = len(clone(None, cache=False)())
        cases = {
            "default checkout (depth 1)": lambda head: None,
            "commit checkout (all history)": lambda head: {"type": "commit", "sha": head},
        }
        samples: dict[tuple[str, bool], list[float]] = {
            (case, cache): [] for case in cases for cache in (False, True)
        }
        prepared: dict[str, list[float]] = {case: [] for case in cases}
        again: dict[str, list[float]] = {case: [] for case in cases}
        for n in range(args.samples):
            head = push_one_more(work, served, n)
            for case, checkout in cases.items():
                order = (False, True) if n % 2 else (True, False)
                for cache in order:
                    samples[(case, cache)].append(timed(clone(checkout(head), cache=cache)))
                again[case].append(timed(clone(checkout(head), cache=True)))
                prepared[case].append(taken_prepared(checkout(head)))
            say(
                f"sample {n + 1}/{args.samples}: "
                + ", ".join(f"{'cache' if c else 'daemon'} {s[-1]:,.0f} ms" for (_, c), s in samples.items())
                + ", cache again "
                + ", ".join(f"{s[-1]:,.0f} ms" for s in again.values())
                + ", prepared pool "
                + ", ".join(f"{s[-1]:,.0f} ms" for s in prepared.values())
            )
        rows = []
        for case in cases:
            network, cached = samples[(case, False)], samples[(case, True)]
            speedup = (pct(network, 0.5) or 0) / (pct(cached, 0.5) or 1)
            rows.append(row(f"{case}: from git daemon", network, p50_speedup=None))
            rows.append(row(f"{case}: from the cache", cached, p50_speedup=f"{speedup:.1f}x"))
            kept = (pct(network, 0.5) or 0) / (pct(again[case], 0.5) or 1)
            rows.append(
                row(f"{case}: from the cache, a state cloned before", again[case], p50_speedup=f"{kept:.1f}x")
            )
            ready = (pct(network, 0.5) or 0) / (pct(prepared[case], 0.5) or 1)
            rows.append(row(f"{case}: a prepared pool sandbox", prepared[case], p50_speedup=f"{ready:.1f}x"))
        rows.append(row("first fill of the mirror (default checkout)", [first_fill], p50_speedup=None))
        mirror = mirrors.mirror_path(url)
        machine = machine_info()
        result = {
            "benchmark": "clone",
            "quick": args.quick,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine,
            "seconds": round(time.monotonic() - began, 1),
            "note": NOTE,
            "repository": [
                {
                    "files": args.files,
                    "commits": args.commits + args.samples,
                    "served_mb": round(
                        sum(p.stat().st_size for p in served.rglob("*") if p.is_file()) / 2**20, 1
                    ),
                    "mirror_mb": round(
                        sum(p.stat().st_size for p in mirror.rglob("*") if p.is_file()) / 2**20, 1
                    ),
                    "archive_mb (default checkout)": round(archive_bytes / 2**20, 1),
                    "git": subprocess.run(
                        ["git", "--version"], capture_output=True, text=True
                    ).stdout.split()[-1],
                }
            ],
            "rows": rows,
        }
        title = f"bench/clone: {args.files} files, on {machine['nproc']} CPUs, {result['at']}"
        publish(stem("clone", args.quick), result, lambda png: plot(rows, png, title))
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    run(main)
