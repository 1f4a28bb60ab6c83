"""The proxy's control endpoint, on loopback (EGRESS_CONTROL_URL): `GET /healthz`; `POST /validate {vault_id,
credential_id, actor}`, the MCP credential check the web server asks the proxy for, as only it can open a
credential (with EGRESS_CONTROL_TOKEN as a bearer token); its answer is the API's validation object."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger("vault.egress")
MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
Validate = Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 501: "Not Implemented"}


def _answer(status: int, reason: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + payload


class Pending:
    """A request whose body is still to be read (a validation)."""

    def __init__(self, length: int):
        self.length = length


class Control:
    def __init__(
        self, url: str, *, token: str, health: Callable[[], dict[str, Any]], validate: Validate | None = None
    ):
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.token = token
        self.health = health
        self.validate = validate
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
            answer = self.answer(head[:MAX_HEAD].decode("latin-1"))
            if isinstance(answer, Pending):
                length = answer.length
                body = await asyncio.wait_for(reader.readexactly(length), timeout=5.0) if length else b""
                answer = await self._validate(body)
            writer.write(answer)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _validate(self, body: bytes) -> bytes:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        if not isinstance(request, dict):
            return _answer(400, "Bad Request", {"error": "the body must be a JSON object"})
        assert self.validate is not None
        try:
            status, result = await self.validate(request)
        except Exception:
            logger.exception("egress: validating a credential failed")
            return _answer(
                500, "Internal Server Error", {"error": "validation failed in the proxy; see its log"}
            )
        return _answer(status, REASONS.get(status, "OK"), result)

    def answer(self, head: str) -> bytes | Pending:
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
            if method != "POST":
                return _answer(405, "Method Not Allowed", {"error": "POST /validate with a JSON body"})
            if self.validate is None:
                return _answer(
                    501, "Not Implemented", {"error": "this proxy has no workers' door to validate with"}
                )
            length = headers.get("content-length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:
                return _answer(
                    400, "Bad Request", {"error": f"a body of at most {MAX_BODY} bytes, with a length"}
                )
            return Pending(int(length))
        return _answer(404, "Not Found", {"error": f"no such control endpoint: {method} {path}"})
