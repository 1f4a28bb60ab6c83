"""A session's life: create, update, archive, delete; and the events users send it."""

from __future__ import annotations

from functools import partial
from typing import Any, TypedDict, Unpack

from django.db import transaction
from django.utils import timezone

from harness.agent_config import normalise_agent_config
from harness.agents import AgentNotFound, get_agent_version
from harness.brain import Outcome, has_pending_work, settle
from harness.fold import fold, result_key
from harness.harnesses import pending
from harness.harnesses.base import waits_for_worker
from harness.registry import validate_harness_name
from harness.services.resources import check_for_environment, new_resources, seal_tokens
from harness.tasks import queue_wake
from kernel.api.validation import check_metadata, expect, no_unknown_fields, patch_metadata, text
from kernel.errors import Closed, Invalid
from kernel.ids import new_id
from kernel.models import DEFAULT_WORKSPACE_ID
from kernel.tenancy import audit, check_same
from sandboxes.environments import EnvironmentNotFound, get_environment
from sandboxes.work import work_ensure, work_stop_for_session
from sessions import events
from sessions.event_types import validate_sendable
from sessions.models import Event, Session
from sessions.selectors import get_events
from sessions.services.log import SessionClosed, SessionNotFound, emit_event, emit_events
from vault.repositories import repository_tokens_delete
from vault.services import usable_vault_ids

# User events that give the brain something to do.
WAKING_TYPES = frozenset(
    {
        "user.message",
        "user.interrupt",
        "user.custom_tool_result",
        "user.tool_confirmation",
        "user.tool_result",
        "user.define_outcome",
    }
)
RUNNING_TYPES = WAKING_TYPES - {"user.interrupt"}
# What each sent event refers to, by which field, and what that must be in the same session.
REFERENCES = {
    "user.tool_confirmation": ("tool_use_id", ("agent.tool_use", "agent.mcp_tool_use")),
    # The worker's answer to a toolset call (an MCP call is answered by the platform, which runs it).
    "user.tool_result": ("tool_use_id", ("agent.tool_use",)),
    "user.custom_tool_result": ("custom_tool_use_id", ("agent.custom_tool_use",)),
}
# The events that answer a call, by the field naming it: each call takes one.
RESULTS = {"user.tool_result": "tool_use_id", "user.custom_tool_result": "custom_tool_use_id"}
SNAPSHOT_FIELDS = (
    "name",
    "description",
    "system",
    "model",
    "tools",
    "mcp_servers",
    "skills",
    "multiagent",
    "execution_identity",
    "harness",
    "context",
)
OVERRIDABLE = ("model", "system", "tools", "mcp_servers", "skills")


def _resolve_agent(value: Any, workspace_id: str) -> tuple[str, int, dict[str, Any]]:
    if isinstance(value, str):
        value = {"type": "agent", "id": value}
    expect(value, dict, "'agent'")
    kind = value.get("type", "agent")
    if kind not in ("agent", "agent_with_overrides"):
        raise Invalid(f"'agent.type' must be 'agent' or 'agent_with_overrides', not {kind!r}.")
    allowed = ("type", "id", "version") + (OVERRIDABLE if kind == "agent_with_overrides" else ())
    no_unknown_fields(value, allowed, "agent")
    agent_id = text(value, "id", "agent", required=True, min_length=1)
    version_number = value.get("version")
    if version_number is not None:
        expect(version_number, int, "'agent.version'")
    version = get_agent_version(agent_id, version_number)
    check_same(workspace_id, version.agent.workspace_id, AgentNotFound(agent_id))
    if version.agent.archived_at is not None:
        raise Invalid(f"Agent {agent_id} is archived; sessions cannot start from it.")
    config = version.config
    overrides = {key: value[key] for key in OVERRIDABLE if key in value}
    if overrides:
        config = normalise_agent_config(overrides, current=config)
    snapshot = {
        "type": "agent",
        "id": agent_id,
        "version": version.version,
        **{key: config.get(key) for key in SNAPSHOT_FIELDS},
    }
    return agent_id, version.version, snapshot


def _budget(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    expect(value, dict, "'budget'")
    if value.get("type") != "limit":
        raise Invalid("'budget.type' must be 'limit'.")
    cost = expect(value.get("max_list_cost"), dict, "'budget.max_list_cost'")
    amount = cost.get("amount")
    if not isinstance(amount, str) or not amount.isdigit():
        raise Invalid("'budget.max_list_cost.amount' must be a whole number of minor units, as a string.")
    return {"type": "limit", "max_list_cost": {"amount": amount, "currency": cost.get("currency", "USD")}}


def _check_references(session_id: str, events: list[dict[str, Any]]) -> None:
    answered: set[str] = set()
    for i, event in enumerate(events):
        if event["type"] not in REFERENCES:
            continue
        key, types = REFERENCES[event["type"]]
        use = Event.objects.filter(session_id=session_id, uid=event[key], type__in=types).first()
        if use is None:
            raise Invalid(
                f"'events[{i}].{key}' is {event[key]!r}, which is not the id of an "
                f"{' or '.join(types)} event in session {session_id}."
            )
        if event["type"] in RESULTS:
            _check_result_wanted(session_id, use, f"events[{i}].{key}", answered)
            answered.add(use.uid)


def _check_result_wanted(session_id: str, use: Event, where: str, answered: set[str]) -> None:
    """A call takes one result, and only once it may run: not before its confirmation, nor after a refusal."""
    if use.uid in answered:
        raise Invalid(f"'{where}': these events answer tool call {use.uid} twice; a call takes one result.")
    result = Event.objects.filter(session_id=session_id, idempotency_key=result_key(use.uid)).first()
    if result is not None:
        raise Invalid(
            f"'{where}': tool call {use.uid} already has a result ({result.type} {result.uid}); a call takes "
            "one result."
        )
    permission = use.payload.get("evaluated_permission")
    if permission == "deny":
        raise Invalid(
            f"'{where}': tool call {use.uid} was refused when it was made; the platform answers it."
        )
    if permission == "ask":
        confirmation = (
            Event.objects.filter(
                session_id=session_id,
                seq__gt=use.seq,
                type="user.tool_confirmation",
                payload__tool_use_id=use.uid,
            )
            .order_by("seq")
            .last()
        )
        if confirmation is None:
            raise Invalid(
                f"'{where}': tool call {use.uid} waits for a user.tool_confirmation; it may run, and be "
                "answered, only once it is allowed."
            )
        if confirmation.payload.get("result") != "allow":
            raise Invalid(f"'{where}': tool call {use.uid} was denied; it is not to run, and has its answer.")


def _wake(session_id: str) -> None:
    queue_wake(session_id)


def _queue_wake(session_id: str) -> None:
    transaction.on_commit(partial(_wake, session_id))


def queue_wake_if_pending(session_id: str) -> None:
    """Wake a brain on commit when the log shows work (a fork that ends mid-turn or on a question)."""
    if has_pending_work(session_id):
        Session.objects.filter(id=session_id).update(status=Session.Status.RUNNING)
        _queue_wake(session_id)


def _append_user_events(
    session_id: str, events: list[dict[str, Any]], *, open_only: bool, actor: str
) -> list[Event]:
    """A user's events in one append, recording who sent them (`actor`), which sets the session running when they give its brain work and
    queues its wake once they are committed.

    A tool result is written with the key every result of that call is written with (`result_key`), so of a
    worker's result and the platform's (an interrupt's, a recovery's) that race, one is appended: the append
    that finds the key taken writes nothing, and is refused here."""
    kinds = {event["type"] for event in events}
    items: list[tuple[dict[str, Any], str | None]] = [
        ({**event, "id": new_id("sevt")}, result_key(event[RESULTS[event["type"]]]))
        if event["type"] in RESULTS
        else (event, None)
        for event in events
    ]
    written = emit_events(
        session_id,
        items,
        status=Session.Status.RUNNING if kinds & RUNNING_TYPES else None,
        open_only=open_only,
        then=partial(_wake, session_id) if kinds & WAKING_TYPES else None,
        actor=actor,
    )
    ids = [event.get("id") for event, key in items if key is not None]
    if ids and not set(ids) <= {event.uid for event in written}:
        calls = ", ".join(event[RESULTS[event["type"]]] for event, key in items if key is not None)
        raise Invalid(
            f"Tool call {calls} got its result meanwhile; a call takes one result. Nothing was added."
        )
    return written


def _check_open(session_id: str) -> None:
    session = Session.objects.live().filter(id=session_id).only("archived_at", "status").first()
    if session is None:
        raise SessionNotFound(session_id)
    if session.archived_at is not None:
        raise SessionClosed(session_id, "archived")
    if session.status == Session.Status.TERMINATED:
        raise SessionClosed(session_id, "terminated")


def session_send_events(session_id: str, *, events: list[dict[str, Any]], actor: str = "") -> list[Event]:
    """All the events or none: each is checked before any is written; `actor` is who sent them.

    They go in with one append, which also sets the session running when they give its brain work, and
    which an archived or terminated session refuses. The events they refer to are checked first: the log
    is append-only, so an event found then is still there when the append runs.
    """
    if not events:
        raise Invalid("'events' must hold at least one event.")
    events = [validate_sendable(event, f"events[{i}]") for i, event in enumerate(events)]
    if any(event["type"] in REFERENCES for event in events):
        # A missing or closed session is what to report, not a reference it cannot hold.
        _check_open(session_id)
        _check_references(session_id, events)
    return _append_user_events(session_id, events, open_only=True, actor=actor)


def session_create(
    *,
    agent: str | dict[str, Any],
    environment_id: str,
    title: str | None = None,
    metadata: dict[str, str] | None = None,
    resources: list[dict[str, Any]] | None = None,
    initial_events: list[dict[str, Any]] | None = None,
    vault_ids: list[str] | None = None,
    budget: dict[str, Any] | None = None,
    actor: str = "api",
    workspace_id: str = DEFAULT_WORKSPACE_ID,
) -> Session:
    """A session of `agent` (an id, or a reference with a version and overrides) in the environment.

    Its repositories' tokens are sealed into the vault in the same transaction, never stored with the
    resources; `actor` is who the audit trail says set them."""
    agent_id, version, snapshot = _resolve_agent(agent, workspace_id)
    environment = get_environment(environment_id)
    check_same(workspace_id, environment.workspace_id, EnvironmentNotFound(environment_id))
    if environment.archived_at is not None:
        raise Closed(
            f"Environment {environment_id} is archived; sessions cannot start in it.",
            code="environment_archived",
        )
    initial = initial_events or []
    if len(initial) > 50:
        raise Invalid(f"'initial_events' may hold at most 50 events, not {len(initial)}.")
    initial = [validate_sendable(event, f"initial_events[{i}]") for i, event in enumerate(initial)]
    for i, event in enumerate(initial):
        if event["type"] not in ("user.message", "user.define_outcome"):
            raise Invalid(f"'initial_events[{i}].type' must be user.message or user.define_outcome.")
    stored, tokens = new_resources(resources or [])
    check_for_environment(stored, environment.config or {})
    _check_skills(snapshot, environment.config or {})
    with transaction.atomic():
        session = Session.objects.create(
            workspace_id=workspace_id,
            agent_id=agent_id,
            agent_version=version,
            agent_snapshot=snapshot,
            environment=environment,
            title=title,
            metadata=dict(check_metadata(metadata or {})),
            resources=stored,
            vault_ids=usable_vault_ids(vault_ids or [], workspace_id),
            budget=_budget(budget),
        )
        seal_tokens(session.id, tokens, actor=actor)
        if initial:
            _append_user_events(session.id, initial, open_only=False, actor=actor)
            session.refresh_from_db()
    return session


class SessionChanges(TypedDict, total=False):
    title: str | None
    metadata: dict[str, str | None] | None
    budget: dict[str, Any] | None
    agent: dict[str, Any] | None
    vault_ids: list[str] | None
    harness: str | None


def session_update(session_id: str, *, actor: str = "system", **changes: Unpack[SessionChanges]) -> Session:
    """Change what was given; a new agent configuration or harness waits for the session to be idle. A
    harness switch goes to the audit log as `actor`'s."""
    with transaction.atomic():
        session = Session.objects.live().select_for_update().filter(id=session_id).first()
        if session is None:
            raise SessionNotFound(session_id)
        changed: dict[str, Any] = {}
        if "title" in changes:
            session.title = changed["title"] = changes["title"]
        if "metadata" in changes:
            session.metadata = changed["metadata"] = patch_metadata(
                session.metadata, check_metadata(changes["metadata"], patch=True)
            )
        if "budget" in changes:
            session.budget = changed["budget"] = _budget(changes["budget"])
        if "vault_ids" in changes:
            session.vault_ids = changed["vault_ids"] = usable_vault_ids(
                changes["vault_ids"] or [], session.workspace_id
            )
        if "agent" in changes:
            if session.status == Session.Status.RUNNING:
                raise Invalid(f"Session {session_id} is running; change its agent when it is idle.")
            overrides = expect(changes["agent"], dict, "'agent'")
            no_unknown_fields(overrides, ("tools", "mcp_servers"), "agent")
            config = normalise_agent_config(overrides, current=session.agent_snapshot)
            session.agent_snapshot = {
                **session.agent_snapshot,
                "tools": config["tools"],
                "mcp_servers": config["mcp_servers"],
            }
            changed["agent"] = session.agent_snapshot
        switch = validate_harness_name(changes["harness"]) if "harness" in changes else None
        if switch is not None and session.status == Session.Status.RUNNING:
            raise Invalid(f"Session {session_id} is running; switch its harness between turns, when idle.")
        session.save()
        if changed:
            emit_event(session.id, events.session_updated(**changed))
        if switch is not None:
            emit_event(session.id, events.harness_switched(switch))
            audit(session.workspace_id, actor, "session.harness_switched", session.id, harness=switch)
    return session


def session_archive(session_id: str) -> Session:
    with transaction.atomic():
        session = Session.objects.live().select_for_update().filter(id=session_id).first()
        if session is None:
            raise SessionNotFound(session_id)
        if session.archived_at is None:
            if session.status != Session.Status.TERMINATED:
                emit_event(session.id, events.status_terminated())
            Session.objects.filter(id=session.id).update(archived_at=timezone.now())
            transaction.on_commit(partial(work_stop_for_session, session.id))
        session.refresh_from_db()
    return session


def _check_skills(snapshot: dict[str, Any], environment_config: dict[str, Any]) -> None:
    """A self-hosted worker downloads its agent's skills from `/v1/skills`, which this installation does not
    serve (it has no skills store): an agent with skills cannot run there, rather than run without them."""
    skills = snapshot.get("skills") or []
    if environment_config.get("type") == "self_hosted" and skills:
        raise Invalid(
            f"'agent': agent skills ({', '.join(repr(s['skill_id']) for s in skills)}) cannot run in a "
            "self-hosted environment: its worker downloads them from /v1/skills, and this installation has no "
            "skills store. Use an agent version without skills, or override 'skills' with [].",
            code="skills_not_supported",
        )


def session_delete(session_id: str, *, actor: str = "api") -> dict[str, str]:
    """Recorded in the log, then hidden from the API; no event is removed. Its repository tokens are
    destroyed: nothing can use them any more."""
    with transaction.atomic():
        session = Session.objects.live().select_for_update().filter(id=session_id).first()
        if session is None:
            raise SessionNotFound(session_id)
        if session.status != Session.Status.TERMINATED:
            emit_event(session.id, events.status_terminated())
        emit_event(session.id, events.session_deleted())
        Session.objects.filter(id=session.id).update(deleted_at=timezone.now())
        repository_tokens_delete(session.id, actor=actor)
        transaction.on_commit(partial(work_stop_for_session, session.id))
    return {"id": session_id, "type": "session_deleted"}


def session_worker_gone(session_id: str, work_id: str) -> None:
    """A self-hosted worker left the session: its work item was lost (back in the queue) or stopped.

    What it left follows the recovery rule, taken at once (`settle`), before another worker reads the log: a
    call it may have begun is closed as unverified unless it is safe to run again; the safe ones wait for the
    next worker. Whenever calls still wait for a worker, the session has a live work item (a new one if this
    one stopped), so it never waits in requires_action with nobody to answer; a model call left to make
    wakes a brain. Called by the work queue after its commit (`add_work_lost_hook`, `add_work_stopped_hook`)."""
    if not Session.objects.open().filter(id=session_id).exists():
        return
    state = fold(get_events(session_id))
    if pending(state):
        if settle(session_id, by="worker gone") is Outcome.BUSY:
            _wake(session_id)  # the brain holding the lease may be past its last look at the log
        state = fold(get_events(session_id))
    if waits_for_worker(state):
        work_ensure(session_id)
    if pending(state):
        Session.objects.filter(id=session_id).update(status=Session.Status.RUNNING)
        _wake(session_id)


__all__ = [
    "SessionNotFound",
    "session_archive",
    "session_create",
    "session_delete",
    "session_send_events",
    "session_update",
    "session_worker_gone",
]
