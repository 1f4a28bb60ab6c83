"""The docker provider's relays: a `docker exec` of the toolbox's relay (sandboxes/toolbox/relay.py) kept
open per sandbox, through which call after call goes, instead of an exec of the one-shot client per call.

Why: an exec per call cost ~65 ms of the machine's CPU (the engine, runc, a new interpreter in the
container) and as much of each call's time; a call through a relay that is running costs neither. The relay
runs a call only after this side's GO, sent once it said it read the call (READ): a call given up on before
(cancelled, or its sandbox paused) never runs, however late the relay reads it, and one whose relay ended
before GO can be sent again. A relay carries one call at a time; a process keeps at most KEPT_PER_SANDBOX idle ones per sandbox, each for at
most REUSE_S (the relay itself leaves after its IDLE_S), and one whose stream shows anything while idle
(its end) is dropped. A relay is used again only after a call that ended with its whole reply read: one
that was stopped, broke or timed out is closed, and the relay in the sandbox ends with its input.

Per process: the streams are sockets of this process, and a forked child starts with none. The relay only
writes once it has read a call, so nothing it says can be lost in the buffer the Docker SDK reads the
exec's HTTP answer with (docker-py #425: bytes that came with the answer's headers stay there).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sandboxes.toolbox.client import RELAY_HEADER_BYTES, RELAY_IDLE_S

from . import protocol
from .base import SandboxError

KEPT_PER_SANDBOX = 2
REUSE_S = RELAY_IDLE_S / 2  # well before the relay's own idle end
EMPTY_FRAME = bytes(RELAY_HEADER_BYTES)  # the relay's READ, the provider's GO


class Frames:
    """Demultiplexes an exec's attached stream: 8-byte headers (stream, size) before each chunk. Keeps the
    last 4 KiB of stderr; stdout past `limit` bytes is an error."""

    def __init__(self, limit: int = protocol.MAX_REPLY_BYTES) -> None:
        self._pending = bytearray()
        self._limit = limit
        self.stdout = bytearray()
        self.stderr = bytearray()

    def feed(self, data: bytes) -> None:
        self._pending += data
        while len(self._pending) >= 8:
            size = int.from_bytes(self._pending[4:8], "big")
            if len(self._pending) < 8 + size:
                break
            target = self.stdout if self._pending[0] == 1 else self.stderr
            target += self._pending[8 : 8 + size]
            del self._pending[: 8 + size]
        if len(self.stdout) > self._limit:
            raise SandboxError("the sandbox's toolbox sent a reply larger than any it should")
        del self.stderr[:-4096]

    @property
    def empty(self) -> bool:
        return not (self._pending or self.stdout)


@dataclass(eq=False)
class Relay:
    """One relay's stream: the exec's id, its socket (and the SDK's object holding it), what came on it so
    far, and where its call is: the relay asked to run it (READ came), and GO went."""

    exec_id: str
    sock: socket.socket
    holder: Any = None  # the SDK's file object around `sock`, closed with it
    frames: Frames = field(default_factory=lambda: Frames(protocol.MAX_REPLY_BYTES + RELAY_HEADER_BYTES))
    asked: bool = False
    went: bool = False
    idle_since: float = 0.0

    def opening(self, request: protocol.Request) -> bytes:
        self.asked = self.went = False
        return len(request.payload).to_bytes(RELAY_HEADER_BYTES, "big") + request.payload

    def feed(self, data: bytes) -> bool:
        """Take what came; True once the relay said it read the call (an empty frame) and waits for GO."""
        self.frames.feed(data)
        stdout = self.frames.stdout
        if self.asked or len(stdout) < RELAY_HEADER_BYTES:
            return False
        if stdout[:RELAY_HEADER_BYTES] != EMPTY_FRAME:
            raise SandboxError(
                f"the sandbox's toolbox relay said something else than READ: {bytes(stdout[:80])!r}"
            )
        del stdout[:RELAY_HEADER_BYTES]
        self.asked = True
        return True

    def go(self) -> bytes:
        """GO, to send: from now on the call may have run."""
        self.went = True
        return EMPTY_FRAME

    def has_reply(self) -> bool:
        stdout, header = self.frames.stdout, RELAY_HEADER_BYTES
        if not self.went or len(stdout) < header:
            return False
        return len(stdout) >= header + int.from_bytes(stdout[:header], "big")

    def take_reply(self) -> bytes:
        stdout, header = self.frames.stdout, RELAY_HEADER_BYTES
        size = int.from_bytes(stdout[:header], "big")
        reply = bytes(stdout[header : header + size])
        del stdout[: header + size]
        return reply

    def usable(self) -> bool:
        """Idle for less than REUSE_S, and its stream silent (a readable one has ended, or broke the protocol)."""
        if time.monotonic() - self.idle_since > REUSE_S or not self.frames.empty:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        protocol.close(self.sock)
        if self.holder is not None:
            with contextlib.suppress(Exception):
                self.holder.close()


class Relays:
    """The idle relays of this process, by sandbox handle. Each give-back also closes every relay idle past
    REUSE_S, whatever its sandbox: one whose sandbox this process never calls again (removed by another
    process, or its session's brain now elsewhere) is closed within a minute of the next call of any."""

    def __init__(self) -> None:
        self._idle: dict[str, list[Relay]] = {}
        self._lock = threading.Lock()

    def take(self, handle: str) -> Relay | None:
        """An idle relay of the sandbox that can carry a call now, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(handle)
                if not idle:
                    return None
                relay = idle.pop()
                if not idle:
                    del self._idle[handle]
            if relay.usable():
                return relay
            relay.close()

    def give_back(self, handle: str, relay: Relay) -> None:
        """A relay whose call ended with its whole reply read, for the sandbox's next call."""
        relay.idle_since = now = time.monotonic()
        with self._lock:
            closing = self._expired(now)
            idle = self._idle.setdefault(handle, [])
            if len(idle) < KEPT_PER_SANDBOX:
                idle.append(relay)
            else:
                closing.append(relay)
        for each in closing:
            each.close()

    def _expired(self, now: float) -> list[Relay]:
        """Take out every relay idle past REUSE_S (under the lock)."""
        expired: list[Relay] = []
        for handle, idle in list(self._idle.items()):
            fresh = [relay for relay in idle if now - relay.idle_since <= REUSE_S]
            expired += [relay for relay in idle if now - relay.idle_since > REUSE_S]
            if fresh:
                self._idle[handle] = fresh
            else:
                del self._idle[handle]
        return expired

    def drop(self, handle: str) -> None:
        """Close the sandbox's idle relays (it is being removed)."""
        with self._lock:
            idle = self._idle.pop(handle, [])
        for relay in idle:
            relay.close()

    def count(self, handle: str) -> int:
        with self._lock:
            return len(self._idle.get(handle, []))


_relays: Relays | None = None
_relays_lock = threading.Lock()


def relays() -> Relays:
    """This process's relays."""
    global _relays
    with _relays_lock:
        if _relays is None:
            _relays = Relays()
        return _relays


def _forget_in_child() -> None:
    """A forked child starts with no relays (the streams are its parent's sockets: it must neither use nor
    shut them down) and new locks (another thread may have held one at the fork)."""
    global _relays, _relays_lock
    _relays, _relays_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
