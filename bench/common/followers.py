"""Clients that follow sessions through failures: one SSE stream and one WebSocket per session, each
reconnecting after any error from the last seq it received (`Last-Event-ID` on the stream, `?after=` on the
socket), in an asyncio loop of a thread of its own. What each received is kept for an audit against the log:
every event exactly once and in order (`Followers.audit`).

Loopback only: the URL is a Daphne the benchmark started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

RETRY_SECONDS = 0.25  # between a failed connection and the next try
SOCKET_SILENCE_SECONDS = 120.0  # a socket that says nothing this long is taken for dead, and reopened


@dataclass
class Received:
    seq: int
    uid: str
    at: float  # wall clock when its frame arrived
    processed_at: float  # the event's own timestamp


@dataclass
class Follower:
    session_id: str
    kind: str  # "sse" or "websocket"
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # why a connection ended, by kind

    @property
    def last_seq(self) -> int:
        return self.received[-1].seq if self.received else -1

    def take(self, seq: int, event: dict[str, Any]) -> None:
        processed = datetime.fromisoformat(event["processed_at"]).timestamp()
        self.received.append(Received(seq, event["id"], time.time(), processed))


class Followers:
    """An SSE and a WebSocket follower per session, from `start()` until `stop()`."""

    def __init__(self, url: str, api_key: str, session_ids: list[str]) -> None:
        self.url, self.api_key = url, api_key
        self.followers = [Follower(s, kind) for s in session_ids for kind in ("sse", "websocket")]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="followers", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait(30)

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(30)

    def reached(self, lengths: dict[str, int]) -> bool:
        """Every follower has received its session's last event (`lengths`: the sessions' lengths now)."""
        return all(f.last_seq >= lengths[f.session_id] - 1 for f in self.followers)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        import httpx

        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        timeout = httpx.Timeout(10, read=SOCKET_SILENCE_SECONDS)
        async with httpx.AsyncClient(
            headers={"x-api-key": self.api_key}, timeout=timeout, limits=limits
        ) as http:
            tasks = [
                asyncio.create_task(self._sse(http, f) if f.kind == "sse" else self._socket(f))
                for f in self.followers
            ]
            self._started.set()
            await self._stopping.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _again(self, follower: Follower, why: str) -> None:
        follower.failures[why] += 1
        await asyncio.sleep(RETRY_SECONDS)

    async def _sse(self, http: Any, follower: Follower) -> None:
        import httpx

        url = f"{self.url}/v1/sessions/{follower.session_id}/events/stream"
        while True:
            try:
                headers = {"Last-Event-ID": str(follower.last_seq)}
                async with http.stream("GET", url, headers=headers) as response:
                    if response.status_code != 200:
                        await response.aread()
                        await self._again(follower, f"answered {response.status_code}")
                        continue
                    follower.connections += 1
                    seq, name, data = None, "", ""
                    async for line in response.aiter_lines():
                        if line:
                            key, _, value = line.partition(":")
                            value = value.removeprefix(" ")
                            if key == "id":
                                seq = int(value)
                            elif key == "event":
                                name = value
                            elif key == "data":
                                data += value
                            continue
                        if seq is not None and data:
                            follower.take(seq, json.loads(data))
                        elif name == "error":
                            follower.failures[f"error event: {data[:120]}"] += 1
                        seq, name, data = None, "", ""
                await self._again(follower, "stream ended")
            except (httpx.HTTPError, OSError, ValueError) as failed:
                await self._again(follower, type(failed).__name__)

    async def _socket(self, follower: Follower) -> None:
        from tests.wsclient import Closed, WebSocket

        base = self.url.replace("http://", "ws://", 1)
        while True:
            socket = None
            try:
                url = f"{base}/ws/sessions/{follower.session_id}/?after={follower.last_seq}"
                socket = await WebSocket.connect(url, {"x-api-key": self.api_key}, timeout=10)
                follower.connections += 1
                while True:
                    message = await socket.receive(timeout=SOCKET_SILENCE_SECONDS)
                    if message.get("type") == "event":
                        follower.take(message["seq"], message["event"])
                    elif message.get("type") == "error":
                        follower.failures[f"error message: {str(message.get('message'))[:120]}"] += 1
            except Closed as closed:
                await self._again(follower, f"closed {closed.code}")
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as failed:
                await self._again(follower, type(failed).__name__)
            finally:
                if socket is not None:
                    with contextlib.suppress(Exception):
                        socket.writer.close()

    def audit(self, logs: dict[str, list[tuple[int, str]]]) -> dict[str, Any]:
        """Each follower against its session's log (`logs`: session -> [(seq, uid)] in seq order): what it
        missed, saw twice, saw out of order or saw different from the log, and how often it connected."""
        found: dict[str, Any] = {
            "clients": len(self.followers),
            "clients that missed an event": 0,
            "clients that saw an event twice": 0,
            "clients that saw events out of order": 0,
            "clients that saw an event unlike the log's": 0,
            "reconnections": 0,
            "problems": [],
        }
        for follower in self.followers:
            log = dict(logs[follower.session_id])
            seqs = [r.seq for r in follower.received]
            found["reconnections"] += max(0, follower.connections - 1)
            problems = []
            if set(log) - set(seqs):
                found["clients that missed an event"] += 1
                problems.append(f"missed {sorted(set(log) - set(seqs))[:10]}")
            if len(seqs) != len(set(seqs)):
                found["clients that saw an event twice"] += 1
                problems.append(f"twice: {sorted(s for s, n in Counter(seqs).items() if n > 1)[:10]}")
            if seqs != sorted(seqs):
                found["clients that saw events out of order"] += 1
                problems.append("out of order")
            if any(log.get(r.seq) != r.uid for r in follower.received):
                found["clients that saw an event unlike the log's"] += 1
                problems.append("an event unlike the log's")
            if problems:
                found["problems"].append(f"{follower.kind} {follower.session_id}: {'; '.join(problems)}")
        found["failures by kind"] = dict(
            sum(
                (Counter({f"{f.kind}: {k}": n for k, n in f.failures.items()}) for f in self.followers),
                Counter(),
            )
        )
        return found
