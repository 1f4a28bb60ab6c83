"""Checks for request bodies and queries that say exactly which field is wrong and why."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from kernel.errors import Invalid

MISSING: Any = object()

# What no text the platform keeps may hold: NUL (PostgreSQL's jsonb and text refuse it) and UTF-16 surrogates,
# which UTF-8 cannot encode (for the database, or the model's request). In a parsed body every surrogate is
# unpaired: json.loads joins a pair's \u escapes into the one character they stand for.
NOT_TEXT = re.compile("[\x00\ud800-\udfff]")
# How deeply a request body may nest: enough for any schema the API takes, far from Python's recursion limit.
MAX_BODY_DEPTH = 64

_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer"}


def describe(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def text_problem(value: str) -> str | None:
    """What makes `value` unusable as text (a NUL, or an unpaired surrogate, and where), if anything."""
    found = NOT_TEXT.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return f"a NUL character (U+0000) at index {found.start()}, which text may not contain; remove it"
    return (
        f"an unpaired surrogate (U+{ord(found.group()):04X}) at index {found.start()}, which is not a Unicode "
        "character; send valid UTF-8 (a \\u escape of a character above U+FFFF needs both halves of its pair)"
    )


def check_text(value: str, where: str) -> None:
    problem = text_problem(value)
    if problem:
        raise Invalid(f"{where} holds {problem}.")


Path = tuple[Any, str | int] | None  # (the parent's path, this key or index), None at the body itself


def check_body(body: Any, *, max_depth: int = MAX_BODY_DEPTH) -> None:
    """Refuse a parsed body nested deeper than `max_depth`, or with a key or string that is not text.

    One walk with a queue of its own, before any handler (or the database) sees the body: no nesting can
    exhaust Python's stack here, and the error names the JSON path of what is wrong.
    """
    queue: deque[tuple[Any, Path, int]] = deque([(body, None, 1)])
    while queue:
        value, path, depth = queue.popleft()
        if depth > max_depth:
            raise Invalid(
                f"The request body nests more than {max_depth} levels deep (at '{_path(path)}'); flatten it."
            )
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if isinstance(key, str) and (problem := text_problem(key)):
                raise Invalid(f"A key of '{_path(path) or 'the body'}' ({json.dumps(key)}) holds {problem}.")
            if isinstance(item, str):
                check_text(item, f"'{_path((path, key))}'")
            elif isinstance(item, dict | list):
                queue.append((item, (path, key), depth + 1))


def _path(path: Path) -> str:
    """A JSON path as the error messages name fields: `events[0].content[0].text`."""
    parts: list[str] = []
    while path is not None:
        path, key = path
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif key.isidentifier():
            parts.append(f".{key}")
        else:
            parts.append(f"[{json.dumps(key)}]")
    return "".join(reversed(parts)).removeprefix(".")


def expect(value: Any, kind: type, where: str, *, nullable: bool = False) -> Any:
    if value is None and nullable:
        return None
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise Invalid(f"{where} must be {_TYPE_NAMES.get(kind, kind.__name__)}, not {describe(value)}.")
    return value


def no_unknown_fields(body: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise Invalid(
            f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(repr(u) for u in unknown)}; "
            f"allowed fields are {', '.join(sorted(allowed))}."
        )


def field(
    body: Mapping[str, Any],
    key: str,
    kind: type,
    where: str = "",
    *,
    required: bool = False,
    nullable: bool = False,
    default: Any = MISSING,
) -> Any:
    name = f"{where}.{key}" if where else key
    if key not in body:
        if required:
            raise Invalid(f"'{name}' is required.")
        return default
    return expect(body[key], kind, f"'{name}'", nullable=nullable)


def text(
    body: Mapping[str, Any],
    key: str,
    where: str = "",
    *,
    required: bool = False,
    nullable: bool = False,
    max_length: int | None = None,
    min_length: int = 0,
    default: Any = MISSING,
) -> Any:
    value = field(body, key, str, where, required=required, nullable=nullable, default=default)
    if isinstance(value, str):
        name = f"{where}.{key}" if where else key
        if len(value) < min_length:
            raise Invalid(
                f"'{name}' must not be empty."
                if min_length == 1
                else f"'{name}' must be at least {min_length} characters."
            )
        if max_length is not None and len(value) > max_length:
            raise Invalid(f"'{name}' must be at most {max_length} characters, not {len(value)}.")
    return value


def check_metadata(value: Any, where: str = "metadata", *, patch: bool = False) -> dict[str, Any]:
    """Up to 16 string pairs, keys ≤ 64 and values ≤ 512 characters; a patch may delete with null."""
    expect(value, dict, f"'{where}'")
    if len(value) > 16:
        raise Invalid(f"'{where}' has {len(value)} keys; at most 16 are allowed.")
    for key, item in value.items():
        if not key or len(key) > 64:
            raise Invalid(f"'{where}' keys must be 1 to 64 characters; {key!r} is not.")
        if item is None and patch:
            continue
        if not isinstance(item, str):
            raise Invalid(
                f"'{where}.{key}' must be a string{' or null' if patch else ''}, not {describe(item)}."
            )
        if len(item) > 512:
            raise Invalid(f"'{where}.{key}' must be at most 512 characters.")
    return value


def patch_metadata(current: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(current)
    for key, value in patch.items():
        if value is None or value == "":
            merged.pop(key, None)
        else:
            merged[key] = value
    if len(merged) > 16:
        raise Invalid(f"'metadata' would have {len(merged)} keys after this update; at most 16 are allowed.")
    return merged


def query_time(raw: str, name: str) -> datetime:
    """An aware datetime the database can take: a day that exists, and in UTC still inside years 1 to 9999."""
    try:
        value = parse_datetime(raw)
    except ValueError as error:  # the shape is right, the date is not (2026-13-45, 2026-02-30)
        raise Invalid(f"Query parameter '{name}' is not a real time ({error}): {raw!r}.") from None
    if value is None or value.tzinfo is None:
        raise Invalid(
            f"Query parameter '{name}' must be an RFC 3339 time with a zone, like "
            f"2026-01-01T00:00:00Z, not {raw!r}."
        )
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise Invalid(
            f"Query parameter '{name}' is outside the years 1 to 9999 once in UTC: {raw!r}."
        ) from None
    return value
