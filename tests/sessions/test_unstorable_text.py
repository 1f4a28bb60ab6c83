"""Text no database or model request can take (a NUL, an unpaired surrogate) is stored spelled out, and the
live broadcast survives a message it cannot encode. On SQLite and on PostgreSQL."""

from __future__ import annotations

import time

import pytest
import redis
from channels.layers import channel_layers
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from sessions import broadcast
from sessions.models import Event
from sessions.services import emit_event
from tests.conftest import make_session

pytestmark = pytest.mark.django_db

HOSTILE = {
    "type": "agent.tool_result",
    "tool_use_id": "sevt_1",
    "is_error": False,
    "content": [{"type": "text", "text": "a\x00b \ud800 \udfff é 😀"}],
    "odd\x00key": ["\udc80.txt"],
}
SPELLED_OUT = {
    "tool_use_id": "sevt_1",
    "is_error": False,
    "content": [{"type": "text", "text": "a\\u0000b \\ud800 \\udfff é 😀"}],
    "odd\\u0000key": ["\\udc80.txt"],
}


def test_emit_event_spells_out_nuls_and_unpaired_surrogates_in_keys_and_values():
    session_id = make_session()
    event = emit_event(session_id, HOSTILE)
    assert event.payload == SPELLED_OUT
    assert Event.objects.get(pk=event.pk).payload == SPELLED_OUT
    assert "\x00" in HOSTILE["content"][0]["text"]  # the caller's event is left as it was


def test_emit_event_inside_a_transaction_spells_them_out_too():
    session_id = make_session()
    with transaction.atomic():
        event = emit_event(session_id, HOSTILE)
    assert Event.objects.get(pk=event.pk).payload == SPELLED_OUT


def _subscribe(group: str) -> redis.client.PubSub:
    prefix = settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix", "asgi")
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(f"{prefix}__group__{group}")
    return pubsub


def _received(pubsub: redis.client.PubSub, count: int, *, timeout: float = 30) -> list[dict]:
    layer = channel_layers.make_backend("default")
    messages: list[dict] = []
    give_up = time.monotonic() + timeout
    while len(messages) < count and time.monotonic() < give_up:
        raw = pubsub.get_message(timeout=1)
        if raw is not None:
            messages.append(layer.deserialize(raw["data"]))
    return messages


def test_the_broadcast_thread_survives_a_message_it_cannot_encode_and_delivers_the_rest(redis_url):
    group = broadcast.group_name("sesn_unencodable")
    pubsub = _subscribe(group)
    publisher = broadcast._Publisher()
    try:
        bad_preview = {
            "type": "session.preview",
            "session": "sesn_unencodable",
            "seq": 1,
            "event_type": "agent.message",
            "preview": {"text": "hi \ud800"},
        }
        # An event that slipped past the log's escaping still goes out, as its stamp.
        bad_event = Event(
            uid="sevt_bad",
            session_id="sesn_unencodable",
            seq=2,
            type="agent.message",
            payload={"content": [{"type": "text", "text": "\udfff"}]},
            processed_at=timezone.now(),
        )
        good = {
            "type": "session.preview",
            "session": "sesn_unencodable",
            "seq": 3,
            "event_type": "agent.message",
            "preview": {"text": "fine"},
        }
        for message in (bad_preview, bad_event, good):
            publisher.put(group, message)
        stamp = {"type": "session.event", "session": "sesn_unencodable", "seq": 2, "event": None}
        assert _received(pubsub, 2) == [stamp, good]
        publisher.put(group, {**good, "seq": 4})
        assert _received(pubsub, 1) == [{**good, "seq": 4}]
        assert publisher._thread.is_alive()
    finally:
        publisher.close()
        pubsub.close()
