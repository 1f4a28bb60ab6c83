"""What the database tells the proxy at each commit that changes a policy (PostgreSQL's LISTEN/NOTIFY).

The triggers of vault/migrations/0004_egress_notices.py send `<kind>:<id>` on the `workbench_egress`
channel: `sandbox:` (passed to another session, detached, ended, its token changed), `session:` (its vaults,
agent or repository tokens changed), `vault:` (archived, deleted, a credential of it added, changed or
removed), `environment:` (its networking changed). A thread of its own holds one connection that listens,
and hands each key to `forget` on the proxy's event loop. Whenever it (re)connects it hands `*`: what
changed while nobody listened is unknown, so every cached policy is read again.

On SQLite there is nothing to listen to: policies then live EGRESS_CACHE_SECONDS, as they did before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from django.db import connections

logger = logging.getLogger("vault.egress")
CHANNEL = "workbench_egress"
EVERYTHING = "*"
WAIT_SECONDS = 1.0  # how often the thread looks up from waiting, to see whether it should stop
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)


class Notices:
    """Listens on a connection of its own; `forget(key)` runs on `loop` for each notice."""

    def __init__(self, loop: asyncio.AbstractEventLoop, forget: Callable[[str], None]) -> None:
        self.loop = loop
        self.forget = forget
        self.state = "starting"
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="egress-notices", daemon=True)

    @staticmethod
    def available() -> bool:
        return connections["default"].vendor == "postgresql"

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _deliver(self, key: str) -> None:
        self.loop.call_soon_threadsafe(self.forget, key)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._listen()
                failures = 0
            except Exception as error:  # the database went away, or this connection was ended
                self.state = "reconnecting"
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                logger.warning(
                    "egress: lost the database's notices (%s); policies are read again after "
                    "EGRESS_CACHE_SECONDS until it listens again (retrying in %.1f s)",
                    error,
                    delay,
                )
                self._stop.wait(delay)

    def _listen(self) -> None:
        import psycopg

        params = connections["default"].get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        with psycopg.connect(**params, autocommit=True) as connection:
            connection.execute(f"LISTEN {CHANNEL}")
            # Anything may have changed before this LISTEN (or while the last connection was down).
            self._deliver(EVERYTHING)
            if self.state != "listening":
                logger.info("egress: listening for policy changes on %s", CHANNEL)
            self.state = "listening"
            while not self._stop.is_set():
                for notice in connection.notifies(timeout=WAIT_SECONDS):
                    self.received += 1
                    self._deliver(notice.payload)
