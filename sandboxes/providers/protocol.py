"""What every provider shares: a call's request to the in-sandbox toolbox, its time limits, its reply."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .base import Cancelled, SandboxError, ToolFailed, ToolInputError

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 3600.0
# The provider's own deadline comes this much after the limit the sandbox enforces, which needs up
# to ~3 s to stop a command and ~1 s to start a toolbox daemon that was not running.
HARD_DEADLINE_GRACE_S = 10.0
# How often `cancelled()` is asked, and how long a cancelled call may wait for the toolbox to confirm.
POLL_S = 0.2
CANCEL_CONFIRM_S = 0.8
MAX_REPLY_BYTES = 4 * 1024 * 1024
# The daemon's own limit (daemon.RESET_TIMEOUT_S) and a margin for starting the new shell.
RESET_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Request:
    id: str
    payload: bytes
    timeout_s: float  # enforced inside the sandbox

    @property
    def hard_deadline_s(self) -> float:
        return self.timeout_s + HARD_DEADLINE_GRACE_S

    @property
    def cancel_payload(self) -> bytes:
        return json.dumps({"cancel": self.id}).encode()


def build_request(name: str, input: dict[str, Any], *, timeout_s: float | None) -> Request:
    """The request for a call; its input is the toolbox's to check (`toolbox.schema`), the brain having
    checked it against the same table before the call left it."""
    limit = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    asked_ms = input.get("timeout_ms")
    # Any other timeout_ms the daemon refuses, as the schema says, before the call starts.
    if isinstance(asked_ms, int) and not isinstance(asked_ms, bool) and asked_ms > 0:
        asked = asked_ms / 1000
        limit = asked if timeout_s is None else min(asked, float(timeout_s))
    if not 0 < limit <= MAX_TIMEOUT_S:
        raise ToolInputError(f"the time limit must be more than 0 and at most {MAX_TIMEOUT_S:g} s")
    call_id = uuid.uuid4().hex[:16]
    payload = json.dumps({"id": call_id, "tool": name, "input": input, "timeout": limit}).encode()
    return Request(call_id, payload, limit)


def reset_request(env: dict[str, str] | None = None, *, unused: bool = False) -> Request:
    """What `Provider.reset` sends: the daemon stops every call and starts a new shell (a few seconds);
    with `env`, the new shell has those variables of the new holder's in place of the previous one's;
    `unused`: no call ran in the sandbox, so its next result does not say the shell is new."""
    body: dict[str, Any] = {"reset": True}
    if env is not None:
        body["env"] = env
    if unused:
        body["unused"] = True
    return Request(uuid.uuid4().hex[:16], json.dumps(body).encode(), RESET_TIMEOUT_S)


def parse_reply(data: bytes) -> str:
    try:
        reply = json.loads(data)
        ok = reply["ok"]
    except (ValueError, KeyError, TypeError):
        raise SandboxError(f"the sandbox's toolbox answered something unreadable: {data[:300]!r}") from None
    if ok:
        return str(reply.get("output", ""))
    kind, message = reply.get("error"), str(reply.get("message", "the tool failed"))
    if kind == "input":
        raise ToolInputError(message)
    if kind == "failed":
        raise ToolFailed(message)
    raise SandboxError(message)


def interrupted(reason: str, request: Request) -> ToolFailed:
    """The error of a call the provider stopped without the toolbox's word on it."""
    if reason == "cancelled":
        return ToolFailed("interrupted: the call was cancelled")
    return ToolFailed(
        f"the sandbox did not answer within {request.hard_deadline_s:g} s "
        f"(the call's limit was {request.timeout_s:g} s); it may be overloaded"
    )


class Relayed(Protocol):
    """A stream that carries call after call (the docker provider's relays): what `exchange` sends first for
    a request; what came (True once the relay read the call and waits for GO); GO, to send (from then on the
    call may have run); whether GO went; and whether the reply is whole."""

    went: bool

    def opening(self, request: Request) -> bytes: ...

    def feed(self, data: bytes) -> bool: ...

    def go(self) -> bytes: ...

    def has_reply(self) -> bool: ...


def exchange(
    sock: socket.socket,
    request: Request,
    *,
    cancelled: Cancelled | None,
    cancel: Callable[[], None],
    feed: Callable[[bytes], None] | None = None,
    relayed: Relayed | None = None,
) -> tuple[bool, str | None]:
    """Send the request on a connected stream, then read the reply into `feed` until the other side
    closes, the caller cancels, or the hard deadline passes; the stream is closed after.

    On a `relayed` stream instead, the sending side stays open and everything read goes to it; once it
    says the relay read the call, GO is sent unless the call was stopped by then (asked once more right
    before); the reply ends once it is whole, and the stream is then left open for the next call. A call
    stopped before GO went never ran: the exchange ends at once, with no cancel to send.

    On a cancel or at the deadline, `cancel()` asks the toolbox to stop the call, and the reply it
    then sends (with the output so far) is still read for CANCEL_CONFIRM_S.
    Returns (whether the reply is complete, why the provider stopped the call or None).
    """
    finished = False
    deadline = time.monotonic() + request.hard_deadline_s

    def why_stop() -> str | None:
        if cancelled is not None and cancelled():
            return "cancelled"
        return "deadline" if time.monotonic() > deadline else None

    stopped: str | None = None
    now, give_up = time.monotonic(), float("inf")
    try:
        if relayed is None:
            sock.sendall(request.payload)
            sock.shutdown(socket.SHUT_WR)
        else:
            sock.sendall(relayed.opening(request))
        while now < give_up:
            if stopped is None and (stopped := why_stop()):
                if relayed is not None and not relayed.went:
                    return False, stopped  # it never ran
                cancel()
                give_up = time.monotonic() + CANCEL_CONFIRM_S
            ready, _, _ = select.select([sock], [], [], POLL_S)
            if ready:
                chunk = sock.recv(65536)
                if not chunk:
                    finished = relayed is None
                    return finished, stopped
                if relayed is None:
                    if feed is not None:
                        feed(chunk)
                elif relayed.feed(chunk):
                    if stopped := why_stop():
                        return False, stopped  # not let run
                    sock.sendall(relayed.go())
                elif relayed.has_reply():
                    finished = True
                    return finished, stopped
            now = time.monotonic()
    except OSError:  # the stream broke: the sandbox died under the call
        pass
    finally:
        if relayed is None or not finished:
            close(sock)
    return False, stopped


def close(sock: socket.socket) -> None:
    """Shut the stream down, then close it: a socket the Docker SDK still holds a file object of is only
    closed with that object, and the process at the other end would not see its input end."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
