"""`Idempotency-Key` on every `/v1` POST: a retry with the same key gets the first request's answer.

A client that lost an answer (a timeout, a dropped connection) cannot tell whether its request was done;
retrying it with the key it first sent is safe. The key is claimed in its own committed row before the
handler runs, so a second request with it while the first still runs is told to wait (409, which the SDK
retries) instead of running twice; the answer is stored once the handler returns. A request refused with
an API error changed nothing, so its claim is dropped and the key can be used again. Keys belong to the API
key that sent them and are forgotten after IDEMPOTENCY_KEY_HOURS.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from kernel.api.errors import ApiError, Conflict, InvalidRequest
from kernel.errors import DomainError
from kernel.models import IdempotentRequest

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255


def _key(request: HttpRequest) -> str | None:
    key = request.headers.get(HEADER)
    if key is None or request.method != "POST":
        return None
    if not key or len(key) > MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
        raise InvalidRequest(f"The {HEADER} header must be 1 to {MAX_KEY_LENGTH} printable ASCII characters.")
    return key


def _fingerprint(request: HttpRequest) -> str:
    digest = hashlib.sha256(f"{request.method} {request.path}\n".encode())
    digest.update(request.body)
    return digest.hexdigest()


def _claim(request: HttpRequest, key: str, fingerprint: str) -> IdempotentRequest | None:
    """The stored request with this key (answered or still running), or None once this request claimed it."""
    api_key = request.api_key  # type: ignore[attr-defined]
    expired = timezone.now() - timedelta(hours=settings.IDEMPOTENCY_KEY_HOURS)
    IdempotentRequest.objects.filter(api_key=api_key, key=key, created_at__lt=expired).delete()
    try:
        with transaction.atomic():
            IdempotentRequest.objects.create(api_key=api_key, key=key, fingerprint=fingerprint)
        return None
    except IntegrityError:
        first = IdempotentRequest.objects.filter(api_key=api_key, key=key).first()
        if first is None:  # its claim was dropped just now (it was refused): ours to try again
            return _claim(request, key, fingerprint)
        return first


def idempotent(request: HttpRequest, run: Callable[[], HttpResponse]) -> HttpResponse:
    """`run()`, once per `Idempotency-Key`; without the header (or for other methods), simply `run()`.
    Keys are remembered per API key: a narrower credential (kernel.auth.Principal) is not."""
    key = _key(request)
    if key is None or getattr(request, "api_key", None) is None:
        return run()
    fingerprint = _fingerprint(request)
    first = _claim(request, key, fingerprint)
    if first is not None:
        if first.fingerprint != fingerprint:
            raise InvalidRequest(
                f"This {HEADER} was already used for a different request (another path or "
                "body); send a new key for a new request."
            )
        if first.status is None:
            raise Conflict(
                f"A request with this {HEADER} is still being processed; retry in a moment to get its answer."
            )
        replay = HttpResponse(first.body, status=first.status, content_type="application/json")
        replay[REPLAYED_HEADER] = "true"
        return replay
    claimed = IdempotentRequest.objects.filter(api_key=request.api_key, key=key)  # type: ignore[attr-defined]
    try:
        response = run()
    except (ApiError, DomainError):  # refused: nothing was done, so the key may be used again
        claimed.delete()
        raise
    except BaseException:
        # Its effect is unknown (it may have committed): answer retries with the same error, never run it again.
        claimed.update(status=500, body=_internal_error_body())
        raise
    claimed.update(status=response.status_code, body=response.content.decode())
    return response


def _internal_error_body() -> str:
    return json.dumps(
        {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": "The first request with this Idempotency-Key failed with an internal error, after which its "
                "effect is unknown; check the resource, then send a new key.",
            },
        }
    )
