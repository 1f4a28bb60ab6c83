"""Live readers of a session: every event after a seq exactly once, in order, then live ones.

A reader subscribes to the session's group first, then reads what it missed from the database, then
takes broadcasts. A broadcast whose seq is not the next one (a lost or reordered hint) makes it re-read
the log, and so does a quiet period, so the log, never the channel layer, decides what a reader sees.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from sessions.broadcast import group_name
from sessions.selectors import events_after, session_length

CATCH_UP_BATCH = 500


def _read_after(session_id: str, after_seq: int) -> list[tuple[int, dict[str, Any]]]:
    return [
        (event.seq, event.as_api()) for event in events_after(session_id, after_seq, limit=CATCH_UP_BATCH)
    ]


_read_after_async = database_sync_to_async(_read_after, thread_sensitive=False)
_length_async = database_sync_to_async(session_length, thread_sensitive=False)


class Sequencer:
    """Turns broadcasts and reads into a gapless, duplicate-free run of `(seq, event)`."""

    def __init__(self, session_id: str, last_seq: int):
        self.session_id = session_id
        self.last_seq = last_seq

    async def catch_up(self) -> list[tuple[int, dict[str, Any]]]:
        delivered: list[tuple[int, dict[str, Any]]] = []
        while True:
            batch = await _read_after_async(self.session_id, self.last_seq)
            delivered.extend(batch)
            if batch:
                self.last_seq = batch[-1][0]
            if len(batch) < CATCH_UP_BATCH:
                return delivered

    async def on_broadcast(self, message: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
        seq = message["seq"]
        if seq <= self.last_seq:
            return []
        if seq == self.last_seq + 1 and message.get("event") is not None:
            self.last_seq = seq
            return [(seq, message["event"])]
        return await self.catch_up()


def _sse(name: str, data: dict[str, Any], seq: int | None = None) -> str:
    """One SSE message; a log event's carries its seq as the message id, which a client that reconnects sends
    back as `Last-Event-ID` to read on from it."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def sse_tail(
    session_id: str,
    *,
    previews: frozenset[str],
    recheck: Callable[[], Awaitable[dict[str, Any] | None]] | None = None,
    after_seq: int | None = None,
) -> AsyncIterator[str]:
    """The SSE body of `events/stream`: events appended after the client attached (or, with `after_seq`,
    every event after that seq first: a client reconnecting with `Last-Event-ID`), with pings. Every
    `STREAM_RECHECK_SECONDS` it asks `recheck` whether the caller may still read it; an error envelope ends
    the stream with an `error` event (the SDK raises it), so a revoked credential stops reading."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group_name(session_id), channel)
    receive: asyncio.Future[Any] = asyncio.ensure_future(layer.receive(channel))
    try:
        last_seq = await _length_async(session_id) - 1
        sequencer = Sequencer(session_id, last_seq if after_seq is None else max(after_seq, -1))
        loop = asyncio.get_running_loop()
        last_write = last_check = loop.time()
        missed = await sequencer.catch_up() if after_seq is not None else []
        yield _sse("ping", {"type": "ping"}) + "".join(
            _sse(event["type"], event, seq) for seq, event in missed
        )
        while True:
            if recheck is not None and loop.time() - last_check >= settings.STREAM_RECHECK_SECONDS:
                last_check = loop.time()
                refusal = await recheck()
                if refusal is not None:
                    yield _sse("error", refusal)
                    return
            done, _ = await asyncio.wait({receive}, timeout=settings.STREAM_CATCHUP_SECONDS)
            chunks = []
            if done:
                message = receive.result()
                receive = asyncio.ensure_future(layer.receive(channel))
                if message["type"] == "session.event":
                    delivered = await sequencer.on_broadcast(message)
                else:
                    delivered = []
                    if message.get("event_type") in previews:
                        chunks.append(_sse(message["preview"]["type"], message["preview"]))
            else:
                delivered = await sequencer.catch_up()
            chunks[:0] = [_sse(event["type"], event, seq) for seq, event in delivered]
            if not chunks and loop.time() - last_write >= settings.STREAM_PING_SECONDS:
                chunks.append(_sse("ping", {"type": "ping"}))
            if chunks:
                last_write = loop.time()
                yield "".join(chunks)
    finally:
        receive.cancel()
        await layer.group_discard(group_name(session_id), channel)
