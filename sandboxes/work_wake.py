"""Waking long polls: a Redis pub/sub channel per environment, told after a commit that put work in its queue.

Only a hint: the queue is the rows. A poll that hears nothing (or whose Redis is down) looks at the rows
again before it answers, so a lost wake-up costs latency, never an item.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial

import redis
from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

# Without Redis a waiting poll looks at the rows this often instead.
FALLBACK_INTERVAL_SECONDS = 0.1

_lock = threading.Lock()
_clients: dict[str, redis.Redis] = {}


def channel(environment_id: str) -> str:
    return f"workbench:work:{environment_id}"


def _client() -> redis.Redis:
    url = settings.REDIS_URL
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5)
        return _clients[url]


def _publish(environment_id: str) -> None:
    try:
        _client().publish(channel(environment_id), b"work")
    except redis.RedisError as error:
        logger.info(
            "could not wake the pollers of %s (they look again within a poll): %s", environment_id, error
        )


def wake_pollers(environment_id: str) -> None:
    """Tell the environment's waiting polls that work arrived, once the caller's transaction commits."""
    transaction.on_commit(partial(_publish, environment_id))


Wait = Callable[[float], None]


@contextmanager
def listening(environment_id: str) -> Iterator[Wait]:
    """Listen for the environment's wake-ups from now on; yields `wait(seconds)`, which returns when one
    arrives or the time is up. Subscribed before it yields, so a wake-up sent after that is not missed."""
    try:
        pubsub = _client().pubsub(ignore_subscribe_messages=False)
        pubsub.subscribe(channel(environment_id))
        pubsub.get_message(timeout=1.0)  # the subscription's confirmation: from here on nothing is missed
    except redis.RedisError as error:
        logger.info(
            "long poll of %s without Redis (%s): looking at the queue every %ss",
            environment_id,
            error,
            FALLBACK_INTERVAL_SECONDS,
        )
        yield lambda seconds: time.sleep(min(seconds, FALLBACK_INTERVAL_SECONDS))
        return

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while (left := deadline - time.monotonic()) > 0:
                message = pubsub.get_message(timeout=left)
                if message is not None and message.get("type") == "message":
                    return
        except redis.RedisError:
            time.sleep(min(max(deadline - time.monotonic(), 0), FALLBACK_INTERVAL_SECONDS))

    try:
        yield wait
    finally:
        with suppress(redis.RedisError):
            pubsub.close()
