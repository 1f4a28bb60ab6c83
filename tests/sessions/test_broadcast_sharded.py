"""The broadcaster against channels_redis itself, on two Redis servers configured as sharded channel-layer hosts:
a consumer of the real pub/sub layer receives everything it publishes, for groups on either shard, and the
bytes are those the layer's own `group_send` puts on the same server."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from channels.layers import channel_layers
from django.test import override_settings

from sessions import broadcast
from sessions.models import Event
from tests.conftest import require

GROUPS = [broadcast.group_name(f"sesn_shard{i}") for i in range(16)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_redis() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=0.2).ping()
            return server, url
        except redis.ConnectionError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"redis-server on port {port} did not start") from None
            time.sleep(0.05)


@pytest.fixture
def shards() -> Iterator[tuple[list[subprocess.Popen[bytes]], list[str]]]:
    """Two Redis servers of this test's own, as the hosts of a sharded pub/sub channel layer."""
    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    started = [_start_redis(), _start_redis()]
    servers, urls = [server for server, _ in started], [url for _, url in started]
    layers = {
        "default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": urls}}
    }
    try:
        with override_settings(CHANNEL_LAYERS=layers):
            yield servers, urls
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(10)


def _event(session_id: str, seq: int, text: str) -> Event:
    return Event(
        uid=f"sevt_{session_id}_{seq}",
        session_id=session_id,
        seq=seq,
        type="agent.message",
        payload={"content": [{"type": "text", "text": text}]},
        processed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _subscribed_groups(urls: list[str]) -> list[set[bytes]]:
    return [set(redis.Redis.from_url(url).pubsub_channels("*__group__*")) for url in urls]


def _watch(url: str) -> redis.client.PubSub:
    """A raw subscriber to every channel of one server, past its subscription's confirmation."""
    watcher = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    watcher.psubscribe("*")
    _drain(watcher)
    return watcher


def _drain(watcher: redis.client.PubSub) -> set[tuple[bytes, bytes]]:
    """What reached the watcher, until it has been quiet for half a second."""
    got: set[tuple[bytes, bytes]] = set()
    quiet_until = time.monotonic() + 0.5
    while time.monotonic() < quiet_until:
        message = watcher.get_message(timeout=0.1)
        if message is not None:
            got.add((message["channel"], message["data"]))
            quiet_until = time.monotonic() + 0.5
    return got


def test_a_real_layer_consumer_gets_every_message_published_to_groups_on_both_shards(shards: Any) -> None:
    _, urls = shards
    layer = channel_layers.make_backend("default")
    per_group = 30
    big = "x" * (broadcast.INLINE_EVENT_LIMIT + 1)

    def publish_all() -> list[tuple[str, dict[str, Any]]]:
        publisher = broadcast._Publisher()
        sent: list[tuple[str, dict[str, Any]]] = []
        for seq in range(per_group):
            for group in GROUPS:
                session_id = group.removeprefix("session.")
                if seq % 3 == 0:
                    event = _event(session_id, seq, big if seq == 3 else f"event {seq}")
                    publisher.put(group, event)
                    sent.append((group, broadcast.event_message(event, inline=seq != 3)))
                else:
                    preview = {"type": "session.preview", "session": session_id, "seq": seq, "preview": {}}
                    publisher.put(group, preview)
                    sent.append((group, preview))
        publisher.close(timeout=30)
        return sent

    async def scenario() -> tuple[list[set[bytes]], list[tuple[str, dict[str, Any]]], dict[str, list[Any]]]:
        channels = {group: await layer.new_channel() for group in GROUPS}
        for group, channel in channels.items():
            await layer.group_add(group, channel)
        subscribed = await asyncio.to_thread(_subscribed_groups, urls)
        sent = await asyncio.to_thread(publish_all)
        received: dict[str, list[Any]] = {group: [] for group in GROUPS}
        for group, channel in channels.items():
            for _ in range(per_group):
                received[group].append(await asyncio.wait_for(layer.receive(channel), 10))
        return subscribed, sent, received

    subscribed, sent, received = asyncio.run(scenario())
    assert all(subscribed) and sum(map(len, subscribed)) == len(GROUPS), (
        f"the layer must have put the groups on both shards: {[len(s) for s in subscribed]} per server"
    )
    for group in GROUPS:
        assert received[group] == [message for to, message in sent if to == group], group
    stamp, inline = received[GROUPS[0]][3], received[GROUPS[0]][6]
    assert stamp["seq"] == 3 and stamp["event"] is None, "an event too large to inline goes out as its stamp"
    assert inline["event"]["content"] == [{"type": "text", "text": "event 6"}]


def test_the_adapter_puts_the_bytes_group_send_puts_on_the_same_server(shards: Any) -> None:
    _, urls = shards
    layer = channel_layers.make_backend("default")
    groups = broadcast.Groups()
    watchers = [_watch(url) for url in urls]
    messages = {
        group: {"type": "session.preview", "session": group, "seq": 1, "é": [1.5]} for group in GROUPS
    }

    async def by_the_layer() -> None:
        for group, message in messages.items():
            await layer.group_send(group, message)

    asyncio.run(by_the_layer())
    expected = [_drain(watcher) for watcher in watchers]
    assert all(expected) and sum(map(len, expected)) == len(GROUPS)
    assert groups.publish((group, layer.serialize(message)) for group, message in messages.items()) == 0
    assert [_drain(watcher) for watcher in watchers] == expected


def test_a_shard_that_is_down_costs_only_its_own_groups_messages(shards: Any) -> None:
    servers, urls = shards
    groups = broadcast.Groups()
    on = [[g for g in GROUPS if groups.shard(groups.channel(g)) == i] for i in range(2)]
    assert on[0] and on[1]
    watcher = _watch(urls[0])
    servers[1].terminate()
    servers[1].wait(10)
    assert groups.publish((group, b"hint") for group in GROUPS) == len(on[1])
    assert {channel.decode() for channel, _ in _drain(watcher)} == {groups.channel(group) for group in on[0]}
