"""The UI's WebSocket on a session: `/ws/sessions/<id>/?after=<seq>`."""

from __future__ import annotations

import asyncio
import contextlib
from importlib import import_module
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user

from kernel.api.validation import text_problem
from kernel.auth import api_key_from_headers, scope_is_authenticated
from kernel.tenancy import role_of
from sessions.broadcast import group_name
from sessions.models import Session
from sessions.services import SessionNotFound
from sessions.stream import Sequencer

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400


def watchable_length(scope: dict[str, Any], session_id: str) -> tuple[int, str]:
    """The session's length and workspace, if the socket's caller may watch it: an API key of its workspace, or
    a member of it in any role (viewers read). Another workspace's session raises `SessionNotFound`, exactly as
    a missing one does, so ids do not leak."""
    found = Session.objects.live().filter(id=session_id).values_list("next_seq", "workspace_id").first()
    if found is None or not _may_watch(scope, found[1]):
        raise SessionNotFound(session_id)
    return found


def _may_watch(scope: dict[str, Any], workspace_id: str) -> bool:
    key = scope.get("api_key")
    if key is not None:
        return bool(key.workspace_id == workspace_id)
    return role_of(scope["user"], workspace_id) is not None


def credential_refusal(scope: dict[str, Any], workspace_id: str) -> str | None:
    """Why the credential a socket connected with no longer opens it (the API key was revoked; the operator
    logged out, is no longer active or staff, or left the session's workspace); None while it still does. The
    rule of connecting, asked again of the database rather than of what the scope held then."""
    if scope.get("api_key") is not None:
        headers = {name.decode("latin1").lower(): value.decode("latin1") for name, value in scope["headers"]}
        if api_key_from_headers(headers) is not None:
            return None
        return "This socket's API key was revoked; the socket is closed. Connect again with a valid key."
    session_key = getattr(scope.get("session"), "session_key", None)
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    user = get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]  # all it reads is the session
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return "You are logged out, or your account is no longer an active operator; the socket is closed. Log in again."
    if role_of(user, workspace_id) is None:
        return "You are no longer a member of this session's workspace; the socket is closed."
    return None


_credential_refusal = database_sync_to_async(credential_refusal, thread_sensitive=False)


class SessionConsumer(AsyncJsonWebsocketConsumer):
    """Sends `{"type": "event", "session", "seq", "event"}` for every event after `after`, exactly once
    and in order, then live ones; previews go out as `{"type": "preview", ...}`. Every STREAM_RECHECK_SECONDS
    it asks whether its credential still opens it, and closes with an error (4401) once it does not. A session
    of a workspace the caller cannot see closes the socket as a missing one does (4404)."""

    ended = False

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
            length, self.workspace_id = await database_sync_to_async(watchable_length)(
                self.scope, self.session_id
            )
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

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """The socket only sends: any frame from the client, text or binary, gets this answer unread. Parsing it
        as JSON (the base class does) let a binary frame, text that is not JSON or an array nested too deeply
        end the consumer with an exception, and Daphne dropped the connection instead of answering."""
        await self.send_json({"type": "error", "message": "This socket only sends; post events to the API."})

    async def session_event(self, message: dict[str, Any]) -> None:
        async with self.lock:
            if not self.ended:
                await self._send_events(await self.sequencer.on_broadcast(message))

    async def session_preview(self, message: dict[str, Any]) -> None:
        if self.ended:
            return
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
        """Catches up every STREAM_CATCHUP_SECONDS; asks again for the credential every STREAM_RECHECK_SECONDS."""
        loop = asyncio.get_running_loop()
        catch_up_at = loop.time() + settings.STREAM_CATCHUP_SECONDS
        recheck_at = loop.time() + settings.STREAM_RECHECK_SECONDS
        while True:
            await asyncio.sleep(max(0.0, min(catch_up_at, recheck_at) - loop.time()))
            now = loop.time()
            if now >= recheck_at:
                recheck_at = now + settings.STREAM_RECHECK_SECONDS
                refusal = await _credential_refusal(self.scope, self.workspace_id)
                if refusal is not None:
                    await self._end(CLOSE_UNAUTHENTICATED, refusal)
                    return
            if now >= catch_up_at:
                catch_up_at = now + settings.STREAM_CATCHUP_SECONDS
                async with self.lock:
                    await self._send_events(await self.sequencer.catch_up())

    async def _end(self, code: int, message: str) -> None:
        """Say why and close; nothing is sent after it (broadcasts may still arrive until the disconnect)."""
        async with self.lock:
            self.ended = True
            await self.send_json({"type": "error", "message": message})
            await self.close(code=code)

    async def _send_events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        for seq, event in events:
            await self.send_json({"type": "event", "session": self.session_id, "seq": seq, "event": event})
