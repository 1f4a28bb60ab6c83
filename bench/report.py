"""Writes bench/README.md from the JSON every benchmark saved under bench/results/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    keys = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for row in rows]
    return lines


def main() -> None:
    out = ["# Benchmark results", "", "Written by `make bench` (bench/report.py) from `bench/results/*.json`.", ""]
    for path in sorted(RESULTS.glob("*.json")):
        if "quick" in path.stem:
            continue
        data = json.loads(path.read_text())
        out += [f"## {path.stem}", ""]
        machine = data.get("machine")
        if machine:
            out += [f"Machine: {json.dumps({k: v for k, v in machine.items() if not isinstance(v, dict)})}", ""]
        for key, value in data.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                out += [f"**{key}**", "", *_table(value), ""]
        png = path.with_suffix(".png")
        if png.exists():
            out += [f"![{path.stem}](results/{png.name})", ""]
    (RESULTS.parent / "README.md").write_text("\n".join(out) + "\n")
    print(f"wrote {RESULTS.parent / 'README.md'}")


if __name__ == "__main__":
    main()
