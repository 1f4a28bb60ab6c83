"""Name resolution for the proxy's upstream connections: resolve once, check, connect to the checked address.

The proxy's event loop resolves through `Resolver.getaddrinfo` (installed on the loop), which answers only
with the address it checked, and remembers it for a few seconds: the check that a request's host is not a
loopback or private address and the connection that follows use one resolution, so a name that resolves
to a public address for the check and a private one for the connect (DNS rebinding) gets nowhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from typing import Any

from .policy import PrivateAllowed, address_refusal

AddrInfo = tuple[Any, ...]


class Refused(OSError):
    """A destination the proxy will not connect to; its message says why (no secret in it)."""


class Resolver:
    def __init__(self, loop: asyncio.AbstractEventLoop, allowed: PrivateAllowed, *, ttl: float = 30.0):
        self._system = loop.getaddrinfo
        self.allowed = allowed
        self.ttl = ttl
        self._pins: dict[tuple[str, int], tuple[float, AddrInfo | None, str | None]] = {}

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.getaddrinfo = self.getaddrinfo  # type: ignore[method-assign]

    async def pin(self, host: str, port: int) -> AddrInfo:
        """The checked address `host` connects to; Refused if it is not one sandboxes may reach."""
        host = host.lower().rstrip(".")
        key = (host, port)
        hit = self._pins.get(key)
        if hit is None or hit[0] <= time.monotonic():
            hit = await self._resolve(host, port)
            self._pins[key] = hit
        _, info, refusal = hit
        if refusal is not None or info is None:
            raise Refused(refusal or f"the host {host} does not resolve")
        return info

    async def refusal(self, host: str, port: int) -> str | None:
        try:
            await self.pin(host, port)
        except Refused as refused:
            return str(refused)
        return None

    async def _resolve(self, host: str, port: int) -> tuple[float, AddrInfo | None, str | None]:
        expires = time.monotonic() + self.ttl
        try:
            ipaddress.ip_address(host)
            literal = True
        except ValueError:
            literal = False
        try:
            infos = await self._system(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            # Not cached for long: the name may resolve in a moment.
            return (
                time.monotonic() + 1.0,
                None,
                f"the host {host} does not resolve ({error.strerror or error})",
            )
        if not infos:
            return expires, None, f"the host {host} does not resolve"
        info = infos[0]
        address = str(info[4][0])
        refusal = address_refusal(address, port, self.allowed)
        if refusal is not None and not literal:
            refusal = f"the host {host} resolves to {address}: {refusal.removeprefix('the destination ')}"
        return expires, info, refusal

    async def getaddrinfo(
        self, host: Any, port: Any, *, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[AddrInfo]:
        """The loop's resolution: for a listening socket as the system's; for a connection, the pinned
        address only, or Refused."""
        if flags & socket.AI_PASSIVE or host is None:
            return await self._system(host, port, family=family, type=type, proto=proto, flags=flags)
        name = host.decode() if isinstance(host, bytes) else str(host)
        return [await self.pin(name, int(port))]
