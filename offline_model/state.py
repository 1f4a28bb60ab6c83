"""What the control endpoints change at run time: latency, pending faults, and counters."""

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal

FaultKind = Literal["429", "529", "500", "broken_stream"]
FAULT_KINDS: tuple[FaultKind, ...] = ("429", "529", "500", "broken_stream")


@dataclass(frozen=True)
class Latency:
    ttft_ms: float = 0.0
    tps: float = 0.0
    """Tokens per second for streamed deltas; 0 means as fast as possible."""


class ServerState:
    """Shared by every request thread, so every read and write holds the lock."""

    def __init__(self, latency: Latency) -> None:
        self._lock = threading.Lock()
        self._initial_latency = latency
        self._latency = latency
        self._fault: FaultKind | None = None
        self._fault_remaining = 0
        self._by_status: Counter[int] = Counter()
        self._in_flight = 0
        self._disconnects = 0

    @property
    def latency(self) -> Latency:
        with self._lock:
            return self._latency

    def set_latency(self, *, ttft_ms: float | None = None, tps: float | None = None) -> Latency:
        with self._lock:
            if ttft_ms is not None:
                self._latency = replace(self._latency, ttft_ms=ttft_ms)
            if tps is not None:
                self._latency = replace(self._latency, tps=tps)
            return self._latency

    def set_fault(self, kind: FaultKind, count: int) -> None:
        """Make the next `count` model requests fail this way, replacing any pending fault."""
        with self._lock:
            self._fault, self._fault_remaining = kind, count

    def take_fault(self) -> FaultKind | None:
        with self._lock:
            if self._fault_remaining <= 0:
                return None
            self._fault_remaining -= 1
            return self._fault

    def reset(self) -> None:
        with self._lock:
            self._latency = self._initial_latency
            self._fault, self._fault_remaining = None, 0
            self._by_status.clear()
            self._disconnects = 0

    @contextmanager
    def tracking_request(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def record(self, status: int, *, disconnected: bool = False) -> None:
        with self._lock:
            self._by_status[status] += 1
            self._disconnects += disconnected

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": sum(self._by_status.values()),
                "by_status": {str(status): count for status, count in sorted(self._by_status.items())},
                "in_flight": self._in_flight,
                "disconnects": self._disconnects,
                "fault": {"kind": self._fault, "remaining": self._fault_remaining},
                "latency": {"ttft_ms": self._latency.ttft_ms, "tps": self._latency.tps},
            }
