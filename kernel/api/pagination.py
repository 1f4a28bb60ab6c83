"""Opaque page cursors: the keyset position to continue from, signed so a client cannot forge one."""

from __future__ import annotations

import base64
import json
from typing import Any

from django.core import signing
from django.db.models import Q
from django.utils.dateparse import parse_datetime

from kernel.api.errors import InvalidRequest

_SALT = "workbench.page"


def encode_cursor(position: dict[str, Any]) -> str:
    signed = signing.dumps(position, salt=_SALT, compress=False)
    return base64.urlsafe_b64encode(signed.encode()).decode().rstrip("=")


def decode_cursor(token: str, *, expect_keys: tuple[str, ...]) -> dict[str, Any]:
    try:
        padded = token + "=" * (-len(token) % 4)
        position = signing.loads(base64.urlsafe_b64decode(padded.encode()).decode(), salt=_SALT)
    except (ValueError, UnicodeDecodeError, signing.BadSignature, json.JSONDecodeError):
        raise InvalidRequest(
            "The 'page' cursor is not valid: pass back exactly the next_page or prev_page value of an "
            "earlier response with the same query."
        ) from None
    if not isinstance(position, dict) or any(key not in position for key in expect_keys):
        raise InvalidRequest("The 'page' cursor does not belong to this list; start again without 'page'.")
    return position


def keyset_page(
    queryset: Any, token: str | None, *, order: str, limit: int, bidirectional: bool = False
) -> dict[str, Any]:
    """One page of rows ordered by `(created_at, id)` in `order`, with opaque cursors to either side.

    Returns `{"rows", "next_page", "prev_page"}`; `prev_page` is only computed when `bidirectional`.
    """
    direction = "next"
    if token:
        position = decode_cursor(token, expect_keys=("c", "i", "d", "o"))
        if position["o"] != order:
            raise InvalidRequest(
                "The 'page' cursor was made for another 'order'; start again without 'page'."
            )
        direction = position["d"]
        created, ident = parse_datetime(position["c"]), position["i"]
        forward = (order == "asc") == (direction == "next")
        if forward:
            queryset = queryset.filter(Q(created_at__gt=created) | Q(created_at=created, id__gt=ident))
        else:
            queryset = queryset.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=ident))
    forward = (order == "asc") == (direction == "next")
    ordering = ("created_at", "id") if forward else ("-created_at", "-id")
    rows = list(queryset.order_by(*ordering)[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    if direction == "prev":
        rows.reverse()

    def cursor(row: Any, towards: str) -> str:
        return encode_cursor({"c": row.created_at.isoformat(), "i": row.id, "d": towards, "o": order})

    has_next = more if direction == "next" else bool(token)
    has_prev = more if direction == "prev" else bool(token)
    return {
        "rows": rows,
        "next_page": cursor(rows[-1], "next") if rows and has_next else None,
        "prev_page": cursor(rows[0], "prev") if rows and has_prev and bidirectional else None,
    }
