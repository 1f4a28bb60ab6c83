"""Reads the UI needs beyond the apps' own selectors: list rows, a timeline slice, the brain's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import OuterRef, Prefetch, Q, QuerySet, Subquery

from harness.models import Agent, AgentVersion
from harness.registry import HARNESS_DESCRIPTIONS
from sandboxes.models import Environment, Sandbox
from sessions.models import Event, Session
from sessions.selectors import get_events, session_length
from workbench.ui.presenters import CALL_TYPES, RESULT_TYPES, EventView, present

STATUSES = [choice for choice, _ in Session.Status.choices]
# How far past a slice to look for the answers of its tool calls (they follow their call closely).
ANSWER_LOOKAHEAD = 1000


def _last_payload(session_ref: Any, event_type: str, key: str) -> Subquery:
    return Subquery(
        Event.objects.filter(session_id=session_ref, type=event_type)
        .order_by("-seq")
        .values(f"payload__{key}")[:1]
    )


def session_rows(
    workspace_id: str, *, status: str = "", agent_id: str = "", limit: int = 100
) -> list[Session]:
    """A workspace's sessions for the list, newest first, with their held sandboxes, usage and current
    harness."""
    sessions: QuerySet[Session] = Session.objects.live().filter(workspace_id=workspace_id)
    if status == "archived":
        sessions = sessions.filter(archived_at__isnull=False)
    else:
        sessions = sessions.filter(archived_at__isnull=True)
        if status:
            sessions = sessions.filter(status=status)
    if agent_id:
        sessions = sessions.filter(agent_id=agent_id)
    # The row's own `usage` is not kept up to date by the brains; the log's last session.usage is.
    sessions = (
        sessions.annotate(
            last_usage=_last_payload(OuterRef("pk"), "session.usage", "usage"),
            switched_harness=_last_payload(OuterRef("pk"), "brain.harness_switched", "harness"),
        )
        .select_related("environment")
        .prefetch_related(
            Prefetch(
                "sandboxes", queryset=Sandbox.objects.filter(status=Sandbox.Status.READY), to_attr="hands"
            )
        )
    )
    return list(sessions[:limit])


def agent_choices(workspace_id: str) -> list[tuple[str, str]]:
    """A workspace's live agents as (id, "name (vN)"), for pickers."""
    latest = AgentVersion.objects.filter(agent=OuterRef("pk"), version=OuterRef("version")).values(
        "config__name"
    )
    agents = Agent.objects.filter(workspace_id=workspace_id, archived_at__isnull=True).annotate(
        agent_name=Subquery(latest[:1])
    )
    return [(a.id, f"{a.agent_name} (v{a.version})") for a in agents]


def environment_choices(workspace_id: str) -> list[tuple[str, str]]:
    environments = Environment.objects.usable().filter(workspace_id=workspace_id)
    return [(e.id, e.name) for e in environments]


@dataclass
class Slice:
    session_id: str
    start: int
    stop: int
    length: int
    events: list[EventView] = field(default_factory=list)


def resolve_slice(length: int, start: int | None, stop: int | None) -> tuple[int, int]:
    """Absolute [start, stop) of a slice with Python's semantics (negatives count from the end)."""
    first, last, _ = slice(start, stop).indices(length)
    return first, max(first, last)


def timeline_slice(
    session_id: str, start: int | None, stop: int | None, *, limit: int | None = None
) -> Slice:
    """Events [start:stop] (at most `limit` of them, from the start) ready to render, with what the page
    cannot tell from the slice alone: which lease epoch came before it, and which of its tool calls have
    been answered after it."""
    length = session_length(session_id)
    first, last = resolve_slice(length, start, stop)
    if limit is not None:
        last = min(last, first + limit)
    events = get_events(session_id, first, last) if last > first else []
    calls = [e.uid for e in events if e.type in CALL_TYPES]
    answered = _answered(session_id, calls, first, last) if calls else set()
    views = [present(e, answered=e.uid in answered) for e in events]
    previous = None
    if first > 0 and any(view.epoch is not None for view in views):
        previous = (
            Event.objects.filter(session_id=session_id, seq__lt=first, lease_epoch__isnull=False)
            .order_by("-seq")
            .values_list("lease_epoch", flat=True)
            .first()
        )
    for view in views:
        if view.epoch is None:
            continue
        if view.epoch != previous:
            view.epoch_changed, view.epoch_from = True, previous
        previous = view.epoch
    return Slice(session_id, first, last, length, views)


def _answered(session_id: str, call_ids: list[str], first: int, last: int) -> set[str]:
    answers = Q(type="user.tool_confirmation", payload__tool_use_id__in=call_ids)
    for result_type, key in RESULT_TYPES.items():
        answers |= Q(type=result_type, **{f"payload__{key}__in": call_ids})
    found = set()
    rows = Event.objects.filter(
        answers, session_id=session_id, seq__gte=first, seq__lt=last + ANSWER_LOOKAHEAD
    )
    for event_type, payload in rows.values_list("type", "payload"):
        key = RESULT_TYPES.get(event_type, "tool_use_id")
        found.add(payload.get(key))
    return found


@dataclass
class Brain:
    harness: str
    harness_description: str
    owner: str
    epoch: int
    expires_at: Any
    context: dict[str, Any]
    model_id: str


def session_brain(session: Session) -> Brain:
    """The brain working a session: its harness (the last switch in the log, else the agent's), its lease."""
    switched = (
        Event.objects.filter(session_id=session.id, type="brain.harness_switched")
        .order_by("-seq")
        .values_list("payload__harness", flat=True)
        .first()
    )
    snapshot = session.agent_snapshot or {}
    harness = switched or snapshot.get("harness") or "claude"
    model = snapshot.get("model") or {}
    return Brain(
        harness=harness,
        harness_description=HARNESS_DESCRIPTIONS.get(harness, ""),
        owner=session.lease_owner,
        epoch=session.lease_epoch,
        expires_at=session.lease_expires_at,
        context=snapshot.get("context") or {"type": "full"},
        model_id=model.get("id", "") if isinstance(model, dict) else str(model),
    )


def free_sandboxes(workspace_id: str) -> list[Sandbox]:
    """The sandboxes an operator may attach: not those returned unused, nor warm-pool members with a checkout,
    kept for provisioning alone (sandboxes/returns.py, `sandbox_attach`)."""
    return list(
        Sandbox.objects.filter(
            session__isnull=True, status=Sandbox.Status.READY, environment__workspace_id=workspace_id
        )
        .exclude(labels__contains={"returned": True})  # (a key lookup's NOT would drop rows without it)
        .exclude(labels__contains={"pooled": True}, labels__has_key="prepared")
        .select_related("environment")
        .order_by("-created_at")
    )


def transfer_targets(session: Session, limit: int = 100) -> list[Session]:
    """Sessions a sandbox could be passed to: live ones of its workspace other than this one."""
    return list(
        Session.objects.live()
        .filter(archived_at__isnull=True, workspace_id=session.workspace_id)
        .exclude(status=Session.Status.TERMINATED)
        .exclude(id=session.id)[:limit]
    )


def all_sandboxes(workspace_id: str, *, include_ended: bool) -> list[Sandbox]:
    sandboxes = (
        Sandbox.objects.filter(environment__workspace_id=workspace_id)
        .select_related("environment", "session")
        .order_by("-created_at")
    )
    if not include_ended:
        sandboxes = sandboxes.exclude(status__in=[Sandbox.Status.TERMINATED, Sandbox.Status.DEAD])
    return list(sandboxes[:500])
