"""One tool call as the daemon runs it: its id, its time limit and its cancellation."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .errors import Failed


@dataclass
class Call:
    id: str
    timeout_s: float
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        return self.started + self.timeout_s

    def check(self) -> None:
        """Stop a long-running tool (glob, grep, read) between steps when the call must end."""
        if self.cancel.is_set():
            raise Failed("interrupted: the call was cancelled")
        if time.monotonic() > self.deadline:
            raise Failed(f"timed out after {self.timeout_s:g} s")
