"""bench/egress.py measures against the real egress proxy, its sandboxes and an MCP server: with tiny counts
(timings are not judged here), every row holds both sides' samples, and its results are written with the
table bench/README.md shows, a line per measurement with its verdict, and no secret in them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from bench import egress
from bench.common import results
from tests.conftest import children_database_url, require

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

TINY = egress.Plan(rounds=1, batch=2, mcp_calls=2, warmup=0, mcp_warmup=1)
MEASUREMENTS = [
    "sandbox HTTPS GET, keep-alive",
    "sandbox HTTPS GET, a new connection each",
    "sandbox HTTPS GET, keep-alive, placeholder substituted",
    "MCP call (harness.mcp.call_tool)",
]


def test_the_egress_benchmark_times_each_call_both_ways_and_writes_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_engine: Any
):
    require(egress.EGRESS_PYTHON.exists(), "no .venv-egress: run scripts/egress-venv.sh (make test does)")
    require(shutil.which("iptables") is not None and os.geteuid() == 0, "needs root and iptables")
    require(
        bool(docker_engine.images.list(name=settings.SANDBOX_IMAGE)),
        f"no image {settings.SANDBOX_IMAGE}: scripts/build-image.sh builds it",
    )
    lines: list[str] = []
    with egress.rig(tmp_path / "rig", database_url=children_database_url()) as rig:
        rows = egress.measure(rig, TINY, progress=lines.append)
        secret = rig.secret

    assert [r["measurement"] for r in rows] == MEASUREMENTS
    for r, n in zip(rows, [TINY.rounds * TINY.batch] * 3 + [TINY.mcp_calls], strict=True):
        assert r["n"] == n
        for side in ("direct", "proxied"):
            assert len(r[side]["samples_ms"]) == n and all(v > 0 for v in r[side]["samples_ms"])
            assert r[side]["p50_ms"] <= r[side]["p95_ms"]
        assert r["added_p50_ms"] == pytest.approx(r["proxied"]["p50_ms"] - r["direct"]["p50_ms"], abs=1e-3)
        assert r["met"] is (r["added_p50_ms"] <= egress.TARGET_ADDED_P50_MS)
    # initialize and the tool call at least, each through the door with the vault's token
    assert rows[3]["requests_per_call"].get("POST", 0) >= 2, rows[3]["requests_per_call"]
    assert len(lines) == TINY.rounds + TINY.mcp_calls

    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    result = egress.result_of(rows, TINY, machine={}, quick=True, seconds=1.0)
    path = results.publish("egress-quick", result, lambda png: egress.plot(result, png, "test"))

    assert path.with_suffix(".png").stat().st_size > 0
    saved = json.loads(path.read_text())
    assert saved["targets"]["total"] == 4
    table = saved["table"].splitlines()
    header = next(line for line in table if line.startswith("| measurement"))
    assert "added p50 ms" in header and "through the proxy p50 / p95 ms" in header
    body = [line for line in table if line.startswith(("| sandbox", "| MCP"))]
    assert [line.split("|")[1].strip() for line in body] == MEASUREMENTS
    assert all(line.count("|") == header.count("|") for line in body)
    assert all(line.rstrip(" |").endswith(("met", "**missed**")) for line in body)
    assert secret not in path.read_text()
