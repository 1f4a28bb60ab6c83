"""What the harness uses of the self-hosted work queue (sandboxes/work_queue.py has the rest).

- `work_ensure(session_id) -> work_id`: the session's live (not stopped) work item, queued now if it has
  none; one live item per session however many callers race. Wakes the environment's long polls.
- `work_live(session_id) -> WorkItem | None`.
- `add_work_lost_hook(hook)`: `hook(session_id, work_id)` runs after an item of that session lost its
  worker (acked and never heartbeated in time, or its lease ran out) and went back to the queue.
- `add_work_stopped_hook(hook)`: `hook(session_id, work_id)` runs after an item of that session stopped
  (its worker, an API key, the session's end, or a stopping item whose worker was lost).
- `work_stop_for_session(session_id)`: ask the session's live item to stop (its worker learns it from
  its next heartbeat; an item no worker holds stops at once).

Hooks run after the commit, in the process that noticed (a poll, a heartbeat, a stop, or beat's sweep).
"""

from sandboxes.models import WorkItem
from sandboxes.work_queue import (
    add_work_lost_hook,
    add_work_stopped_hook,
    work_ensure,
    work_live,
    work_stop_for_session,
)

__all__ = [
    "WorkItem",
    "add_work_lost_hook",
    "add_work_stopped_hook",
    "work_ensure",
    "work_live",
    "work_stop_for_session",
]
