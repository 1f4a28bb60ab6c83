"""harness.pool: a worker's main process notices a dead pool process at once and has its event loop look."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.pool import watch_pool


@dataclass
class Hub:
    """A worker's event loop as the watcher uses it: call_soon from another thread."""

    called: list[Any] = field(default_factory=list)
    seen: threading.Event = field(default_factory=threading.Event)

    def call_soon(self, callback: Any) -> None:
        self.called.append(callback)
        self.seen.set()


@dataclass
class Process:
    pid: int


@dataclass
class Billiard:
    _pool: list[Process]


@dataclass
class TaskPool:
    _pool: Billiard
    looked: int = 0

    def maintain_pool(self) -> None:
        self.looked += 1


@dataclass
class Consumer:
    pool: Any
    hub: Any


@pytest.fixture
def children() -> Any:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        child = subprocess.Popen(["sleep", "60"])
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()


def test_a_pool_process_that_dies_has_the_loop_look_at_the_pool_once(children: Any, settings: Any) -> None:
    settings.POOL_WATCH_SECONDS = 0.02
    alive, doomed = children(), children()
    pool = TaskPool(Billiard([Process(alive.pid), Process(doomed.pid)]))
    hub = Hub()
    assert watch_pool(Consumer(pool, hub)) is not None
    time.sleep(0.2)
    assert hub.called == [], "nothing died: the loop is left alone"

    os.kill(doomed.pid, signal.SIGKILL)  # not reaped: a zombie, as a pool process is until the pool joins it
    assert hub.seen.wait(5), "the death was not reported"
    time.sleep(0.2)
    assert hub.called == [pool.maintain_pool], "one look per death, not one per tick"


def test_pools_without_processes_or_a_loop_are_not_watched() -> None:
    assert watch_pool(Consumer(object(), Hub())) is None  # solo, threads
    assert watch_pool(Consumer(TaskPool(Billiard([])), None)) is None  # no event loop
