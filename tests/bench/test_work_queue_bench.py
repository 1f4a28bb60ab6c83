"""bench/work_queue.py measures against a live server, the SDK's own poller and worker, a Celery brain and the
Docker provider: with tiny counts (timings are not judged here), every case and side holds its samples, the
parts of a poll-to-ack add up to its whole, and its results are written with the table bench/README.md
shows, a line per measurement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from bench import work_queue
from bench.common import results
from bench.common.processes import Processes
from tests.conftest import child_env, require

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.server]

TINY = work_queue.Plan(waiting=2, random=1, turns=2, warmup=1)


def test_the_work_queue_benchmark_times_both_cases_and_both_sides_and_writes_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, offline_model: Any, docker_engine: Any
):
    require(
        bool(docker_engine.images.list(name=settings.SANDBOX_IMAGE)),
        f"no image {settings.SANDBOX_IMAGE}: scripts/build-image.sh builds it",
    )
    monkeypatch.setattr(work_queue, "RANDOM_DELAY_S", (0.0, 0.2))
    env = child_env(ANTHROPIC_BASE_URL=offline_model.base_url, ANTHROPIC_API_KEY="", REDIS_URL=redis_url)
    lines: list[str] = []
    with Processes(tmp_path, env) as processes, work_queue.rig(processes, tmp_path) as rig:
        poll = work_queue.measure_poll(rig, TINY, progress=lines.append)
        turns = work_queue.measure_turns(rig, TINY, progress=lines.append)
    assert not docker_engine.containers.list(all=True, filters={"label": "workbench.deployment=bench-work"})

    assert [(r["case"], r["n"]) for r in poll] == [("while a poll waits", 2), ("at a random moment", 1)]
    for r in poll:
        for part in ("total", "ensure", "to_poll", "to_ack"):
            assert len(r[part]["samples_ms"]) == r["n"] and r[part]["p50_ms"] <= r[part]["p95_ms"]
        assert all(v > 0 for v in r["total"]["samples_ms"])
        for i, total in enumerate(r["total"]["samples_ms"]):
            added = sum(r[part]["samples_ms"][i] for part in ("ensure", "to_poll", "to_ack"))
            assert added == pytest.approx(total, abs=0.05)
    assert [r["measurement"].split(":")[0] for r in turns] == ["bash tool round trip", "whole turn"]
    for r in turns:
        for side in ("worker", "docker"):
            assert len(r[side]["samples_ms"]) == TINY.turns and all(v > 0 for v in r[side]["samples_ms"])
        assert r["ratio_p50"] == pytest.approx(r["worker"]["p50_ms"] / r["docker"]["p50_ms"], abs=0.01)
    assert len(lines) == 3

    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    result = work_queue.result_of(poll, turns, TINY, machine={}, quick=True, seconds=1.0)
    path = results.publish("work_queue-quick", result, lambda png: work_queue.plot(result, png, "test"))

    assert path.with_suffix(".png").stat().st_size > 0
    table = json.loads(path.read_text())["table"].splitlines()
    headers = [line for line in table if line.startswith(("| poll-to-ack", "| /bash"))]
    assert len(headers) == 2 and "SDK worker p50 / p95 ms" in headers[1]
    poll_lines = [line for line in table if line.startswith(("| queued", "| ↳"))]
    assert len(poll_lines) == 8 and all(line.count("|") == headers[0].count("|") for line in poll_lines)
    turn_lines = [line for line in table if line.startswith(("| bash", "| whole"))]
    assert len(turn_lines) == 2 and all(line.count("|") == headers[1].count("|") for line in turn_lines)
    assert all(line.rstrip(" |").endswith("x") for line in turn_lines)
