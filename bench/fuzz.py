"""Hostile input (issue 19, item 4): every `/v1` operation of the served OpenAPI document fuzzed by
schemathesis against a real Daphne server, and the session WebSocket fed malformed, oversized and
out-of-order frames; requests sent per operation, failures by kind (server errors must be 0), and time.

    .venv/bin/python -m bench.fuzz [--quick] [--examples 25] [--scenarios 50]

Prints a table and writes bench/results/fuzz.json and fuzz.png (fuzz-quick.* with --quick).

- **HTTP**: for each operation, schemathesis draws cases valid by the schema (positive) and cases that break it
  (negative); half of them get the ids of real rows made first (an agent, a self-hosted environment and its
  key, a session, a vault, a credential, a spare API key) in their path, so that the bodies reach the services and not only the 404.
  Every request must answer within a bound (`timeout`), never with a 5xx, and with a status, content type
  and body the document declares. Operations that delete, archive or revoke run last.
- **Stateful**: sequences of up to 10 calls along the links schemathesis infers from the document (an id one
  response returned, used in the next call's path): what one step makes, the next ones read, change, archive
  and delete. The document declares no links of its own; the inferred ones are enough.
- **No partial write**: around every refused request (4xx), the rows of every table of the platform are
  counted in this process (it shares the server's database); a refused request that changed a count is a
  `partial_write`.
- **WebSocket**: the session socket gets text that is not JSON, a binary frame, a frame of 1 MiB nested 1M
  deep, a message over Daphne's 1 MiB limit, a frame before the handshake, a close in the middle of a
  fragmented message, a continuation with no start, reserved opcodes and bits, and garbage. A well-formed
  frame must be answered ("this socket only sends") with the socket left open; a protocol violation may
  close it; either way within the bound, with no row changed, and a new socket must open afterwards.

The test suite runs the same code small (tests/api/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import struct
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/fuzz.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common.results import publish, pyplot, run, save_figure, say, stem  # noqa: E402

TIMEOUT_S = 10.0
STEPS = 10  # per stateful scenario
STREAMING = ("/events/stream", "/work/poll")
# Kinds that fail the run; the others (a negative case the server took, a status it did not document) are
# reported.
FAILING = ("server_error", "timeout", "connection", "partial_write", "schema", "content_type", "ws")
# Answers 503 by design when no egress proxy is configured (README: "mcp_oauth_validate asks the proxy").
NEEDS_EGRESS_PROXY = ("/mcp_oauth_validate",)
CLIENT_HEADERS = {
    "x-api-key",
    "user-agent",
    "accept-encoding",
    "accept",
    "connection",
    "content-type",
    "content-length",
}
DESTRUCTIVE = ("delete", "/archive", "/revoke", "/detach", "/transfer", "/stop")


@dataclass
class Operation:
    label: str
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # kind -> one request that caused it
    seconds: float = 0.0


def row_counts() -> dict[str, int]:
    """The number of rows of every table of the platform's apps, in one query."""
    from django.apps import apps
    from django.db import connection

    tables = sorted(
        {
            model._meta.db_table
            for model in apps.get_models()
            if model._meta.app_label in ("kernel", "sessions", "harness", "sandboxes", "vault")
            and model._meta.managed
        }
    )
    quote = connection.ops.quote_name
    sql = "SELECT " + ", ".join(f"(SELECT count(*) FROM {quote(t)})" for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    return dict(zip(tables, row, strict=True))


def make_rows(base_url: str, key: str) -> dict[str, str]:
    """Real rows for the path parameters, made through the API: name -> id."""
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    suffix = uuid.uuid4().hex[:8]
    with httpx.Client(base_url=base_url, headers={"x-api-key": key}, timeout=30) as http:

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = http.post(path, json=body)
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

        ids = {"agent_id": post("/v1/agents", {"name": "fuzz", "model": "claude-sonnet-5-5"})["id"]}
        ids["environment_id"] = post(
            "/v1/environments", {"name": f"fuzz-{suffix}", "config": {"type": "self_hosted"}}
        )["id"]
        ids["session_id"] = post(
            "/v1/sessions", {"agent": ids["agent_id"], "environment_id": ids["environment_id"]}
        )["id"]
        ids["vault_id"] = post("/v1/vaults", {"display_name": "fuzz"})["id"]
        credential = {
            "auth": {"type": "static_bearer", "token": "t", "mcp_server_url": "https://mcp.example"}
        }
        response = http.post(f"/v1/vaults/{ids['vault_id']}/credentials", json=credential)
        if response.status_code == 200:
            ids["credential_id"] = response.json()["id"]
        ids["api_key_id"] = post("/v1/api_keys", {"name": "fuzz-spare"})["id"]
        ids["key_id"] = post(f"/v1/environments/{ids['environment_id']}/keys", {"name": "fuzz"})["id"]
    return ids


def _request_line(case: Any) -> str:
    body = "" if case.body is None or type(case.body).__name__ == "NotSet" else f" body={case.body!r}"
    query = f" query={case.query!r}" if case.query else ""
    # Only the headers the case drew: not the run's API key, nor what the HTTP client adds.
    drawn = {k: v for k, v in (case.headers or {}).items() if k.lower() not in CLIENT_HEADERS}
    headers = f" headers={drawn!r}" if drawn else ""
    return f"{case.method.upper()} {case.formatted_path}{query}{headers}{body}"[:600]


def _kind_of(failure: Any) -> str:
    name = type(failure).__name__
    return {
        "ServerError": "server_error",
        "JsonSchemaError": "schema",
        "MalformedMediaType": "content_type",
        "UndefinedContentType": "content_type",
        "MissingContentType": "content_type",
        "UndefinedStatusCode": "undocumented_status",
        "RejectedPositiveData": "rejected_positive",
        "AcceptedNegativeData": "accepted_negative",
    }.get(name, name)


class Fuzzer:
    """Sends a case to the server and tallies what came back, by operation: a 5xx, no answer within
    `timeout`, a refused request that changed a row count, a response the document does not allow."""

    def __init__(
        self,
        base_url: str,
        key: str,
        ids: dict[str, str],
        *,
        timeout: float = TIMEOUT_S,
        counts: Callable[[], dict[str, int]] = row_counts,
    ) -> None:
        import requests
        import schemathesis
        from schemathesis.checks import (
            content_type_conformance,
            negative_data_rejection,
            positive_data_acceptance,
            response_schema_conformance,
            status_code_conformance,
        )

        self.base_url, self.ids, self.timeout, self.counts = base_url, ids, timeout, counts
        self.headers = {"x-api-key": key}
        self.http = requests.Session()
        self.schema = schemathesis.openapi.from_url(f"{base_url}/v1/openapi.json", timeout=timeout)
        self.tallies: dict[str, Operation] = {}
        # A 5xx is counted in `send`, where a 503 that needs the egress proxy is told apart.
        self.checks = [
            response_schema_conformance,
            content_type_conformance,
            status_code_conformance,
            negative_data_rejection,
            positive_data_acceptance,
        ]

    def operations(self) -> list[Any]:
        """The document's operations, those that delete, archive or revoke last."""
        found = [result.ok() for result in self.schema.get_all_operations()]
        return sorted(found, key=lambda op: any(d in f"{op.method} {op.path}" for d in DESTRUCTIVE))

    def tally(self, label: str) -> Operation:
        return self.tallies.setdefault(label, Operation(label))

    def send(self, case: Any, *, real: bool = False) -> Any:
        """Send `case` (with the ids of real rows in its path if `real`); the response, or None for a stream
        or no answer."""
        import requests
        from schemathesis.core.failures import Failure, FailureGroup

        tally = self.tally(case.operation.label)

        def record(kind: str) -> None:
            tally.failures[kind] += 1
            tally.examples.setdefault(kind, _request_line(case))

        if real:
            for name in case.path_parameters or {}:
                if name in self.ids:
                    case.path_parameters[name] = self.ids[name]
        # The document's security scheme makes schemathesis draw an x-api-key of its own: the key is this
        # run's, so that the cases reach past authentication.
        case.headers = {**(case.headers or {}), **self.headers}
        before = self.counts()
        tally.sent += 1
        began = time.monotonic()
        try:
            if case.operation.path.endswith(STREAMING):
                kwargs = case.as_transport_kwargs(base_url=self.base_url, headers=self.headers)
                with self.http.request(**kwargs, stream=True, timeout=self.timeout) as raw:
                    status = raw.status_code
                    if status >= 400:
                        raw.content  # noqa: B018 - an error is a whole body, read within the bound
                response = None
            else:
                response = case.call(
                    base_url=self.base_url, headers=self.headers, session=self.http, timeout=self.timeout
                )
                status = response.status_code
        except requests.Timeout:
            record("timeout")
            return None
        except requests.ConnectionError:
            record("connection")
            return None
        finally:
            tally.seconds += time.monotonic() - began
        tally.statuses[status] += 1
        if status == 503 and case.operation.path.endswith(NEEDS_EGRESS_PROXY):
            record("unavailable")
        elif status >= 500:
            record("server_error")
        if 400 <= status < 500 and self.counts() != before:
            record("partial_write")
        if response is not None:
            try:
                case.validate_response(response, checks=self.checks, headers=self.headers)
            except (FailureGroup, Failure) as error:
                for failure in getattr(error, "exceptions", [error]):
                    record(_kind_of(failure))
        return response


def _settings(examples: int, **more: Any) -> Any:
    import hypothesis

    return hypothesis.settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
        **more,
    )


def fuzz_http(fuzzer: Fuzzer, *, examples: int, progress: Callable[[str], None] = say) -> list[Operation]:
    """Every operation of the served document, `examples` positive and `examples` negative cases each."""
    import hypothesis
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    for op in fuzzer.operations():
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.given(case=op.as_strategy(generation_mode=mode), real=st.booleans())
            @_settings(examples)
            def one(case: Any, real: bool) -> None:
                fuzzer.send(case, real=real)

            one()
        tally = fuzzer.tally(op.label)
        bad = {k: v for k, v in tally.failures.items() if k in FAILING}
        progress(
            f"  {tally.label}: {tally.sent} requests, {dict(tally.statuses)}"
            + (f" FAILED {bad}" if bad else "")
        )
    return list(fuzzer.tallies.values())


def fuzz_stateful(
    fuzzer: Fuzzer, *, scenarios: int, steps: int, progress: Callable[[str], None] = say
) -> int:
    """Sequences of calls along the links schemathesis infers from the document (an id a response returned,
    used in the next call's path or body): objects made by one step are read, changed, archived and deleted
    by the next ones. The steps sent."""
    import hypothesis
    from schemathesis.generation.stateful.state_machine import StepOutput

    sent = sum(op.sent for op in fuzzer.tallies.values())

    class Machine(fuzzer.schema.as_state_machine()):  # type: ignore[misc]
        def step(self, input: Any) -> Any:
            response = fuzzer.send(input.case)
            hypothesis.assume(response is not None)
            return StepOutput(response, input.case)

    Machine.run(settings=_settings(scenarios, stateful_step_count=steps))
    sent = sum(op.sent for op in fuzzer.tallies.values()) - sent
    progress(f"  stateful: {scenarios} scenarios, {sent} requests")
    return sent


# -- the WebSocket


def _frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, masked: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | rsv | opcode])
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        head += bytes([mask_bit | length])
    elif length < 1 << 16:
        head += bytes([mask_bit | 126]) + struct.pack("!H", length)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", length)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


ANSWER = b"This socket only sends"
# Each case: a name, the raw bytes sent after the handshake, and whether the consumer must answer it (a well
# formed frame: the socket only sends, and says so) or may close the connection (a protocol violation).
WS_CASES: list[tuple[str, bytes, bool]] = [
    ("text that is not JSON", _frame(0x1, b"{not json"), True),
    ("JSON of the wrong shape", _frame(0x1, b'{"type": "user.message", "content": 5}'), True),
    ("a binary frame", _frame(0x2, os.urandom(64)), True),
    ("a text frame of 1 MiB nested 1M deep", _frame(0x1, b"[" * (1 << 20)), True),
    ("a fragmented text message", _frame(0x1, b'{"a"', fin=False) + _frame(0x0, b": 1}"), True),
    (
        "a message over Daphne's 1 MiB in 17 fragments",
        _frame(0x1, b"x" * (1 << 16), fin=False)
        + b"".join(_frame(0x0, b"x" * (1 << 16), fin=False) for _ in range(15))
        + _frame(0x0, b"x"),
        False,
    ),
    ("invalid UTF-8 in a text frame", _frame(0x1, b"\xff\xfe\xfd"), False),
    (
        "a frame announcing 2^62 bytes",
        bytes([0x81, 0xFF]) + struct.pack("!Q", 1 << 62) + os.urandom(4),
        False,
    ),
    ("a continuation with no start", _frame(0x0, b"x"), False),
    (
        "a close in the middle of a fragmented message",
        _frame(0x1, b"ab", fin=False) + _frame(0x8, b"\x03\xe8"),
        False,
    ),
    ("a reserved opcode", _frame(0x3, b"x"), False),
    ("reserved bits set", _frame(0x1, b"{}", rsv=0x70), False),
    ("an unmasked client frame", _frame(0x1, b"{}", masked=False), False),
    ("a ping of 200 bytes", _frame(0x9, b"p" * 200), False),
    ("a close with a bad code", _frame(0x8, struct.pack("!H", 999)), False),
    ("garbage bytes", os.urandom(256), False),
]


async def _ws_case(url: str, key: str, payload: bytes, timeout: float) -> tuple[str, bool]:
    """Open the socket, send `payload`, and read until the server closes or goes quiet: the outcome, and
    whether the consumer's answer came."""
    from tests.wsclient import WebSocket

    headers = {"Origin": url.replace("ws://", "http://").split("/ws/")[0], "Authorization": f"Bearer {key}"}
    ws = await WebSocket.connect(url, headers, timeout=timeout)
    ws.writer.write(payload)
    with contextlib.suppress(ConnectionError):
        await ws.writer.drain()
    received = b""
    try:
        while True:
            try:
                data = await asyncio.wait_for(ws.reader.read(65536), 1.0)
            except TimeoutError:
                return "stayed open", ANSWER in received
            if not data:
                return "closed", ANSWER in received
            received += data
    except ConnectionError:
        return "reset", ANSWER in received
    finally:
        ws.writer.close()


async def _ws_alive(url: str, key: str, timeout: float) -> bool:
    from tests.wsclient import WebSocket

    headers = {"Origin": url.replace("ws://", "http://").split("/ws/")[0], "Authorization": f"Bearer {key}"}
    ws = await WebSocket.connect(url, headers, timeout=timeout)
    await ws.close()
    return True


def fuzz_websocket(
    base_url: str,
    key: str,
    session_id: str,
    *,
    counts: Callable[[], dict[str, int]] = row_counts,
    timeout: float = TIMEOUT_S,
    progress: Callable[[str], None] = say,
) -> list[dict[str, Any]]:
    """Each of WS_CASES on a fresh socket, then a before-the-handshake case; the server must answer a new
    socket after each one, within `timeout`, and no row may change."""
    url = base_url.replace("http://", "ws://") + f"/ws/sessions/{session_id}/"
    rows = []

    async def one(name: str, payload: bytes, answers: bool) -> dict[str, Any]:
        before = await asyncio.to_thread(_in_thread, counts)
        began = time.monotonic()
        try:
            outcome, answered = await asyncio.wait_for(_ws_case(url, key, payload, timeout), timeout + 5)
            failure = "ws" if answers and not (answered and outcome == "stayed open") else None
            outcome += ", answered" if answered else ""
        except (TimeoutError, ConnectionError, OSError) as error:
            outcome, failure = f"error: {error!r}", "ws"
        try:
            await asyncio.wait_for(_ws_alive(url, key, timeout), timeout)
        except (TimeoutError, ConnectionError, OSError) as error:
            failure = "ws"
            outcome += f"; the next socket failed: {error!r}"
        if await asyncio.to_thread(_in_thread, counts) != before:
            failure = "partial_write"
        return {
            "case": name,
            "outcome": outcome,
            "failure": failure,
            "ms": round((time.monotonic() - began) * 1000),
        }

    async def before_handshake() -> dict[str, Any]:
        """A WebSocket frame where the HTTP upgrade request should be, then the upgrade cut in half."""
        host, port = base_url.removeprefix("http://").split(":")
        began, failure, outcome = time.monotonic(), None, "closed"
        for raw in (_frame(0x1, b"{}"), b"GET /ws/sessions/" + session_id.encode() + b"/ HTTP/1.1\r\nUpgr"):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(raw)
            await writer.drain()
            writer.write_eof()
            try:
                await asyncio.wait_for(reader.read(), timeout)
            except TimeoutError:
                failure, outcome = "timeout", "no answer and no close"
            finally:
                writer.close()
        return {
            "case": "a frame before the handshake; a cut handshake",
            "outcome": outcome,
            "failure": failure,
            "ms": round((time.monotonic() - began) * 1000),
        }

    async def scenario() -> None:
        for name, payload, answers in WS_CASES:
            rows.append(await one(name, payload, answers))
            progress(
                f"  ws: {name}: {rows[-1]['outcome']}"
                + (f" FAILED {rows[-1]['failure']}" if rows[-1]["failure"] else "")
            )
        rows.append(await before_handshake())

    asyncio.run(scenario())
    return rows


def _in_thread(function: Callable[[], Any]) -> Any:
    from django.db import connections

    try:
        return function()
    finally:
        connections.close_all()


# -- the run


def result_of(
    operations: list[Operation],
    ws: list[dict[str, Any]],
    *,
    stateful: int,
    examples: int,
    quick: bool,
    seconds: float,
    machine: dict[str, Any],
) -> dict[str, Any]:
    kinds = sorted({k for op in operations for k in op.failures} | {r["failure"] for r in ws if r["failure"]})
    rows = [
        {
            "operation": op.label,
            "requests": op.sent,
            "statuses": " ".join(f"{s}×{n}" for s, n in sorted(op.statuses.items())),
            **{kind: op.failures.get(kind, 0) for kind in kinds},
            "s": round(op.seconds, 1),
        }
        for op in operations
    ]
    totals = Counter[str]()
    for op in operations:
        totals.update(op.failures)
    for row in ws:
        if row["failure"]:
            totals[row["failure"]] += 1
    # The table printed: one row per resource (the 60 operations' rows are in the JSON), then the kinds.
    by_resource: dict[str, dict[str, Any]] = {}
    for op in operations:
        resource = "/v1/" + op.label.split(" ", 1)[1].split("/")[2]
        row = by_resource.setdefault(
            resource,
            {"resource": resource, "operations": 0, "requests": 0, **dict.fromkeys(kinds, 0), "s": 0.0},
        )
        row["operations"] += 1
        row["requests"] += op.sent
        for kind in kinds:
            row[kind] += op.failures.get(kind, 0)
        row["s"] = round(row["s"] + op.seconds, 1)
    failures = [
        # `met` (the target: none) for the kinds that fail a run; the others are reported only.
        {
            "kind": kind,
            "count": totals.get(kind, 0),
            "target": "0" if kind in FAILING else "reported",
            "met": totals.get(kind, 0) == 0 if kind in FAILING else None,
        }
        for kind in sorted(set(FAILING) | set(totals))
    ]
    return {
        "benchmark": "fuzz",
        "quick": quick,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "seconds": round(seconds, 1),
        "examples_per_operation_and_mode": examples,
        "requests": sum(op.sent for op in operations),
        "stateful_requests": stateful,
        "failures": dict(totals),
        "server_errors": totals.get("server_error", 0),
        "by_resource": list(by_resource.values()),
        "failures_by_kind": failures,
        "websocket": ws,
        "operations": rows,
        "examples": {op.label: op.examples for op in operations if op.examples},
        "method": [
            "schemathesis (positive and negative cases) against a real Daphne server, half of the cases on real "
            "rows; failing kinds: " + ", ".join(FAILING) + "; the others are reported (rejected_positive: a "
            "request valid by the document that the server refused with a 400, where it checks more than the "
            "document says; unavailable: mcp_oauth_validate's 503 without an egress proxy).",
        ],
    }


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(12, 0.22 * len(result["operations"]) + 1.5))
    labels = [row["operation"] for row in result["operations"]]
    axis.barh(labels, [row["requests"] for row in result["operations"]])
    axis.invert_yaxis()
    axis.tick_params(axis="y", labelsize=7)
    axis.set_xlabel("requests sent")
    save_figure(figure, path, title)


def main() -> int:
    from bench.common.app import new_api_key
    from bench.common.launcher import Launcher, service_arguments
    from bench.common.machine import load_average, machine_info, warn_if_busy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few examples, for a smoke run")
    parser.add_argument("--examples", type=int, help="cases per operation and mode (default 25, quick 3)")
    parser.add_argument("--scenarios", type=int, help="stateful scenarios of 10 steps (default 50, quick 5)")
    service_arguments(parser)
    args = parser.parse_args()
    examples = args.examples or (3 if args.quick else 25)
    scenarios = args.scenarios or (5 if args.quick else 50)
    began = time.monotonic()
    with Launcher("fuzz", database_url=args.database_url, redis_url=args.redis_url) as system:
        system.start_services()
        machine = machine_info()
        warn_if_busy(machine)
        base_url = system.processes.daphne()
        key = new_api_key("fuzz")
        fuzzer = Fuzzer(base_url, key, make_rows(base_url, key))
        say(f"fuzzing every /v1 operation: {examples} positive and {examples} negative cases each")
        fuzz_http(fuzzer, examples=examples)
        say(f"stateful: {scenarios} scenarios of up to {STEPS} steps along the inferred links")
        stateful = fuzz_stateful(fuzzer, scenarios=scenarios, steps=STEPS)
        say("the session WebSocket")
        # A session of its own: the HTTP run deleted the first one, on purpose.
        ws = fuzz_websocket(base_url, key, make_rows(base_url, key)["session_id"])
        machine["load_average_at_end"] = load_average()
        result = result_of(
            list(fuzzer.tallies.values()),
            ws,
            stateful=stateful,
            examples=examples,
            quick=args.quick,
            seconds=time.monotonic() - began,
            machine=machine,
        )
        title = f"bench/fuzz on {machine['nproc']} CPUs, {result['requests']} requests, {result['at']}"
        publish(stem("fuzz", args.quick), result, lambda png: plot(result, png, title))
    return 0


if __name__ == "__main__":
    run(main)
