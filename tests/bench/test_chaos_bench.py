"""bench/chaos.py, small: sessions of scripted /bash steps while pool processes, whole workers and sandbox
containers are killed at random and Redis, PostgreSQL and Daphne are restarted in turn, on the benchmark's own
services, with an SSE and a WebSocket client on every session. The audit is the test: no step lost or run
twice, no session stuck or parked, every client saw every event once and in order after reconnecting, and
no container is left after the reaper."""

from __future__ import annotations

from pathlib import Path

from tests.bench.runner import run_bench
from tests.conftest import require
from tests.faults.conftest import _docker_available


def test_a_small_chaos_run_loses_nothing_doubles_nothing_and_leaves_no_session_stuck(tmp_path: Path) -> None:
    require(
        _docker_available(), "no Docker engine with the sandbox image; `make test` starts and builds them"
    )
    result, output = run_bench(
        tmp_path,
        "chaos",
        *("--sessions", "6", "--steps", "4", "--step-sleep", "4", "--service-every", "5", "--seconds", "30"),
    )
    audit = {row["audit"]: row["n"] for row in result["audit"]}
    assert audit["steps scripted"] == 24
    assert audit["steps done"] + audit["steps closed as errors"] == 24, output
    for broken in ("lost", "doubled", "sessions parked", "sessions stuck", "sessions with other problems"):
        assert audit[broken] == 0, f"{broken}: {result['sessions_with_problems']}"
    assert audit["clients (SSE and WebSocket)"] == 12
    for broken in (
        "clients that missed an event",
        "clients that saw an event twice",
        "clients that saw events out of order",
        "clients that saw an event unlike the log's",
    ):
        assert audit[broken] == 0, f"{broken}: {result['clients']['problems']}"
    assert result["clients"]["caught up"], result["clients"]
    assert audit["client reconnections"] > 0, "no client had to reconnect: the restarts broke nothing it held"
    assert audit["containers left after the reaper"] == 0
    kinds = {row["fault"]: row["n"] for row in result["faults_by_kind"]}
    assert sum(kinds.values()) >= 3, f"too few faults to mean anything: {kinds}"
    for service in ("Redis", "PostgreSQL", "Daphne"):
        assert kinds[f"{service} restarted"] >= 1, f"no {service} restart while sessions ran: {kinds}"
    assert (tmp_path / "chaos-quick.png").stat().st_size > 0
