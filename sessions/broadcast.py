"""The one helper that publishes live messages about sessions.

Services call `publish_event` from `transaction.on_commit` and `publish_preview` for ephemeral previews;
nothing else calls `group_send`. Every message carries `(session, seq)`, so a receiver that sees a gap
re-reads the log: a broadcast is a hint, and losing one never loses an event.

Publishing happens on one background thread that batches whatever is queued into one Redis pipeline of
PUBLISHes per shard, so appending an event costs a queue put rather than a round trip, and messages from
one process keep their order. `Groups` is the one adapter that knows how channels_redis's pub/sub layer
names, shards and encodes a group's messages (tests/sessions/test_broadcast_sharded.py holds it to the
real layer on two Redis servers): the layer's own `group_send` costs a round trip per message.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis
import redis.sentinel
from channels.layers import channel_layers
from channels_redis.pubsub import RedisPubSubChannelLayer
from channels_redis.utils import _consistent_hash, decode_hosts
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from sessions.models import Event

logger = logging.getLogger(__name__)

# How long the publisher waits to gather more messages into one pipeline.
LINGER_SECONDS = 0.005
# Larger events go out as a bare stamp; receivers read them from the database.
INLINE_EVENT_LIMIT = 64 * 1024


def group_name(session_id: str) -> str:
    return f"session.{session_id}"


def event_message(event: Event, *, inline: bool = True) -> dict[str, Any]:
    return {
        "type": "session.event",
        "session": event.session_id,
        "seq": event.seq,
        "event": event.as_api() if inline else None,
    }


def _wire(layer: Any, message: Any) -> bytes:
    """The serialized message; an event too large to inline, or that cannot be encoded, goes out as its bare
    stamp (receivers read it from the database)."""
    if isinstance(message, dict):
        return layer.serialize(message)
    try:
        data = layer.serialize(event_message(message))
    except Exception:  # noqa: BLE001 - whatever the encoder refuses (e.g. an unpaired surrogate), the stamp is enough
        logger.warning(
            "event %s:%s could not be encoded inline; it goes out as its stamp",
            message.session_id,
            message.seq,
            exc_info=True,
        )
    else:
        if len(data) <= INLINE_EVENT_LIMIT:
            return data
    return layer.serialize(event_message(message, inline=False))


def publish_event(event: Event) -> None:
    # The message is built on the publisher's thread: the appending thread only queues the event.
    _publisher().put(group_name(event.session_id), event)


def publish_preview(session_id: str, seq: int, preview: dict[str, Any], *, event_type: str) -> None:
    """An ephemeral preview (`event_start`/`event_delta`) of an `event_type` event not yet written.

    `seq` is the last seq written before it; previews are never stored.
    """
    message = {
        "type": "session.preview",
        "session": session_id,
        "seq": seq,
        "event_type": event_type,
        "preview": preview,
    }
    _publisher().put(group_name(session_id), message)


class Groups:
    """Publishes to channel-layer groups exactly where and as channels_redis's `RedisPubSubChannelLayer` does
    (`RedisPubSubLoopLayer.group_send`), with synchronous clients and a pipeline per shard: the same Redis
    channel, on the same one of the layer's hosts, carrying the same bytes."""

    def __init__(self, alias: str = "default") -> None:
        self.layer = channel_layers.make_backend(alias)
        if not isinstance(self.layer, RedisPubSubChannelLayer):
            raise ImproperlyConfigured(
                f"CHANNEL_LAYERS[{alias!r}] must be channels_redis.pubsub.RedisPubSubChannelLayer for the "
                f"broadcaster, not {type(self.layer).__name__}"
            )
        layers: dict[str, Any] = settings.CHANNEL_LAYERS
        config: dict[str, Any] = layers[alias].get("CONFIG", {})
        self.prefix: str = config.get("prefix", "asgi")
        self.shards = [_client(host) for host in decode_hosts(config.get("hosts"))]

    def channel(self, group: str) -> str:
        """RedisPubSubLoopLayer._get_group_channel_name."""
        return f"{self.prefix}__group__{group}"

    def shard(self, channel: str) -> int:
        """RedisPubSubLoopLayer._get_shard: the host a group's channel lives on, for publishers and readers."""
        return _consistent_hash(channel, len(self.shards))

    def publish(self, messages: Iterable[tuple[str, bytes]]) -> int:
        """PUBLISH each (group, serialized message), in order within each shard; how many did not go out (a
        shard that fails costs its own messages only)."""
        by_shard: dict[int, list[tuple[str, bytes]]] = {}
        for group, data in messages:
            channel = self.channel(group)
            by_shard.setdefault(self.shard(channel), []).append((channel, data))
        lost = 0
        for index, items in by_shard.items():
            pipeline = self.shards[index].pipeline(transaction=False)
            for channel, data in items:
                pipeline.publish(channel, data)
            try:
                pipeline.execute()
            except redis.RedisError:
                lost += len(items)
                logger.warning(
                    "broadcast of %d messages to shard %d failed; readers will catch up from the log",
                    len(items),
                    index,
                    exc_info=True,
                )
        return lost


def _client(host: dict[str, Any]) -> redis.Redis:
    """A synchronous client for one of the layer's hosts, made as channels_redis.utils.create_pool makes its
    pool for it (a URL, a sentinel's master, or connection keywords)."""
    host = dict(host)
    if "address" in host:
        pool = redis.ConnectionPool.from_url(host.pop("address"), **host)
    elif "master_name" in host:
        master = host.pop("master_name")
        sentinel = redis.sentinel.Sentinel(
            host.pop("sentinels"), sentinel_kwargs=host.pop("sentinel_kwargs", None)
        )
        pool = redis.sentinel.SentinelConnectionPool(master, sentinel, **host)
    else:
        pool = redis.ConnectionPool(**host)
    return redis.Redis(connection_pool=pool)


class _Publisher:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="workbench-broadcast", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def put(self, group: str, message: Any) -> None:
        self._queue.put((group, message))

    def close(self, timeout: float = 2.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        # A plain daemon thread: it blocks on the queue, then PUBLISHes everything queued, a pipeline per
        # shard, in the wire format of the pub/sub channel layer readers use.
        groups = Groups()
        sent_at = -LINGER_SECONDS
        while True:
            batch = [self._queue.get()]
            # Take what is already queued. In a burst (the last pipeline went out moments ago and more is
            # queued) linger a moment more, so that it costs one pipeline, not one round trip (and one fight
            # for the GIL with the appending threads) each. After a quiet moment whatever is queued goes out
            # at once: the first token of an answer (its event_start and first delta), or an event in a
            # quiet session, is what a user waits for.
            with contextlib.suppress(queue.Empty):
                while len(batch) < 500 and batch[-1] is not None:
                    batch.append(self._queue.get_nowait())
            now = time.monotonic()
            deadline = now + LINGER_SECONDS if now - sent_at < LINGER_SECONDS else now
            while 1 < len(batch) < 500 and None not in batch and time.monotonic() < deadline:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            stop = None in batch
            wired: list[tuple[str, bytes]] = []
            for group, message in (item for item in batch if item is not None):
                try:
                    wired.append((group, _wire(groups.layer, message)))
                except Exception:  # noqa: BLE001 - one message that cannot be encoded must not cost the rest
                    logger.warning(
                        "a live message for %s could not be encoded and is dropped", group, exc_info=True
                    )
            if not groups.publish(wired):
                sent_at = time.monotonic()
            if stop:
                return


_lock = threading.Lock()
_instance: _Publisher | None = None


def _publisher() -> _Publisher:
    global _instance
    if _instance is None or not _instance._thread.is_alive():
        with _lock:
            if _instance is None or not _instance._thread.is_alive():
                _instance = _Publisher()
    return _instance
