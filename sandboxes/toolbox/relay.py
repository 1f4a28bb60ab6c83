"""Relay call after call to the toolbox daemon over one `docker exec`: runs inside a docker sandbox, as root.

A `docker exec` of the one-shot client (client.py) per call cost the engine, the kernel and the new
interpreter ~65 ms of the machine's CPU, and as much of the call's time (bench/sandboxes); the provider
keeps this relay running instead and sends its calls through it, one at a time
(sandboxes/providers/relays.py). Each call is relayed as the client relays it (`client.call`: a
connection of its own to the daemon, its listener checked to be root first), so the channel is the one
the client makes; the relay only saves the exec.

Frames, both ways: a 4-byte big-endian length, then that many bytes. For each request frame it reads,
the relay answers an empty frame (READ), and runs the call only once the provider answers one too (GO),
then writes the reply's frame. So a call runs only while its sender waits for it: one sent to a relay that
could not read it at once (its sandbox paused) and given up on meanwhile finds the input ended instead of
GO, however late it is read; and a stream that ended before GO never ran its call. The relay writes
nothing before it has read a call (the Docker SDK can lose what comes with the exec's HTTP answer), and
ends at the end of its input, or after IDLE_S without a request.

Run (as root): python3 -I -S /opt/workbench/toolbox/relay.py
"""

import os
import select
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # -I leaves this directory out
import client  # noqa: E402 - after the path it is found on
from client import RELAY_HEADER_BYTES as HEADER_BYTES  # noqa: E402
from client import RELAY_IDLE_S as IDLE_S  # noqa: E402

READ = GO = bytes(HEADER_BYTES)  # an empty frame, each way


def _read_exactly(count):
    """`count` bytes of the input, or None at its end."""
    data = bytearray()
    while len(data) < count:
        chunk = os.read(0, count - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _write(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def main():
    while True:
        ready, _, _ = select.select([0], [], [], IDLE_S)
        if not ready:
            return 0
        header = _read_exactly(HEADER_BYTES)
        if header is None:
            return 0
        request = _read_exactly(int.from_bytes(header, "big"))
        if request is None:
            return 0
        try:
            _write(READ)
        except OSError:
            return 0  # its reader is gone
        if _read_exactly(HEADER_BYTES) != GO:
            return 0  # the sender left (or broke the protocol): nobody waits for this call
        reply, _ = client.call(request)
        _write(len(reply).to_bytes(HEADER_BYTES, "big") + reply)


if __name__ == "__main__":
    sys.exit(main())
