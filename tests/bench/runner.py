"""Running a benchmark's small version from a test: its own PostgreSQL, Redis and deployment label, its
results written to the test's folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT


def run_bench(results: Path, name: str, *arguments: str, timeout: float = 400) -> tuple[dict[str, Any], str]:
    """`python -m bench.<name> --quick <arguments>`, which must exit 0: its JSON results and the tail of its
    output (for assertion messages)."""
    env = {**os.environ, "BENCH_RESULTS_DIR": str(results), "PYTHONPATH": str(ROOT)}
    env.setdefault("SECRET_KEY", "x" * 50)
    for inherited in ("DATABASE_URL", "REDIS_URL", "WORKBENCH_DEPLOYMENT"):
        env.pop(inherited, None)  # its own PostgreSQL and Redis, so its own deployment label
    run = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--quick", *arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, output
    return json.loads((results / f"{name}-quick.json").read_text()), output
