"""Provisioning ahead: a session's sandbox started while its model thinks.

Lazy provisioning lets inference start at once, but then the first tool call waits for the sandbox and the
session's repositories. So when a turn's model request has gone out and the session will likely need its
sandbox, the brain provisions it in a thread beside the request; the first tool call takes it when it is
ready, or waits only for the rest. The policy is SPECULATIVE_PROVISIONING, or an environment's
config.sandbox.speculative: "auto" when the agent has the toolset and the session has resources its sandbox
is prepared with (repositories, files); "always" with the toolset alone; "never". Whatever the policy, no turn
provisions ahead while SPECULATIVE_MAX_IN_FLIGHT sandboxes are being provisioned (sandboxes/hands.py): that
is the work shed first when the engine falls behind.

The thread waits for the model to answer the request (its response's headers; at most AHEAD_GATE_SECONDS)
before it begins: in the same process as the request, its first queries took the interpreter from the thread
sending it, and its session's streaming path was 3-5 ms longer than that of sessions not provisioning ahead
measured in the same seconds (bench/ttft's phase 2 control: p50 14.1 against 8.7 ms, 14.4 against 11.3, 19.0
against 16.2); waiting, as long (9.4 against 9.0, 9.8 against 10.2). The model's time to first token is
hundreds of milliseconds at the least, so the overlap loses nothing that matters.

The thread provisions as the brain, under its lease: the row carries the brain's epoch and the events are
appended with it, so they are refused once the lease is lost. The brain waits for the thread before any
tool of the toolset or the hands runs, and before it releases the lease: no other brain of the session
ever finds the provisioning in flight. A turn that ends before the thread does (the model answered without a
tool) keeps the lease while it runs, watching the log: a user's next message is taken at once by the same
brain, its model request going out beside the provisioning as the first one did, instead of after it. A brain
that dies meanwhile leaves what a brain dying in a lazy provisioning leaves: a row the next brain gives up (an
older epoch's), or a sandbox it uses. One that no tool call ever uses is reaped when idle
(sandboxes/reaper.py, SPECULATIVE_IDLE_SECONDS), or, once its session ended, goes back to its environment for
the next session with the same resources (sandboxes/returns.py, SPECULATIVE_RETURNED_MAX).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connections

from sandboxes.hands import sandbox_provision_ahead
from sandboxes.providers import SandboxError
from sessions.services import StaleEpoch, emit_events

logger = logging.getLogger(__name__)

AHEAD_GATE_SECONDS = 0.05  # the longest a provisioning ahead waits for its model request to be answered


def speculating(policy: str, *, toolset: bool, lazy: bool) -> bool:
    """Whether a turn may provision ahead: a lazy environment's, with the toolset, by a policy not "never"."""
    return toolset and lazy and policy in ("auto", "always")


class Ahead:
    """One provisioning ahead, in a thread of its own (with its own database connection, closed at its end)."""

    def __init__(self, session_id: str, *, epoch: int, always: bool) -> None:
        self.session_id, self.epoch, self._always = session_id, epoch, always
        self._answered = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ahead-{session_id}", daemon=True)
        self._thread.start()

    def answered(self) -> None:
        """The model answered the request this provisioning goes beside: it may begin."""
        self._answered.set()

    def _emit(self, event: dict[str, Any]) -> Any:
        return emit_events(self.session_id, [(event, None)], epoch=self.epoch)[0]

    def _run(self) -> None:
        self._answered.wait(AHEAD_GATE_SECONDS)
        try:
            sandbox_provision_ahead(self.session_id, always=self._always, emit=self._emit)
        except (SandboxError, StaleEpoch) as error:
            # A failure is in the log as sandbox.failed, and the tool call provisions again; a lost lease
            # is the brain's to notice.
            logger.info("session %s: provisioning ahead failed: %s", self.session_id, error)
        except Exception:
            logger.exception("session %s: provisioning ahead failed", self.session_id)
        finally:
            connections.close_all()

    def wait(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def running(self) -> bool:
        return self._thread.is_alive()
