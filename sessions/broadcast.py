"""The one helper that publishes live messages about sessions.

Services call `publish_event` from `transaction.on_commit` and `publish_preview` for ephemeral previews;
nothing else calls `group_send`. Every message carries `(session, seq)`, so a receiver that sees a gap
re-reads the log: a broadcast is a hint, and losing one never loses an event.

Publishing happens on one background thread with its own event loop and channel layer, so appending an
event costs a queue put rather than a round trip to Redis, and messages from one process keep their
order.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from channels.layers import channel_layers

if TYPE_CHECKING:
    from sessions.models import Event

logger = logging.getLogger(__name__)

# Larger events go out as a bare stamp; receivers read them from the database.
INLINE_EVENT_LIMIT = 64 * 1024


def group_name(session_id: str) -> str:
    return f"session.{session_id}"


def event_message(event: Event) -> dict[str, Any]:
    body = event.as_api()
    inline = len(json.dumps(body, default=str)) <= INLINE_EVENT_LIMIT
    return {
        "type": "session.event",
        "session": event.session_id,
        "seq": event.seq,
        "event": body if inline else None,
    }


def publish_event(event: Event) -> None:
    _publisher().put(group_name(event.session_id), event_message(event))


def publish_preview(session_id: str, seq: int, preview: dict[str, Any], *, event_type: str) -> None:
    """An ephemeral preview (`event_start`/`event_delta`) of an `event_type` event not yet written.

    `seq` is the last seq written before it; previews are never stored.
    """
    message = {"type": "session.preview", "session": session_id, "seq": seq, "event_type": event_type,
               "preview": preview}
    _publisher().put(group_name(session_id), message)


class _Publisher:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, dict[str, Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="workbench-broadcast", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def put(self, group: str, message: dict[str, Any]) -> None:
        self._queue.put((group, message))

    def close(self, timeout: float = 2.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        # A plain daemon thread that blocks on the queue and drives its own loop only to send: no
        # executor threads, which would keep the process from exiting.
        loop = asyncio.new_event_loop()
        layer = channel_layers.make_backend("default")
        while True:
            item = self._queue.get()
            if item is None:
                return
            group, message = item
            try:
                loop.run_until_complete(layer.group_send(group, message))
            except Exception:  # noqa: BLE001 - a lost hint is repaired by readers; log and go on
                logger.warning("broadcast to %s failed; readers will catch up from the log", group, exc_info=True)


_lock = threading.Lock()
_instance: _Publisher | None = None


def _publisher() -> _Publisher:
    global _instance
    if _instance is None or not _instance._thread.is_alive():
        with _lock:
            if _instance is None or not _instance._thread.is_alive():
                _instance = _Publisher()
    return _instance
