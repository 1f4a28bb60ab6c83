"""bench/common/machine.py's readings of /proc/stat, and how bench/ttft and bench/report carry the host's
steal: a shared virtual machine's slowness that no process of ours is charged for."""

from __future__ import annotations

from bench.common.machine import busy, cpu_jiffies, stolen
from bench.report import stolen as stolen_text
from bench.ttft import Phase

# user, nice, system, idle, iowait, irq, softirq, steal
BEFORE = [100.0, 0.0, 50.0, 800.0, 10.0, 0.0, 0.0, 40.0]


def test_steal_is_the_share_of_the_time_the_host_took_and_counts_as_busy():
    now = [130.0, 0.0, 60.0, 850.0, 10.0, 0.0, 0.0, 90.0]  # 140 ticks: 40 ours, 50 idle, 50 stolen
    assert stolen(BEFORE, now) == round(50 / 140, 3)
    assert busy(BEFORE, now) == 1 - 50 / 140


def test_a_kernel_without_a_steal_column_reads_as_none_taken():
    assert stolen(BEFORE[:7], [x + 1 for x in BEFORE[:7]]) == 0.0


def test_this_machine_reports_a_steal_column():
    assert len(cpu_jiffies()) >= 8


def test_a_phase_says_how_much_the_host_took_and_the_report_shows_it():
    phase = Phase("platform", seconds=3.0, cpu_stolen=[0.0, 0.5, 0.1])
    summary = phase.summary()["cpu_stolen"]
    assert summary == {"mean": 0.2, "max": 0.5, "seconds_over_a_quarter": 1}
    assert stolen_text(summary) == "20 % / 50 %; 1 s"
    assert stolen_text(None) == "–"
