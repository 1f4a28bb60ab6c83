"""The proxy's control endpoint, on loopback (EGRESS_CONTROL_URL): `GET /healthz`; `POST /validate` (the
MCP credential check the web server will ask the proxy for, as only it can open a credential) is not built
yet and says so with a 501."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger("vault.egress")
MAX_HEAD = 16 * 1024


def _answer(status: int, reason: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + payload


class Control:
    def __init__(self, url: str, *, token: str, health: Callable[[], dict[str, Any]]):
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.token = token
        self.health = health
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        logger.info("egress: control endpoint on http://%s:%s", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            writer.write(self.answer(head[:MAX_HEAD].decode("latin-1")))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, head: str) -> bytes:
        request_line, *lines = head.split("\r\n")
        method, _, rest = request_line.partition(" ")
        path = rest.partition(" ")[0].split("?")[0]
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)
        }
        if method == "GET" and path == "/healthz":
            return _answer(200, "OK", {"status": "ok", **self.health()})
        if path == "/validate":
            if self.token and headers.get("authorization") != f"Bearer {self.token}":
                return _answer(401, "Unauthorized", {"error": "the control token is missing or wrong"})
            return _answer(
                501,
                "Not Implemented",
                {"error": "credential validation through the egress proxy (MCP) is not built yet"},
            )
        return _answer(404, "Not Found", {"error": f"no such control endpoint: {method} {path}"})
