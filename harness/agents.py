"""Agents: create, update as a new version, archive; and their API form."""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

from django.db import transaction
from django.utils import timezone

from harness.agent_config import normalise_agent_config
from harness.models import Agent, AgentVersion
from kernel.errors import Closed, Conflict, NotFound
from kernel.models import DEFAULT_WORKSPACE_ID


def agent_json(version: AgentVersion) -> dict[str, Any]:
    agent = version.agent
    return {
        "id": agent.id,
        "type": "agent",
        "version": version.version,
        **version.config,
        "created_at": agent.created_at.isoformat(),
        "updated_at": version.created_at.isoformat(),
        "archived_at": agent.archived_at.isoformat() if agent.archived_at else None,
    }


class AgentNotFound(NotFound):
    def __init__(self, agent_id: str):
        super().__init__("agent", agent_id)


def get_agent(agent_id: str) -> Agent:
    agent = Agent.objects.filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(agent_id)
    return agent


def get_agent_version(agent_id: str, version: int | None = None) -> AgentVersion:
    agent = get_agent(agent_id)
    number = agent.version if version is None else version
    found = AgentVersion.objects.select_related("agent").filter(agent=agent, version=number).first()
    if found is None:
        raise NotFound(
            "agent version",
            f"{agent_id}@{number}",
            f"Agent {agent_id} has no version {number}; its latest is {agent.version}.",
        )
    return found


class AgentFields(TypedDict, total=False):
    """An agent's configuration as a create sets it and an update changes it (reference §4)."""

    name: str
    model: str | dict[str, Any]
    description: str | None
    system: str | None
    tools: list[dict[str, Any]] | None
    mcp_servers: list[dict[str, Any]] | None
    skills: list[dict[str, Any]] | None
    metadata: dict[str, str | None] | None
    multiagent: dict[str, Any] | None
    execution_identity: dict[str, Any] | None
    harness: str | None
    context: dict[str, Any] | None


@transaction.atomic
def agent_create(*, workspace_id: str = DEFAULT_WORKSPACE_ID, **fields: Unpack[AgentFields]) -> AgentVersion:
    config = normalise_agent_config(dict(fields))
    agent = Agent.objects.create(workspace_id=workspace_id)
    return AgentVersion.objects.create(agent=agent, version=1, config=config)


@transaction.atomic
def agent_update(
    agent_id: str, *, version: int | None = None, **changes: Unpack[AgentFields]
) -> AgentVersion:
    """A changed configuration becomes a new version; an unchanged one returns the current version.

    `version`, if given, is the version the caller read: a newer one is a conflict, not an overwrite.
    """
    agent = Agent.objects.select_for_update().filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(agent_id)
    if agent.archived_at is not None:
        raise Closed(f"Agent {agent_id} is archived and cannot be changed.")
    if version is not None and version != agent.version:
        raise Conflict(
            f"Agent {agent_id} is at version {agent.version}, not {version}; re-read it and retry."
        )
    current = AgentVersion.objects.get(agent=agent, version=agent.version)
    config = normalise_agent_config(dict(changes), current=current.config)
    if config == current.config:
        return current
    agent.version += 1
    agent.save(update_fields=["version", "updated_at"])
    return AgentVersion.objects.create(agent=agent, version=agent.version, config=config)


def agent_archive(agent_id: str) -> AgentVersion:
    agent = get_agent(agent_id)
    if agent.archived_at is None:
        agent.archived_at = timezone.now()
        agent.save(update_fields=["archived_at", "updated_at"])
    return get_agent_version(agent_id)
