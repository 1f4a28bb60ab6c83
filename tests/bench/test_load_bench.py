"""bench/load.py, small: a few sessions at two concurrency levels and a hundred idle streams, on the benchmark's
own PostgreSQL, Redis, Daphne, Celery worker and beat. The test is that nothing failed and every stream got
every event of its session exactly once and in order (the bench audits each stream against the log); timings
are the benchmark's to print, not the test's to judge."""

from __future__ import annotations

from pathlib import Path

from tests.bench.runner import run_bench


def test_a_small_load_run_streams_every_event_once_in_order_and_fails_nothing(tmp_path: Path) -> None:
    result, output = run_bench(tmp_path, "load")
    assert result["errors"] == 0, output
    levels = result["detail"]["levels"]
    assert [row["sessions"] for row in levels] == list(result["plan"]["levels"])
    for row in levels:
        assert row["errors"] == {}, row
        assert row["turns"] == row["sessions"] * result["plan"]["turns"], row
        # Every event the log holds for these sessions came down their streams, none twice (else errors).
        assert row["events_streamed"] == row["events_written"] > row["turns"], row
        for number in ("events_per_s", "append_to_stream_p95_ms", "turn_p95_ms", "worker_cpu_ms_per_turn"):
            assert isinstance(row[number], (int, float)) and row[number] > 0, (number, row)
    idle = result["detail"]["idle"]
    assert idle["idle_errors"] == {} and idle["streams"] == result["plan"]["idle"]
    assert idle["rss_after_kib"] > 0 and idle["rss_before_kib"] > 0
    for probe in idle["probes"]:
        assert probe["errors"] == {} and probe["events_streamed"] > 0, probe
    assert result["bottleneck"]["part"] in result["bottleneck"]["cores"]
    assert (tmp_path / "load-quick.png").stat().st_size > 0
