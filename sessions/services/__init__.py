"""Writes to sessions: the log itself (`emit_event`), the session's life, and what users send it."""

from sessions.services.log import SessionNotFound, StaleEpoch, emit_event, emit_events

__all__ = ["SessionNotFound", "StaleEpoch", "emit_event", "emit_events"]
