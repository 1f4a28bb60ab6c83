"""Fixtures of the brain's tests."""

from __future__ import annotations

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
