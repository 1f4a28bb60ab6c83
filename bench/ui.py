"""The browser UI's benchmark: opening a long session, and how fast an appended event shows in many pages.

Tail: a staff user opens a 10,000-event session (bulk-inserted) in Chromium, again and again. Measured per
open, in the page: from the navigation's start (performance.timeOrigin) to the first animation frame in
which event #9999 is inside the viewport; the server's share (the response's first byte) is kept beside it.

Append-to-visible: 20 pages (one browser, a context each, all logged in) show one live session; the bench process
appends events with `emit_event` at a steady rate, each stamped with `time.time()` in its payload just
before the append. A MutationObserver in every page records `Date.now()` when the event's node enters the
timeline (the socket brings the event with its server-rendered node, and the page inserts it). Both clocks
are this machine's wall clock, so the difference is the latency: the commit, the broadcast, the rendering,
the socket and the insertion.

While the appends run it samples the machine every half second (CPU busy, Linux's CPU pressure, time stolen
by the hypervisor, the cores Chromium's pages, its GPU and browser processes, Daphne and PostgreSQL use) and
records every slice a page had to fetch (Resource Timing), to tell a slow page from a starved machine.

Usage: .venv/bin/python -m bench.ui [--quick] [--pages N] [--rate R] [--seconds S] [--opens N]
       [--database-url URL] [--redis-url URL]

Without a database URL (or BENCH_DATABASE_URL) it starts its own PostgreSQL and Redis
(bench/common/launcher.py), and removes them at the end. It starts its own Daphne. It prints a table, writes bench/results/ui.json and
ui.png (ui-quick.* with --quick), and exits 0 whether or not the targets are met.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/ui.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common.app import event_uid, new_session  # noqa: E402
from bench.common.launcher import Launcher, service_arguments  # noqa: E402
from bench.common.machine import (  # noqa: E402
    busy,
    cpu_jiffies,
    cpu_pressure_us,
    load_average,
    machine_info,
    process_stats,
    warn_if_busy,
)
from bench.common.results import percentile, publish, pyplot, run, save_figure, say, stem  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# Background pages must not be throttled: all 20 are "open" at once, as on 20 operators' screens.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]
LONG_SESSION = 10_000
TAIL_TARGET_MS = 1000.0
APPEND_P95_TARGET_MS = 150.0
PASSWORD = "bench-operator-password"


@dataclass(frozen=True)
class Plan:
    opens: int  # times the 10,000-event session is opened
    pages: int  # pages watching the live session
    rate: float  # appended events per second
    seconds: float  # how long the appends go on
    warmup: int = 10  # appends before the measured ones (connections, caches, JIT)


# A busy agent writes a few events a second (model spans, messages, tool calls and results); the model's
# text itself streams as previews, which are not events.
DEFAULT = Plan(opens=20, pages=20, rate=5.0, seconds=30.0)
QUICK = Plan(opens=5, pages=20, rate=5.0, seconds=8.0, warmup=5)


# --- The data -------------------------------------------------------------------------------------------


def operator() -> None:
    from django.contrib.auth.models import User

    User.objects.filter(username="bench").delete()
    from kernel.models import DEFAULT_WORKSPACE_ID, Membership

    user = User.objects.create_user("bench", password=PASSWORD, is_staff=True)
    Membership.objects.create(user=user, workspace_id=DEFAULT_WORKSPACE_ID, role=Membership.Role.OPERATOR)


def long_session(length: int) -> str:
    """A session of `length` events, bulk-inserted: messages, and every tenth pair a tool call and its result."""
    from django.utils import timezone

    from sessions.models import Event, Session

    session_id = new_session()
    start = timezone.now() - timedelta(seconds=length)
    events = []
    for seq in range(length):
        call = f"sevt_bench{session_id[-8:]}{seq - seq % 10 + 3}"
        if seq % 10 == 3:
            kind, payload = (
                "agent.tool_use",
                {
                    "name": "bash",
                    "input": {"command": f"ls -la /workspace/{seq}"},
                    "evaluated_permission": "allow",
                },
            )
        elif seq % 10 == 4:
            kind, payload = (
                "agent.tool_result",
                {
                    "tool_use_id": call,
                    "is_error": False,
                    "content": [
                        {
                            "type": "text",
                            "text": "\n".join(f"line {i} of the output of call {seq - 1}" for i in range(20)),
                        }
                    ],
                },
            )
        else:
            kind = "user.message" if seq % 2 else "agent.message"
            payload = {
                "content": [
                    {
                        "type": "text",
                        "text": f"Event {seq}: a sentence or two of ordinary length, "
                        "like what a model says between tool calls.",
                    }
                ]
            }
        events.append(
            Event(
                uid=call if kind == "agent.tool_use" else event_uid(),
                session_id=session_id,
                seq=seq,
                type=kind,
                payload=payload,
                processed_at=start + timedelta(seconds=seq),
                lease_epoch=1 + seq // 2500,
            )
        )
    Event.objects.bulk_create(events, batch_size=2000)
    Session.objects.filter(id=session_id).update(next_seq=length)
    return session_id


# --- The browser ----------------------------------------------------------------------------------------


TAIL_VISIBLE = """(seq) => {
  const node = document.getElementById(`seq-${seq}`);
  if (!node) return false;
  const box = node.getBoundingClientRect();
  return box.height > 0 && box.top >= 0 && box.bottom <= innerHeight && performance.now();
}"""

OBSERVE = """() => {
  window.benchSeen = {};
  performance.setResourceTimingBufferSize(100000);
  new MutationObserver((records) => {
    const now = Date.now();
    for (const record of records) for (const node of record.addedNodes) {
      if (node.dataset?.seq !== undefined && !(node.dataset.seq in window.benchSeen)) window.benchSeen[node.dataset.seq] = now;
    }
  }).observe(document.getElementById("timeline"), { childList: true });
}"""


def log_in(browser: Any, base: str) -> dict[str, Any]:
    """Log in once through the login page; the cookies, for every context that plays an operator."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{base}/login/")
    page.fill("#id_username", "bench")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    state = context.storage_state()
    context.close()
    return state


@dataclass
class Open:
    visible_ms: float  # navigation start → the tail inside the viewport, in the page's clock
    first_byte_ms: float  # navigation start → the response's first byte (the server's part)
    wall_ms: float  # the same open timed from this process, around page.goto


def measure_opens(context: Any, base: str, session_id: str, opens: int) -> list[Open]:
    page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 860})
    url = f"{base}/sessions/{session_id}/"
    results = []
    for i in range(opens + 1):  # the first open warms the server's caches and is not counted
        page.goto("about:blank")
        began = time.perf_counter()
        page.goto(url, wait_until="commit")
        visible = page.wait_for_function(TAIL_VISIBLE, arg=LONG_SESSION - 1, polling="raf", timeout=30_000)
        wall = (time.perf_counter() - began) * 1000
        first_byte = page.evaluate("performance.getEntriesByType('navigation')[0].responseStart")
        if i:
            results.append(
                Open(visible_ms=float(visible.json_value()), first_byte_ms=float(first_byte), wall_ms=wall)
            )
            say(
                f"  open {i}/{opens}: tail visible after {results[-1].visible_ms:.0f} ms "
                f"(first byte {first_byte:.0f} ms)"
            )
    page.close()
    return results


def watch(browser: Any, state: dict[str, Any], base: str, session_id: str, pages: int) -> list[Any]:
    """`pages` operators on one session, each in a context of its own (its own connections and HTTP cache,
    as separate browsers would have: pages of one context queue on the same fragment URL's cache entry)."""
    watchers = []
    for _ in range(pages):
        page = browser.new_context(storage_state=state).new_page()
        page.set_viewport_size({"width": 1000, "height": 700})
        page.goto(f"{base}/sessions/{session_id}/")
        page.evaluate(OBSERVE)
        watchers.append(page)
    for page in watchers:
        page.wait_for_function("window.workbenchTimeline?.socket?.readyState === 1", timeout=30_000)
    return watchers


def append(session_id: str, plan: Plan) -> dict[int, float]:
    """Append at a steady rate; the payload stamp (seconds since the epoch) of each seq."""
    from sessions.services import emit_event

    stamps: dict[int, float] = {}
    count = plan.warmup + int(plan.rate * plan.seconds)
    interval = 1 / plan.rate
    began = time.perf_counter()
    for i in range(count):
        wait = began + i * interval - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        stamp = time.time()
        event = emit_event(
            session_id,
            {
                "type": "agent.message",
                "bench_appended_at": stamp,
                "content": [{"type": "text", "text": f"bench event {i}"}],
            },
        )
        stamps[event.seq] = stamp
        if (i + 1) % max(1, int(plan.rate * 2)) == 0:
            say(f"  appended {i + 1}/{count}")
    return stamps


class Sampler(threading.Thread):
    """Every half second while the appends run: how busy the machine's CPUs were, the share of time some task
    waited for one (Linux PSI), time stolen by the hypervisor, and the cores each kind of process used."""

    PERIOD = 0.5

    def __init__(self) -> None:
        super().__init__(name="bench-ui-sampler", daemon=True)
        self.rows: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.began = time.time()

    @staticmethod
    def _machine() -> tuple[list[float], float | None]:
        return cpu_jiffies(), cpu_pressure_us()

    @staticmethod
    def _processes() -> dict[str, float]:
        """CPU seconds so far by kind: chromium, postgres, redis, this process, and other Python (Daphne)."""
        tick = os.sysconf("SC_CLK_TCK")
        totals: dict[str, float] = defaultdict(float)
        for pid, comm, fields in process_stats():
            seconds = sum(int(x) for x in fields[11:13]) / tick
            if pid == os.getpid():
                kind = "this bench"
            elif comm.startswith(("chromium", "chrome")):
                kind = Sampler._chromium_kind(pid)
            elif comm.startswith("postgres"):
                kind = "postgresql"
            elif comm.startswith("redis"):
                kind = "redis"
            elif comm.startswith(("python", "daphne")):
                kind = "daphne"
            else:
                continue
            totals[kind] += seconds
        return totals

    @staticmethod
    def _chromium_kind(pid: int) -> str:
        try:
            # Chromium rewrites its children's command lines with spaces between the arguments.
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
        except OSError:
            return "chromium: other"
        kind = next((a.split(b"=", 1)[1].decode() for a in arguments if a.startswith(b"--type=")), "browser")
        return {
            "renderer": "chromium: pages",
            "gpu-process": "chromium: gpu",
            "browser": "chromium: browser",
        }.get(kind, "chromium: other")

    def run(self) -> None:
        before, waited = self._machine()
        processes = self._processes()
        while not self.stopping.wait(self.PERIOD):
            now, now_waited = self._machine()
            now_processes = self._processes()
            elapsed = sum(now) - sum(before)  # jiffies of all CPUs
            cores = len(os.sched_getaffinity(0))
            if elapsed > 0:
                steal = now[7] - before[7] if len(now) > 7 else 0.0
                seconds = elapsed / os.sysconf("SC_CLK_TCK") / cores
                self.rows.append(
                    {
                        "t": round(time.time() - self.began, 2),
                        "busy": round(busy(before, now), 3),
                        "steal": round(steal / elapsed, 3),
                        "pressure": None
                        if waited is None or now_waited is None
                        else round((now_waited - waited) / 1e6 / seconds, 3),
                        "cores": {
                            kind: round((now_processes.get(kind, 0) - processes.get(kind, 0)) / seconds, 2)
                            for kind in now_processes
                        },
                    }
                )
            before, waited, processes = now, now_waited, now_processes

    def stop(self) -> list[dict[str, Any]]:
        self.stopping.set()
        self.join()
        return self.rows


FETCHES = """(url) => performance.getEntriesByType("resource")
  .filter((entry) => entry.name.includes(url)).map((entry) => performance.timeOrigin + entry.startTime)"""


def slice_fetches(pages: list[Any], since: float) -> list[float]:
    """When (seconds after `since`) each page asked the server for a slice of events: the socket brought
    every live event's node, so each is a catch-up run the page had to fetch."""
    times = []
    for page in pages:
        url = page.evaluate("document.getElementById('timeline-view').dataset.eventsUrl")
        times += [stamp / 1000 - since for stamp in page.evaluate(FETCHES, url) if stamp / 1000 >= since]
    return sorted(round(t, 2) for t in times)


def collect(
    pages: list[Any], stamps: dict[int, float], warmup: int
) -> tuple[list[float], int, list[float], list[list[float]]]:
    """Latencies in ms of every measured (page, seq), how many never showed, each page's p95, and per
    measured event (in append order) its seconds into the run, median and slowest page's latency."""
    measured = sorted(stamps)[warmup:]
    deadline = time.monotonic() + 15
    seen_by_page = []
    for page in pages:
        while True:
            seen = {int(k): v for k, v in page.evaluate("window.benchSeen").items()}
            if all(seq in seen for seq in measured) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        seen_by_page.append(seen)
    latencies, missing, page_p95 = [], 0, []
    for seen in seen_by_page:
        mine = [seen[seq] - stamps[seq] * 1000 for seq in measured if seq in seen]
        missing += sum(1 for seq in measured if seq not in seen)
        latencies += mine
        if mine:
            page_p95.append(percentile(mine, 0.95))
    timeline = []
    for seq in measured:
        shown = [seen[seq] - stamps[seq] * 1000 for seen in seen_by_page if seq in seen]
        if shown:
            timeline.append(
                [
                    round(stamps[seq] - stamps[measured[0]], 3),
                    round(percentile(shown, 0.5), 1),
                    round(max(shown), 1),
                ]
            )
    return latencies, missing, page_p95, timeline


# --- The report -----------------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 0.5), 1),
        "p95_ms": round(percentile(values, 0.95), 1),
        "max_ms": round(max(values), 1),
        "n": len(values),
    }


def plot(
    path: Path,
    opens: list[Open],
    latencies: list[float],
    timeline: list[list[float]],
    plan: Plan,
    title: str,
    machine_load: list[dict[str, Any]],
    fetches: list[float],
) -> None:
    plt = pyplot()
    axes = plt.figure(figsize=(17, 7.5)).subplot_mosaic(
        [["open", "spread", "late"], ["open", "spread", "load"]], height_ratios=[3, 2]
    )
    left, right, late, load = axes["open"], axes["spread"], axes["late"], axes["load"]
    figure = left.figure
    runs = range(1, len(opens) + 1)
    left.plot(runs, [o.visible_ms for o in opens], "o-", color="#3b6ea8", label="tail visible (page clock)")
    left.plot(runs, [o.first_byte_ms for o in opens], "o--", color="#b0b0b0", label="first byte")
    left.axhline(TAIL_TARGET_MS, color="#a33", linewidth=0.8, linestyle=":", label="target")
    left.set_ylim(bottom=0)
    left.set_xlabel("open")
    left.set_ylabel("ms from navigation start")
    left.set_title(f"Opening a {LONG_SESSION:,}-event session")
    left.legend(fontsize=8)
    ordered = sorted(latencies)
    right.plot(ordered, [i / len(ordered) for i in range(1, len(ordered) + 1)], color="#3b6ea8")
    right.axvline(APPEND_P95_TARGET_MS, color="#a33", linewidth=0.8, linestyle=":", label="p95 target")
    right.axhline(0.95, color="#999", linewidth=0.6)
    right.set_xlabel("ms from the append to the node in the page")
    right.set_ylabel("fraction of (page, event)")
    right.set_title(f"{plan.pages} pages, {plan.rate:g} appends/s for {plan.seconds:g} s")
    right.legend(fontsize=8)
    late.plot(
        [t for t, _, _ in timeline],
        [m for _, m, _ in timeline],
        ".",
        color="#3b6ea8",
        markersize=3,
        label="median of the pages",
    )
    late.plot(
        [t for t, _, _ in timeline],
        [x for _, _, x in timeline],
        ".",
        color="#d08030",
        markersize=3,
        label="slowest page",
    )
    late.axhline(APPEND_P95_TARGET_MS, color="#a33", linewidth=0.8, linestyle=":", label="p95 target")
    late.set_yscale("log")
    late.set_xlabel("s into the append run")
    late.set_ylabel("ms from the append to the node")
    late.set_title("Each event over the run")
    late.legend(fontsize=8)
    if fetches:
        late.plot(
            fetches,
            [late.get_ylim()[0] * 1.2] * len(fetches),
            "|",
            color="#a33",
            markersize=8,
            label="a page fetched a slice",
        )
        late.legend(fontsize=8)
    times = [row["t"] for row in machine_load]
    for kind, colour in (
        ("chromium: pages", "#3b6ea8"),
        ("chromium: gpu", "#7fa6d6"),
        ("chromium: browser", "#9b59b6"),
        ("daphne", "#d08030"),
        ("postgresql", "#6a9a4a"),
    ):
        load.plot(
            times,
            [row["cores"].get(kind, 0) for row in machine_load],
            color=colour,
            linewidth=1,
            label=f"{kind} (cores)",
        )
    load.plot(
        times,
        [len(os.sched_getaffinity(0)) * row["busy"] for row in machine_load],
        color="black",
        linewidth=0.8,
        linestyle="--",
        label="all busy (cores)",
    )
    if any(row["pressure"] is not None for row in machine_load):
        load.plot(
            times,
            [row["pressure"] or 0 for row in machine_load],
            color="#a33",
            linewidth=0.8,
            label="CPU pressure (share waiting)",
        )
    load.set_xlim(late.get_xlim())
    load.set_xlabel("s into the append run")
    load.set_title("The machine meanwhile")
    load.legend(fontsize=7, ncol=2)
    save_figure(figure, path, title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer opens, a short append run")
    parser.add_argument("--pages", type=int, help="pages watching the live session (default 20)")
    parser.add_argument("--rate", type=float, help="appends per second (default 5)")
    parser.add_argument("--seconds", type=float, help="how long the appends go on")
    parser.add_argument("--opens", type=int, help="times the long session is opened")
    service_arguments(parser)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else DEFAULT
    plan = Plan(
        opens=args.opens or plan.opens,
        pages=args.pages or plan.pages,
        rate=args.rate or plan.rate,
        seconds=args.seconds or plan.seconds,
        warmup=plan.warmup,
    )
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"bench/ui: no Chromium at {CHROMIUM} (apt-get install chromium)")
    began = time.monotonic()

    with Launcher("ui", database_url=args.database_url, redis_url=args.redis_url) as system:
        system.start_services()
        from django.db import connections
        from playwright.sync_api import sync_playwright

        machine = machine_info()
        warn_if_busy(machine)
        operator()
        say(f"inserting a {LONG_SESSION:,}-event session")
        long_id = long_session(LONG_SESSION)
        live_id = new_session()
        connections.close_all()
        base = system.processes.daphne()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            state = log_in(browser, base)
            say(f"opening the {LONG_SESSION:,}-event session {plan.opens} times")
            opens = measure_opens(browser.new_context(storage_state=state), base, long_id, plan.opens)
            say(f"opening {plan.pages} pages, each in its own browser context, on a live session")
            pages = watch(browser, state, base, live_id, plan.pages)
            say(f"appending {plan.warmup} + {int(plan.rate * plan.seconds)} events at {plan.rate:g}/s")
            # emit_event is synchronous ORM code; Playwright's loop in this thread is not the caller's.
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
            sampler = Sampler()
            sampler.start()
            stamps = append(live_id, plan)
            latencies, missing, page_p95, timeline = collect(pages, stamps, plan.warmup)
            machine_load = sampler.stop()
            first = stamps[sorted(stamps)[plan.warmup]]
            fetches = slice_fetches(pages, first)
            for row in machine_load:  # the same clock as the timeline: seconds from the first measured append
                row["t"] = round(row["t"] + sampler.began - first, 2)
            browser.close()
        machine["load_average_at_end"] = load_average()

    if not latencies:
        raise SystemExit("bench/ui: no page showed any appended event")
    tail = summary([o.visible_ms for o in opens])
    first_byte = summary([o.first_byte_ms for o in opens])
    appended = summary(latencies)
    rows = [
        {
            "measure": f"open a {LONG_SESSION:,}-event session → tail visible",
            **tail,
            "target": f"≤ {TAIL_TARGET_MS:.0f} ms",
            "met": tail["p95_ms"] <= TAIL_TARGET_MS,
        },
        {"measure": "  of which: the page's first byte", **first_byte, "target": "", "met": True},
        {
            "measure": f"append → visible in {plan.pages} pages",
            **appended,
            "target": f"p95 ≤ {APPEND_P95_TARGET_MS:.0f} ms",
            "met": appended["p95_ms"] <= APPEND_P95_TARGET_MS,
        },
    ]
    met = sum(1 for row in rows if row["target"] and row["met"])
    result = {
        "benchmark": "ui",
        "quick": args.quick,
        "machine": machine,
        "plan": asdict(plan),
        "seconds": round(time.monotonic() - began, 1),
        "results": rows,
        "opens": [asdict(o) for o in opens],
        "append_missing": missing,
        "append_page_p95_ms": [round(p, 1) for p in page_p95],
        "append_timeline": {"columns": ["s_into_run", "median_ms", "slowest_page_ms"], "rows": timeline},
        "slice_fetches_s_into_run": fetches,
        "machine_load": machine_load,
        "targets": {"met": met, "total": 2},
    }
    title = f"bench/ui on {machine['nproc']} CPUs, Chromium, one Daphne, {machine['date']}"
    publish(
        stem("ui", args.quick),
        result,
        lambda png: plot(png, opens, latencies, timeline, plan, title, machine_load, fetches),
    )
    return 0


if __name__ == "__main__":
    run(main)
