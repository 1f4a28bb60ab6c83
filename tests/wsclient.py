"""A small WebSocket client (RFC 6455) for tests against the real server: it sends exactly the handshake
headers a test gives (an Origin, a cookie, a key), which browsers and most client libraries decide for you.

Text frames are read as JSON; the server's close frame ends the reading with its code.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import struct
from typing import Any
from urllib.parse import urlsplit


class Closed(Exception):
    def __init__(self, code: int | None):
        super().__init__(f"closed with {code}")
        self.code = code


class WebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, url: str, headers: dict[str, str] | None = None, timeout: float = 30) -> WebSocket:
        """Open `url` (ws://host:port/path?query); raises ConnectionError if the handshake is refused."""
        parts = urlsplit(url)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), timeout)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {parts.hostname}:{parts.port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in (headers or {}).items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin1"))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            writer.close()
            raise ConnectionError(f"the handshake was refused: {status.decode('latin1')}")
        return cls(reader, writer)

    async def receive(self, timeout: float = 30) -> dict[str, Any]:
        """The next text frame as JSON; raises `Closed` (with the server's code) at its close frame."""
        while True:
            opcode, payload = await asyncio.wait_for(self._frame(), timeout)
            if opcode == 0x1:
                result: dict[str, Any] = json.loads(payload)
                return result
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                await self._send(0x8, payload[:2])
                self.writer.close()
                raise Closed(code)
            if opcode == 0x9:
                await self._send(0xA, payload)

    async def until_closed(self, timeout: float = 30) -> tuple[list[dict[str, Any]], int | None]:
        """Every message until the server closes, and its close code."""
        messages = []
        while True:
            try:
                messages.append(await self.receive(timeout))
            except Closed as closed:
                return messages, closed.code

    async def close(self) -> None:
        if not self.writer.is_closing():
            await self._send(0x8, struct.pack("!H", 1000))
            self.writer.close()

    async def _frame(self) -> tuple[int, bytes]:
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        return first & 0x0F, await self.reader.readexactly(length)  # a server's frames are unmasked

    async def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        length = len(payload)
        header = bytes([0x80 | opcode])
        if length < 126:
            header += bytes([0x80 | length])
        elif length < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack("!H", length)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(header + mask + masked)
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
