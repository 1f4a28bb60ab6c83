"""Fixtures of the brain's tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.test import override_settings

from harness import model


@pytest.fixture
def model_url(offline_model):
    """The brains of this process talk to the offline model, and retry a failed request at once."""
    with override_settings(ANTHROPIC_BASE_URL=offline_model.base_url, MODEL_RETRY_BASE_SECONDS=0.01):
        model.client.cache_clear()
        yield offline_model
    model.client.cache_clear()


@dataclass
class Streams:
    """The model streams this process opens: `sent` once a request began to go out, `closed` once one of
    the streams was closed."""

    opened: list[Any] = field(default_factory=list)
    sent: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> Streams:
    """Watches `harness.model._create_stream`, whichever thread sends (the requests still go out)."""
    watched = Streams()
    real = model._create_stream

    def create(request: dict[str, Any]) -> Any:
        watched.sent.set()
        stream = real(request)
        close = stream.close

        def closing() -> None:
            close()
            watched.closed.set()

        stream.close = closing  # type: ignore[method-assign]
        watched.opened.append(stream)
        return stream

    monkeypatch.setattr(model, "_create_stream", create)
    return watched
