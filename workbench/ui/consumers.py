"""The session page's socket: the session socket, with each new event's timeline node rendered once for
every page that watches the session."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async

from sessions.consumers import SessionConsumer
from workbench.ui.views.timeline import fragment

_fragment = database_sync_to_async(fragment, thread_sensitive=False)
# Renderings in progress in this process, so that the pages watching a session, all told of an event at
# once, wait for one rendering instead of starting one each (`fragment` shares it once it is done).
_rendering: dict[tuple[str, int], asyncio.Future[tuple[int, int, int, str]]] = {}


async def event_node(session_id: str, seq: int) -> str:
    key = (session_id, seq)
    future = _rendering.get(key)
    if future is None:
        future = _rendering[key] = asyncio.ensure_future(_fragment(session_id, seq, seq + 1))
        future.add_done_callback(lambda _: _rendering.pop(key, None))
    return (await asyncio.shield(future))[3]


class TimelineConsumer(SessionConsumer):
    """Sends what the session socket sends; a live event comes with `html`, its node as the events fragment
    renders it. Without it every watching page asks the server for every new event's node: a request per
    page per event.

    A catch-up run of several events (after a reconnect or a lost broadcast) goes without: the page fetches
    the run as one slice."""

    async def _send_events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        if len(events) != 1:
            await super()._send_events(events)
            return
        seq, event = events[0]
        html = await event_node(self.session_id, seq)
        await self.send_json(
            {"type": "event", "session": self.session_id, "seq": seq, "event": event, "html": html}
        )
