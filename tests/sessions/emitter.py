"""A separate process that appends events, for the concurrency tests: `python -m tests.sessions.emitter`."""

from __future__ import annotations

import sys

import django


def main(session_id: str, writer: int, count: int) -> None:
    django.setup()
    from sessions.services import emit_event

    for i in range(count):
        emit_event(
            session_id, {"type": "system.message", "content": [{"type": "text", "text": f"w{writer}-{i}"}]}
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
