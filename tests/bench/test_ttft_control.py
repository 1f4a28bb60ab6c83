"""bench/ttft's phase 2 control: as many sessions that provision nothing ahead, interleaved with the decoupled
ones, and the share with and without provisioning ahead compared in the same seconds."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from bench import report
from bench.common import ROOT
from bench.ttft import CONTROL_MODE, DEFAULT, Run, Sample, summarise_platform


def schedule(**plan: Any) -> list[Sample]:
    run = Run.__new__(Run)  # only its plan is read
    run.plan = replace(DEFAULT, **plan)
    return run.platform_schedule()


def test_the_control_puts_one_session_between_each_two_decoupled_ones_which_stay_where_they_were():
    alone = schedule(platform_control=False)
    both = schedule()
    assert [x.mode for x in alone] == ["decoupled"] * DEFAULT.platform_sessions
    assert [x.arrival_s for x in both if x.mode == "decoupled"] == [x.arrival_s for x in alone]
    assert [x.mode for x in both] == ["decoupled", CONTROL_MODE] * DEFAULT.platform_sessions
    assert [x.arrival_s for x in both] == sorted(x.arrival_s for x in both)
    assert [x.index for x in both] == list(range(len(both)))
    first, control, second = both[:3]
    assert control.arrival_s == round((first.arrival_s + second.arrival_s) / 2, 3)


def sample(mode: str, at: float, share: float) -> Sample:
    return Sample("platform", 0, mode, False, False, at, ttft_ms=DEFAULT.model_ttft_ms + share)


def test_the_summary_says_what_provisioning_ahead_adds_overall_and_by_span():
    # The first half of the phase is slow for everyone (the machine); provisioning ahead adds 10 ms throughout.
    samples = [sample("decoupled", t, (100 if t < 50 else 30) + 10) for t in range(100)]
    samples += [sample(CONTROL_MODE, t + 0.5, 100 if t < 50 else 30) for t in range(100)]
    samples.append(Sample("platform", 0, CONTROL_MODE, False, False, 3.0, errors=["boom"]))
    summary = summarise_platform(samples, DEFAULT)
    assert summary["n"] == 100 and summary["control"]["n"] == 100
    assert summary["control"]["failed"] == 1 and summary["failed"] == 0
    assert summary["ahead_adds_p50_ms"] == pytest.approx(
        summary["platform_p50_ms"] - summary["control"]["platform_p50_ms"]
    )
    spans = summary["by_window"]
    assert len(spans) == 5
    assert [round(w["ahead_p50_ms"] - w["control_p50_ms"]) for w in spans] == [10] * 5
    assert spans[0]["control_p50_ms"] == 100 and spans[-1]["control_p50_ms"] == 30


def test_without_the_control_the_summary_is_as_before():
    summary = summarise_platform([sample("decoupled", t, 20) for t in range(10)], DEFAULT)
    assert "control" not in summary and "ahead_adds_p50_ms" not in summary
    assert summary["platform_p50_ms"] == 20


def test_the_report_shows_the_control_row_and_the_difference():
    data = json.loads((ROOT / "bench" / "results" / "ttft.json").read_text())
    before = copy.deepcopy(data)  # a run from before the control: its platform figures have none of its keys
    for key in ("control", "ahead_adds_p50_ms", "ahead_ratio_p50", "by_window"):
        before["platform"].pop(key, None)
    lines, *_ = report.render_ttft(before)
    assert not any("control" in line for line in lines)  # reads as it did
    samples = [sample("decoupled", t, 40) for t in range(100)] + [
        sample(CONTROL_MODE, t, 28) for t in range(100)
    ]
    data["platform"] = summarise_platform(samples, DEFAULT)
    text = "\n".join(report.render_ttft(data)[0])
    assert f"| {CONTROL_MODE} (control) |" in text
    assert "the share's p50 40.0 against 28.0 ms, +12.0 ms (1.43×)" in text
