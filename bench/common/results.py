"""The figures a benchmark prints and saves: percentiles, its progress lines, and its results: JSON and plot
under bench/results/, printed as bench/report.py renders them into bench/README.md."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from bench.common import ROOT

# BENCH_RESULTS_DIR: elsewhere (a test running a benchmark small leaves the checkout's results alone).
RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR") or ROOT / "bench" / "results")


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value with at least `fraction` of the values at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def pct(values: list[float], fraction: float) -> float | None:
    """The percentile to 0.1, or None without values."""
    return round(percentile(values, fraction), 1) if values else None


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def stem(name: str, quick: bool) -> str:
    """The results' file name: a --quick run's beside, not over, a full run's."""
    return f"{name}-quick" if quick else name


def say_targets(met: int, total: int) -> None:
    say("")
    say(
        f"targets met: {met} of {total}"
        + ("" if met == total else " (a benchmark reports; exit status stays 0)")
    )


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: Path, title: str) -> None:
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot().close(figure)


def publish(name: str, result: dict[str, Any], draw: Callable[[Path], None]) -> Path:
    """Print the results as bench/report.py renders them for the README (its "table", kept in the JSON), then
    write bench/results/<name>.json and <name>.png drawn by `draw`; the JSON's path."""
    from bench import report

    lines, met, total = report.render(result["benchmark"], json.loads(json.dumps(result)))
    result["table"] = "\n".join(lines).rstrip()
    say("")
    say(result["table"])
    if total:
        say_targets(met, total)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    draw(path.with_suffix(".png"))
    took = f" ({result['seconds']:.0f} s)" if "seconds" in result else ""
    say(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} and {name}.png{took}")
    return path


def run(main: Callable[[], int]) -> NoReturn:
    """A benchmark's entry point: SIGTERM stops it as Ctrl-C does, so that its teardown removes the private
    services, processes and containers."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
