"""Writes bench/README.md from the JSON each benchmark saved under bench/results/.

Usage: .venv/bin/python bench/report.py [--quick]

Each benchmark gets a section: its targets beside the measured figures, how it was run, the machine it ran on
and its plot. Benchmarks this file knows (log, harness, sandboxes, work_queue, ui, ttft, api, egress) are
rendered from their own structure; any other `bench/results/<name>.json` is rendered from its lists of rows. A full run's
results are used when present, a `--quick` run's otherwise (and first with --quick); a section says which. A
`<benchmark>-<variant>.json` (e.g. `sandboxes-overlay2`: a run kept beside the main one for a comparison the
README makes) is rendered as its benchmark's, after it.

The same renderers print a benchmark's figures when it ends (`render`, through bench/common/results.py), so
the terminal and the README show one table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
ORDER = ("log", "harness", "chaos", "sandboxes", "workqueue", "work_queue", "ui", "ttft", "api", "egress")
TITLES = {
    "log": "The session log: appends and slice reads (bench/log.py)",
    "harness": "The brain: resume after SIGKILL, overhead per model call (bench/harness.py)",
    "chaos": (
        "Chaos: sessions of /bash steps while brains, sandboxes, Redis, PostgreSQL and Daphne fail, with SSE and "
        "WebSocket clients on every session, audited (bench/chaos.py)"
    ),
    "sandboxes": "Sandboxes: provisioning and tool-call round trips (bench/sandboxes.py)",
    "ui": "The browser UI: opening a long session, live appends in many pages (bench/ui.py)",
    "ttft": "Time to first token: coupled vs decoupled sandboxes (bench/ttft.py)",
    "api": "The /v1 request path through the official SDK, side by side by code version (bench/api.py)",
    "work_queue": (
        "The self-hosted work queue: poll-to-ack, a bash tool round trip through the SDK's worker vs Docker "
        "(bench/work_queue.py)"
    ),
    "egress": (
        "The egress proxy: the latency it adds to a sandbox's HTTPS request and an MCP call (bench/egress.py)"
    ),
}


# --- Small helpers ----------------------------------------------------------------------------------------

FIGURE = re.compile(r"–|[-+]?[\d,]*\.?\d+(%|x| ms| s)?( \(\d+\))?")


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table, its columns padded so that it reads as a table in a terminal too."""

    def cell(value: Any) -> str:
        return "–" if value is None or value == "" else str(value).replace("|", "\\|")

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(3, len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]
    # Columns of figures are right-aligned, here and where the Markdown is shown.
    right = [bool(body) and all(FIGURE.fullmatch(row[i]) for row in body) for i in range(len(header))]

    def line(values: list[str]) -> str:
        padded = (v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|" + "|".join("-" * (w + 1) + (":" if r else "-") for w, r in zip(widths, right, strict=True)) + "|"
    )
    return [line(header), rule, *map(line, body), ""]


def verdict(met: bool | None) -> str:
    return "–" if met is None else ("met" if met else "**missed**")


def commits(stats: dict[str, Any] | None) -> str:
    """The engine's btrfs transaction commits in a phase (bench/ttft), or a dash where none was read."""
    if not stats or not stats.get("n"):
        return "–"
    return f"{stats['n']}, {stats['ms']:,} ms, {num(stats.get('longest_seen_ms'), 0)} ms"


def stolen(stats: dict[str, Any] | None) -> str:
    """The CPU time the hypervisor took in a phase (bench/ttft), or a dash where it was not read."""
    if not stats or stats.get("mean") is None:
        return "–"
    return f"{100 * stats['mean']:.0f} % / {100 * stats['max']:.0f} %; {stats['seconds_over_a_quarter']} s"


def num(value: float | None, digits: int = 1) -> str | None:
    return None if value is None else f"{value:,.{digits}f}"


def median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def machine_line(machine: dict[str, Any], when: str | None = None) -> str:
    cpus = machine.get("nproc") or machine.get("cpus")
    parts = [f"{cpus} CPUs" + (f" ({machine['cpu']})" if machine.get("cpu") else "")]
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']} GiB")
    parts.append(f"Linux {machine.get('kernel', '?')}, Python {machine.get('python', '?')}")
    postgres = machine.get("postgresql")
    if isinstance(postgres, dict) and postgres.get("server_version"):
        parts.append(f"PostgreSQL {postgres['server_version']} (fsync {postgres.get('fsync', '?')})")
    if machine.get("docker"):
        storage = f" on {machine['docker_storage']}" if machine.get("docker_storage") else ""
        weight = machine.get("docker_cpu_weight")
        weight_note = f", CPU weight {weight:g} (a process's: 100)" if weight is not None else ""
        parts.append(f"Docker {machine['docker']}{storage}{weight_note}")
    load = machine.get("load_average_at_start")
    if load:
        parts.append(
            f"load average {load[0]} at the start"
            + (
                f", {machine['load_average_at_end'][0]} at the end"
                if machine.get("load_average_at_end")
                else ""
            )
        )
    date = when or machine.get("date")
    return "Ran " + (f"{date} " if date else "") + "on " + "; ".join(parts) + "."


# --- One renderer per benchmark -----------------------------------------------------------------------------
# Each returns (lines of Markdown, targets met, targets in all).


def render_log(data: dict[str, Any]) -> tuple[list[str], int, int]:
    plan = data.get("plan", {})
    out = [
        f"{plan.get('rounds', '?')} rounds of {plan.get('duration', '?')} s per side and case; writers are "
        "separate processes; the raw side is the same SQL on a bare psycopg loop.",
        "",
    ]
    out += md_table(
        [
            "append case",
            "emit_event / s",
            "raw psycopg / s",
            "emit / raw",
            "target",
            "result",
            "CPU µs / event, emit / raw",
        ],
        [
            [
                a["case"],
                num(a["emit_median"], 0),
                num(a["raw_median"], 0),
                f"{a['ratio']:.0%}",
                a["target"],
                verdict(a["met"]),
                f"{num(median(a.get('emit_writer_cpu_us_per_event')), 0)} / "
                f"{num(median(a.get('raw_writer_cpu_us_per_event')), 0)}",
            ]
            for a in data.get("appends", [])
        ],
    )
    out += md_table(
        ["slice read (100 events)", "p50 ms", "p95 ms", "target", "result"],
        [
            [
                f"{s['size']:,} events, " + ("[s:s+100] at random s" if s["kind"] == "random" else "[-100:]"),
                num(s["p50_ms"], 2),
                num(s["p95_ms"], 2),
                s["target"],
                verdict(s["met"]),
            ]
            for s in data.get("slices", [])
        ],
    )
    flat = data.get("flat")
    if flat:
        out += [
            f"Flat from {flat['from']:,} to {flat['to']:,} events (random reads, p50): {flat['p50_from_ms']:.2f} → "
            f"{flat['p50_to_ms']:.2f} ms, limit {flat['limit_ms']:.2f} ms ({flat['rule']}): {verdict(flat['met'])}.",
            "",
        ]
    targets = data.get("targets", {})
    return out, targets.get("met", 0), targets.get("total", 0)


def render_harness(data: dict[str, Any]) -> tuple[list[str], int, int]:
    settings, plan = data.get("settings", {}), data.get("plan", {})
    out = [
        f"{plan.get('kills', '?')} SIGKILLs of a streaming turn's brain (its pool process, or its whole worker and "
        "a new one started at once, taking turns) with "
        f"LEASE_SECONDS={settings.get('lease_seconds', '?')}, SWEEP_SECONDS={settings.get('sweep_seconds', '?')}; "
        f"{plan.get('calls', '?')} timed model calls per answer against the offline model with no time to first "
        "token (the judged 500-word answers stream at 500 tokens/s, the others all at once).",
        "",
    ]
    out += md_table(
        ["metric", "n", "p50", "p95", "unit", "target", "result"],
        [
            [
                r["metric"].replace("  ", "↳ ", 1) if r["metric"].startswith("  ") else r["metric"],
                r["n"],
                r["p50"],
                r["p95"],
                r["unit"],
                r["target"],
                r["result"].replace("MISSED", "**missed**"),
            ]
            for r in data.get("summary", [])
        ],
    )
    samples = data.get("samples", {})
    completed = samples.get("resumed_turn_completed")
    if completed:
        out += [f"Resumed turns that went on to finish idle: {sum(completed)} of {len(completed)}.", ""]
    targets = data.get("targets", {})
    return out, targets.get("met", 0), targets.get("total", 0)


def render_sandboxes(data: dict[str, Any]) -> tuple[list[str], int, int]:
    rows, met, total = [], 0, 0
    for r in data.get("rows", []):
        target = r.get("target_p50_ms")
        ok = None if target is None else r["p50_ms"] <= target
        if ok is not None:
            met, total = met + ok, total + 1
        rows.append(
            [
                r["name"],
                len(r.get("samples_ms", [])),
                num(r["p50_ms"]),
                num(r["p95_ms"]),
                f"p50 ≤ {target:g} ms" if target is not None else None,
                verdict(ok),
            ]
        )
    by_name = {r["name"]: r for r in data.get("rows", [])}
    raw, execute = (
        by_name.get("docker: raw docker exec (echo hi)"),
        by_name.get("docker: execute bash (echo hi)"),
    )
    out = md_table(["measurement", "n", "p50 ms", "p95 ms", "target", "result"], rows)
    before = "docker, before toolbox images (the toolbox copied in at each start)"
    for what in ("cold provision", "machine CPU per sandbox (provision, one call, terminate)"):
        new, old = by_name.get(f"docker: {what}"), by_name.get(f"{before}: {what}")
        if new and old:
            out += [
                f"{what}, from the toolbox image over copying the toolbox in, ratio of p50s (samples taken in "
                f"turn): {new['p50_ms'] / old['p50_ms']:.2f}.",
                "",
            ]
    if raw and execute:
        out += [
            f"`execute` over a raw `docker exec`, ratio of p50s: {execute['p50_ms'] / raw['p50_ms']:.2f}.",
            "",
        ]
    return out, met, total


def render_ttft(data: dict[str, Any]) -> tuple[list[str], int, int]:
    plan, settings, phases = data["plan"], data["settings"], data.get("phases", {})
    repo, rows, platform = settings["repository"], data["summary"], data.get("platform") or {}
    out = [
        f"**Phase 1** — {plan['per_mode']} sessions per mode (after {plan['warmup']} warm-up each), the {len(rows)} modes "
        f"interleaved round-robin at Poisson arrivals of {plan['rate']:g}/s. Every session's environment clones a "
        f"repository of {repo['files']:,} files ({repo['tree_mb']} MB of tree, {repo['commits']} commits) served by "
        f"`git daemon` on loopback, into {plan.get('provider', 'docker')} sandboxes: *coupled* before the first model call (`provisioning: eager`), *decoupled* "
        "beside the first model request (lazy, provisioned ahead; at the first tool call before that existed), "
        f"*decoupled+pool* likewise with a warm pool of {plan['warm_pool']}"
        + (", *decoupled, not ahead* at the first tool call (`speculative: never`)" if len(rows) > 3 else "")
        + ". TTFT runs "
        "from the POST of a plain-text user message to the first `event_delta` on the client's SSE stream. The "
        f"offline model's fixed TTFT is {plan['model_ttft_ms']:g} ms ({plan['model_tps']:g} tokens/s); *platform* "
        f"= TTFT − that. Meanwhile {plan['background']} background sessions ran agent turns (thinking, `bash` in "
        "their own sandboxes and clones).",
        "",
    ]
    out += md_table(
        [
            "mode",
            "n",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "model ms",
            "platform p50",
            "platform p95",
            "p50 reduction",
            "p95 reduction",
            "p99 reduction",
            "first tool result p50 / p95 ms (n)",
            "× coupled p50",
            "two-message exchange p50 / p95 ms",
        ],
        [
            [
                r["mode"],
                r["n"],
                num(r["p50_ms"], 0),
                num(r["p95_ms"], 0),
                num(r["p99_ms"], 0),
                num(r["model_ttft_ms"], 0),
                num(r["platform_p50_ms"], 0),
                num(r["platform_p95_ms"], 0),
                pct(r["p50_reduction"]),
                pct(r["p95_reduction"]),
                pct(r["p99_reduction"]),
                f"{num(r['tool_result_p50_ms'], 0) or '–'} / {num(r.get('tool_result_p95_ms'), 0) or '–'} "
                f"({r['tool_result_n']})",
                "–" if r.get("tool_result_vs_coupled") is None else f"{r['tool_result_vs_coupled']:.2f}",
                f"{num(r.get('exchange_p50_ms'), 0) or '–'} / {num(r.get('exchange_p95_ms'), 0) or '–'}",
            ]
            for r in rows
        ],
    )
    coupled = rows[0]
    if coupled.get("provision_p50_ms") is not None:
        out += [
            f"Where coupled time goes (p50): {num(coupled['to_request_p50_ms'], 0)} ms from the POST to the model "
            f"request, of which the sandbox {num(coupled['provision_p50_ms'], 0)} ms and the clone "
            f"{num(coupled['clone_p50_ms'], 0)} ms. The decoupled modes reach the model request in "
            f"{num(rows[1]['to_request_p50_ms'], 0)} / {num(rows[2]['to_request_p50_ms'], 0)} ms. The first tool "
            "result (a second message, every "
            f"{plan['tool_turn_every']}th session, sent when the first turn is idle) is where the decoupled modes pay "
            "for what of the sandbox and the clone is not done by then; the exchange runs from the first POST to the "
            "second turn's idle; "
            f"{rows[2]['pooled_first_sandboxes']} of {rows[2]['n']} decoupled+pool sessions took their sandbox from "
            f"the pool, {rows[2].get('prepared_checkouts_kept', '–')} of them with the repository checked out and kept"
            + (
                "; sandboxes started from an image holding the checkout (coupled / decoupled / not ahead): "
                + " / ".join(f"{rows[i].get('checkout_images')} of {rows[i]['n']}" for i in (0, 1, 3))
                + "."
                if len(rows) > 3 and rows[0].get("checkout_images") is not None
                else "."
            ),
            "",
        ]
    out += [
        "Decoupled and decoupled+pool, p50 from the POST: answered "
        + " / ".join(f"{num(r.get('post_p50_ms'), 0)}" for r in rows[1:])
        + " ms; then the streaming path beyond the model's TTFT "
        + " / ".join(f"{num(r.get('stream_path_p50_ms'), 0)}" for r in rows[1:])
        + " ms (the SDK, previews, Redis, Daphne, this client).",
        "",
    ]
    out += [
        "Left out above as failed (a clone or sandbox error, a tool result without the repository, a timeout): "
        + ", ".join(f"{r['mode']} {r['failed']}" for r in rows)
        + ". Kept, though their lease lapsed and the sweeper woke another brain mid-turn: "
        + ", ".join(f"{r['mode']} {r.get('recovered_sessions', '–')}" for r in rows)
        + ".",
        "",
    ]
    if platform:
        control = platform.get("control")
        out += [
            f"**Phase 2** — the platform's own share with sessions running at once: {plan['platform_sessions']} "
            f"decoupled sessions at {plan['platform_rate']:g}/s beside the same background, without phase 1's "
            "coupled clones"
            + (
                f"; and, as a control, as many *{control['mode']}*, one halfway between each two."
                if control
                else "."
            ),
            "",
        ]
        groups = [("decoupled", platform)] + ([(f"{control['mode']} (control)", control)] if control else [])
        out += md_table(
            [
                "sessions",
                "n",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "platform p50",
                "platform p95",
                "platform p99",
                "POST → committed",
                "→ brain began",
                "→ model request",
                "streaming path beyond the model",
            ],
            [
                [
                    label,
                    group["n"],
                    num(group["p50_ms"], 0),
                    num(group["p95_ms"], 0),
                    num(group["p99_ms"], 0),
                    num(group["platform_p50_ms"], 0),
                    num(group["platform_p95_ms"], 0),
                    num(group["platform_p99_ms"], 0),
                    num(group["committed_p50_ms"], 0),
                    num(group["brain_p50_ms"], 0),
                    num(group["to_request_p50_ms"], 0),
                    num(group["stream_path_p50_ms"], 0),
                ]
                for label, group in groups
            ],
        )
        out += [
            "(The last four columns are p50s in ms, the first three from the POST, by the log's own "
            "timestamps.)",
            "",
        ]
        if control and platform.get("ahead_adds_p50_ms") is not None:
            spans = platform.get("by_window") or []
            out += [
                f"Provisioning ahead, side by side with the control: the share's p50 {num(platform['platform_p50_ms'], 1)} "
                f"against {num(control['platform_p50_ms'], 1)} ms, {platform['ahead_adds_p50_ms']:+.1f} ms "
                f"({platform['ahead_ratio_p50']:.2f}×)"
                + (
                    "; by fifths of the phase (with / without, ms): "
                    + ", ".join(f"{num(w['ahead_p50_ms'], 0)} / {num(w['control_p50_ms'], 0)}" for w in spans)
                    if spans
                    else ""
                )
                + ".",
                "",
            ]
    out += md_table(
        ["target", "goal", "measured", "result"],
        [
            [
                g["target"].strip(),
                g["goal"].replace(">=", "≥").replace("<=", "≤"),
                g["measured"],
                verdict(g["met"]),
            ]
            for g in data["targets"]
        ],
    )
    labels = {"compare": "phase 1", "platform": "phase 2"}
    out += md_table(
        [
            "",
            "seconds",
            "running at once (mean; min–max)",
            "CPU pressure",
            "CPU taken by the host (steal): mean / max; seconds over 25 %",
            "model asked directly, TTFT p50 / p95",
            "load average at the end",
            "client loop lag p99",
            "btrfs commits: n, ms in all, longest seen",
            "cores used by our processes",
        ],
        [
            [
                labels.get(name, name),
                num(p["seconds"], 0),
                f"{p['running_at_once']['mean']}; {p['running_at_once']['min']}–{p['running_at_once']['max']}",
                p.get("cpu_pressure"),
                stolen(p.get("cpu_stolen")),
                f"{p['model_direct_ttft_ms']['p50']} / {p['model_direct_ttft_ms']['p95']} ms",
                ", ".join(map(str, p.get("load_average_at_end", []))),
                f"{p.get('client_loop_lag_ms', {}).get('p99')} ms",
                commits(p.get("btrfs_commits")),
                ", ".join(f"{k} {v:.2f}" for k, v in p.get("cores_used", {}).items()),
            ]
            for name, p in phases.items()
        ],
    )
    out += [
        "*CPU pressure* is the share of the time some task on the machine waited for a CPU (Linux PSI); the "
        "machine is shared, so it includes whatever else ran.",
        "",
        f"Settings: {settings['workers']}; {settings['web']}; {settings['beat']}; PostgreSQL "
        f"{settings['postgresql']}; sandboxes {settings['sandbox']}. Failed sessions: {len(data.get('failures', []))}; "
        f"background turns sent: {data.get('background', {}).get('turns_sent', '–')}.",
        "",
    ]
    previous = data.get("previous")
    if previous:
        out += [f"Reproduction — this run against the one before it ({previous['date']}):", ""]
        now = {r["mode"]: r for r in rows}
        if platform:
            now["phase 2"] = platform
        out += md_table(
            ["", "p50 ms then → now", "p95 ms then → now", "platform p50 then → now"],
            [
                [
                    mode,
                    arrow(then.get("p50_ms"), now[mode]["p50_ms"]),
                    arrow(then.get("p95_ms"), now[mode]["p95_ms"]),
                    arrow(then.get("platform_p50_ms"), now[mode]["platform_p50_ms"]),
                ]
                for mode, then in previous["modes"].items()
                if mode in now
            ],
        )
    return out, sum(g["met"] for g in data["targets"]), len(data["targets"])


def render_ui(data: dict[str, Any]) -> tuple[list[str], int, int]:
    plan = data.get("plan", {})
    out = [
        f"Chromium: a staff user opens a 10,000-event session ({plan.get('opens', '?')} opens); then "
        f"{plan.get('pages', '?')} pages show one live session while events are appended at {plan.get('rate', '?')}/s "
        f"for {plan.get('seconds', '?')} s, each timed from its append to its node in every page.",
        "",
    ]
    out += md_table(
        ["measurement", "n", "p50 ms", "p95 ms", "max ms", "target", "result"],
        [
            [
                r["measure"].replace("  of which", "↳ of which"),
                r.get("n"),
                num(r.get("p50_ms")),
                num(r.get("p95_ms")),
                num(r.get("max_ms")),
                r.get("target") if r.get("target") not in (None, "–", "") else None,
                verdict(r.get("met")) if r.get("target") not in (None, "–", "") else "–",
            ]
            for r in data.get("results", [])
        ],
    )
    if "append_missing" in data:
        slowest = max(data.get("append_page_p95_ms") or [0])
        out += [
            f"Appended events that never showed in a page: {data['append_missing']}; the slowest page's p95: "
            f"{slowest:.0f} ms.",
            "",
        ]
    load = data.get("machine_load") or []
    if load:
        kinds = sorted({kind for row in load for kind in row["cores"]})
        cores = ", ".join(
            f"{kind} {sum(row['cores'].get(kind, 0) for row in load) / len(load):.2f}" for kind in kinds
        )
        busy = sorted(row["busy"] for row in load)
        out += [
            f"During the appends: CPU busy median {busy[len(busy) // 2]:.0%}, highest {busy[-1]:.0%}; cores used "
            f"on average: {cores}; slices the pages had to fetch: {len(data.get('slice_fetches_s_into_run', []))}.",
            "",
        ]
    targets = data.get("targets", {})
    return out, targets.get("met", 0), targets.get("total", 0)


def render_api(data: dict[str, Any]) -> tuple[list[str], int, int]:
    """p50/p95 per code version and the ratio of p50s to the first; no targets (none slower is read off)."""
    labels = [v["label"] for v in data["versions"]]
    header = ["measurement", "clients", *(f"{label} p50 / p95 ms" for label in labels)]
    header += [f"this / {label} (p50)" for label in labels[1:]]
    rows = []
    for r in data["rows"]:
        cells = [
            f"{num(r['versions'][label]['p50_ms'])} / {num(r['versions'][label]['p95_ms'])}"
            for label in labels
        ]
        ratios = [f"{r['ratio_p50'][label]:.2f}x" for label in labels[1:]]
        rows.append([r["measurement"], r["clients"], *cells, *ratios])
    plan = data["plan"]
    intro = [
        f"{plan['samples']} samples per measurement and client count, in {plan['batches']} batches taking turns "
        f"over the code versions; a Celery worker ({data['worker_threads']} threads) per version runs each turn "
        f"against the offline model (TTFT {data['model_ttft_ms']} ms).",
        "",
    ]
    return intro + md_table(header, rows), 0, 0


def render_work_queue(data: dict[str, Any]) -> tuple[list[str], int, int]:
    """Poll-to-ack by case with its parts, then the tool round trip and the turn both ways; no targets."""
    plan = data["plan"]
    out = [
        f"{plan['waiting']} items queued while a poll waits and {plan['random']} at random moments; "
        f"{plan['turns']} timed turns per side (after {plan['warmup']} untimed), the sides taking turns.",
        "",
    ]
    for paragraph in data.get("method", []):
        out += [paragraph, ""]
    parts = (
        ("total", "work_ensure → ack answered"),
        ("ensure", "↳ work_ensure (commit, wake-up)"),
        ("to_poll", "↳ then → poll answered"),
        ("to_ack", "↳ then → ack answered"),
    )
    rows = [
        [
            f"queued {r['case']}: {label}" if key == "total" else label,
            r["n"],
            num(r[key]["p50_ms"]),
            num(r[key]["p95_ms"]),
            num(r[key]["max_ms"]),
        ]
        for r in data["poll"]
        for key, label in parts
    ]
    out += md_table(["poll-to-ack (SDK poller, block_ms=999)", "n", "p50 ms", "p95 ms", "max ms"], rows)
    rows = [
        [
            r["measurement"],
            r["n"],
            f"{num(r['worker']['p50_ms'])} / {num(r['worker']['p95_ms'])}",
            f"{num(r['docker']['p50_ms'])} / {num(r['docker']['p95_ms'])}",
            f"{r['ratio_p50']:.2f}x" if r.get("ratio_p50") is not None else None,
        ]
        for r in data["turns"]
    ]
    header = ["/bash echo hi", "n per side", "SDK worker p50 / p95 ms", "Docker provider p50 / p95 ms"]
    out += md_table([*header, "worker / Docker (p50)"], rows)
    return out, 0, 0


def render_egress(data: dict[str, Any]) -> tuple[list[str], int, int]:
    """Each call through the proxy beside the same call made directly; the target is on the added p50."""
    plan = data["plan"]
    out = [
        f"{plan['rounds']} rounds of {plan['batch']} HTTPS requests per side and case (after "
        f"{plan['warmup']} untimed), and {plan['mcp_calls']} MCP calls per side (after "
        f"{plan.get('mcp_warmup', 0)} untimed); the two sides take turns throughout.",
        "",
    ]
    for paragraph in data.get("method", []):
        out += [paragraph, ""]
    rows = [
        [
            r["measurement"],
            r["n"],
            f"{num(r['direct']['p50_ms'], 2)} / {num(r['direct']['p95_ms'], 2)}",
            f"{num(r['proxied']['p50_ms'], 2)} / {num(r['proxied']['p95_ms'], 2)}",
            f"{r['added_p50_ms']:+.2f}",
            f"{r['added_p95_ms']:+.2f}",
            f"{r['paired_added_p50_ms']:+.2f}",
            f"{r['ratio_p50']:.2f}x" if r.get("ratio_p50") is not None else None,
            r["target"].replace("<=", "≤"),
            verdict(r["met"]),
        ]
        for r in data["rows"]
    ]
    header = ["measurement", "n per side", "direct p50 / p95 ms", "through the proxy p50 / p95 ms"]
    header += ["added p50 ms", "added p95 ms", "added, paired ms", "proxy / direct (p50)", "target", "result"]
    out += md_table(header, rows)
    for r in data["rows"]:
        methods = r.get("requests_per_call")
        if methods:
            total = sum(methods.values())
            out += [
                f"{r['measurement']}: {total:g} HTTP requests a call through the door ("
                + ", ".join(f"{method} {n:g}" for method, n in methods.items())
                + f", by the proxy's audit rows): {r['added_p50_ms'] / total:.2f} ms added per request "
                "at p50.",
                "",
            ]
    met = sum(bool(r["met"]) for r in data["rows"])
    return out, met, len(data["rows"])


def pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.1%}"


def arrow(before: float | None, after: float | None) -> str:
    return f"{num(before, 0) or '–'} → {num(after, 0) or '–'}"


def render_generic(data: dict[str, Any]) -> tuple[list[str], int, int]:
    """A benchmark this file does not know yet: its lists of result rows as tables (long lists of samples are
    left in the JSON), numbers rounded, `met` flags as results; its own text table when it has nothing else."""

    def cell(value: Any) -> Any:
        if isinstance(value, bool):
            return verdict(value)
        return num(value) if isinstance(value, float) else value

    out, met, total = [], 0, 0
    for key, value in data.items():
        if not (isinstance(value, list) and value and isinstance(value[0], dict)) or len(value) > 30:
            continue
        columns = [k for k in value[0] if not isinstance(value[0][k], (list, dict))]
        out += [f"**{key}**", ""] + md_table(columns, [[cell(row.get(k)) for k in columns] for row in value])
        for row in value:
            result = row.get("met", row.get("result"))
            if isinstance(result, bool) or result in ("met", "MISSED", "missed"):
                met, total = met + (result is True or result == "met"), total + 1
    if not out and isinstance(data.get("table"), str):
        out = ["```", data["table"], "```", ""]
    targets = data.get("targets")
    if isinstance(targets, dict) and "met" in targets:
        met, total = targets["met"], targets["total"]
    return out, met, total


RENDERERS: dict[str, Callable[[dict[str, Any]], tuple[list[str], int, int]]] = {
    "log": render_log,
    "harness": render_harness,
    "sandboxes": render_sandboxes,
    "ui": render_ui,
    "ttft": render_ttft,
    "api": render_api,
    "egress": render_egress,
    "work_queue": render_work_queue,
}


def benchmark_of(name: str) -> tuple[str, str | None]:
    """The benchmark a result's name is of, and the variant it names after a dash (None for the main run)."""
    base, _, variant = name.partition("-")
    return (base, variant) if variant and base in RENDERERS else (name, None)


def render(name: str, data: dict[str, Any]) -> tuple[list[str], int, int]:
    """A benchmark's figures as Markdown, with its targets met and in all; a result of another shape than its
    renderer knows is still shown, by the generic one."""
    try:
        return RENDERERS.get(benchmark_of(name)[0], render_generic)(data)
    except (KeyError, TypeError, IndexError, ValueError) as error:
        body = [f"(could not render the {name} results by their known shape: {error!r})", ""]
        return body + render_generic(data)[0], 0, 0


# --- The page ---------------------------------------------------------------------------------------------


def pick(name: str, prefer_quick: bool) -> Path | None:
    full, quick = RESULTS / f"{name}.json", RESULTS / f"{name}-quick.json"
    for path in (quick, full) if prefer_quick else (full, quick):
        if path.exists():
            return path
    return None


def names() -> list[str]:
    found = {p.stem.removesuffix("-quick") for p in RESULTS.glob("*.json") if not p.stem.endswith("-partial")}
    bases = sorted(
        {benchmark_of(n)[0] for n in found},
        key=lambda n: (n not in ORDER, ORDER.index(n) if n in ORDER else 0, n),
    )
    return [n for base in bases for n in sorted(found) if benchmark_of(n)[0] == base]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="prefer the results of --quick runs")
    args = parser.parse_args(argv)
    overview, sections, machines = [], [], []
    for name in names():
        path = pick(name, args.quick)
        if path is None:
            continue
        data = json.loads(path.read_text())
        quick = data.get("quick", path.stem.endswith("-quick"))
        body, met, total = render(name, data)
        machine = data.get("machine", {})
        when = data.get("at") or machine.get("date")
        machines.append(machine)
        base, variant = benchmark_of(name)
        title = TITLES.get(base, f"{base} (bench/{base}.py)") + (
            f": the run kept as `{variant}`" if variant else ""
        )
        section = [
            f"## {title}",
            "",
            f"From `results/{path.name}`"
            + (" — a `--quick` smoke run, not the full benchmark" if quick else "")
            + ".",
            "",
        ]
        if data.get("note"):
            section += [f"> {data['note']}", ""]
        section += body
        if machine:
            section += [machine_line(machine, when), ""]
        png = path.with_suffix(".png")
        if png.exists():
            section += [f"![{name}](results/{png.name})", ""]
        sections.append(section)
        overview.append(
            [
                f"[{name}](#{anchor(title)})",
                when,
                f"{met} of {total}" if total else "–",
                "quick" if quick else "full",
            ]
        )
    out = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`scripts/bench.sh`, then `bench/report.py`) from `bench/results/*.json`; run "
        "`make bench` again to reproduce them (`make bench QUICK=1` for a smoke run). Each benchmark starts its "
        "own PostgreSQL, Redis, workers and offline model, and reports whether or not its targets are met.",
        "",
    ]
    out += md_table(["benchmark", "ran", "targets met", "run"], overview)
    richest = max(machines, key=len, default=None)
    if richest:
        out += ["The machine: " + machine_line(richest).removeprefix("Ran ").split("on ", 1)[-1], ""]
    for section in sections:
        out += section
    notes = BENCH / "why-raw-sql.md"
    if notes.exists():
        out += [notes.read_text().rstrip(), ""]
    (BENCH / "README.md").write_text("\n".join(out).rstrip() + "\n")
    print(f"wrote {BENCH / 'README.md'}")


def anchor(title: str) -> str:
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


if __name__ == "__main__":
    main()
