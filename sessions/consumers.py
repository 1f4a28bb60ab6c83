"""The UI's WebSocket on a session: `/ws/sessions/<id>/?after=<seq>`."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from kernel.api.validation import text_problem
from kernel.auth import scope_is_authenticated
from sessions.broadcast import group_name
from sessions.selectors import session_length
from sessions.services import SessionNotFound
from sessions.stream import Sequencer

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400


class SessionConsumer(AsyncJsonWebsocketConsumer):
    """Sends `{"type": "event", "session", "seq", "event"}` for every event after `after`, exactly once
    and in order, then live ones; previews go out as `{"type": "preview", ...}`."""

    async def connect(self) -> None:
        self.session_id = self.scope["url_route"]["kwargs"]["session_id"]
        if not scope_is_authenticated(self.scope):
            await self._refuse(CLOSE_UNAUTHENTICATED, "Log in as an operator or send an API key header.")
            return
        problem = text_problem(self.session_id)
        if problem:
            await self._refuse(CLOSE_BAD_REQUEST, f"The session id in the path holds {problem}.")
            return
        try:
            length = await database_sync_to_async(session_length)(self.session_id)
        except SessionNotFound as missing:
            await self._refuse(CLOSE_NOT_FOUND, missing.message)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        after = query.get("after", [str(length - 1)])[0]
        try:
            after_seq = int(after)
        except ValueError:
            await self._refuse(CLOSE_BAD_REQUEST, f"'after' must be an integer seq, not {after!r}.")
            return
        self.group = group_name(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.sequencer = Sequencer(self.session_id, max(after_seq, -1))
        self.lock = asyncio.Lock()
        async with self.lock:
            await self._send_events(await self.sequencer.catch_up())
        self.ticker = asyncio.create_task(self._tick())

    async def _refuse(self, code: int, message: str) -> None:
        await self.accept()
        await self.send_json({"type": "error", "message": message})
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        ticker = getattr(self, "ticker", None)
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json({"type": "error", "message": "This socket only sends; post events to the API."})

    async def session_event(self, message: dict[str, Any]) -> None:
        async with self.lock:
            await self._send_events(await self.sequencer.on_broadcast(message))

    async def session_preview(self, message: dict[str, Any]) -> None:
        await self.send_json(
            {
                "type": "preview",
                "session": message["session"],
                "seq": message["seq"],
                "event_type": message["event_type"],
                "preview": message["preview"],
            }
        )

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(settings.STREAM_CATCHUP_SECONDS)
            async with self.lock:
                await self._send_events(await self.sequencer.catch_up())

    async def _send_events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        for seq, event in events:
            await self.send_json({"type": "event", "session": self.session_id, "seq": seq, "event": event})
