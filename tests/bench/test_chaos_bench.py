"""bench/chaos.py, small: sessions of scripted /bash steps while pool processes, whole workers and sandbox
containers are killed at random, on the benchmark's own PostgreSQL, Redis, Celery workers and beat. The audit
is the test: no step lost or run twice, no session stuck or parked, every fault's session going on after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, require
from tests.faults.conftest import _docker_available


def test_a_small_chaos_run_loses_nothing_doubles_nothing_and_leaves_no_session_stuck(tmp_path: Path) -> None:
    require(
        _docker_available(), "no Docker engine with the sandbox image; `make test` starts and builds them"
    )
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for inherited in ("DATABASE_URL", "REDIS_URL", "WORKBENCH_DEPLOYMENT"):
        env.pop(inherited, None)  # its own PostgreSQL and Redis, so its own deployment label
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.chaos",
            "--quick",
            "--sessions",
            "6",
            "--steps",
            "3",
            "--seconds",
            "25",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    output = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, output
    result = json.loads((tmp_path / "chaos-quick.json").read_text())
    audit = {row["audit"]: row["n"] for row in result["audit"]}
    assert audit["steps scripted"] == 18
    assert audit["steps done"] + audit["steps closed as errors"] == 18, output
    for broken in ("lost", "doubled", "sessions parked", "sessions stuck", "sessions with other problems"):
        assert audit[broken] == 0, f"{broken}: {result['sessions_with_problems']}"
    kinds = {row["fault"]: row["n"] for row in result["faults_by_kind"]}
    assert sum(kinds.values()) >= 3, f"too few faults to mean anything: {kinds}"
    assert (tmp_path / "chaos-quick.png").stat().st_size > 0
