"""Public ids: a type prefix, then a time-ordered, unguessable suffix (Crockford base32)."""

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """`prefix_` + 10 chars of milliseconds + 16 random chars, so ids sort by creation time."""
    millis = time.time_ns() // 1_000_000
    return f"{prefix}_{_base32(millis, 10)}{_base32(int.from_bytes(os.urandom(10), 'big'), 16)}"
