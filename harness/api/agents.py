"""/v1/agents (reference §4)."""

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from harness.agents import agent_archive, agent_create, agent_json, agent_update, get_agent, get_agent_version
from harness.api.schemas import (
    Agent,
    AgentCreate,
    AgentList,
    AgentsQuery,
    AgentUpdate,
    AgentVersionQuery,
    VersionsQuery,
)
from harness.models import Agent as AgentRow
from harness.models import AgentVersion
from kernel.api.edge import caller
from kernel.api.pagination import decode_cursor, encode_cursor, keyset_page
from kernel.api.schemas import ERRORS

router = Router(tags=["agents"])


@router.post("/agents", response={200: Agent, **ERRORS})
def agents_create(request: HttpRequest, body: AgentCreate) -> dict[str, Any]:
    return agent_json(agent_create(workspace_id=caller(request).workspace_id, **body.given()))


@router.get("/agents", response={200: AgentList, **ERRORS})
def agents_list(request: HttpRequest, query: Query[AgentsQuery]) -> dict[str, Any]:
    agents = AgentRow.objects.filter(workspace_id=caller(request).workspace_id)
    if not query.include_archived:
        agents = agents.filter(archived_at__isnull=True)
    for op, value in query.created_ranges().items():
        agents = agents.filter(**{f"created_at__{op}": value})
    page = keyset_page(agents, query.page, order="desc", limit=query.limit)
    versions = {
        (v.agent_id, v.version): v
        for v in AgentVersion.objects.select_related("agent").filter(agent__in=page["rows"])
    }
    data = [agent_json(versions[(agent.id, agent.version)]) for agent in page["rows"]]
    return {"data": data, "next_page": page["next_page"]}


@router.get("/agents/{agent_id}", response={200: Agent, **ERRORS})
def agents_retrieve(request: HttpRequest, agent_id: str, query: Query[AgentVersionQuery]) -> dict[str, Any]:
    return agent_json(get_agent_version(agent_id, query.version))


@router.post("/agents/{agent_id}", response={200: Agent, **ERRORS})
def agents_update(request: HttpRequest, agent_id: str, body: AgentUpdate) -> dict[str, Any]:
    return agent_json(agent_update(agent_id, **body.given()))


@router.post("/agents/{agent_id}/archive", response={200: Agent, **ERRORS})
def agents_archive(request: HttpRequest, agent_id: str) -> dict[str, Any]:
    return agent_json(agent_archive(agent_id))


@router.get("/agents/{agent_id}/versions", response={200: AgentList, **ERRORS})
def agent_versions_list(request: HttpRequest, agent_id: str, query: Query[VersionsQuery]) -> dict[str, Any]:
    agent = get_agent(agent_id)
    versions = AgentVersion.objects.select_related("agent").filter(agent=agent).order_by("-version")
    if query.page:
        versions = versions.filter(version__lt=decode_cursor(query.page, expect_keys=("v",))["v"])
    rows = list(versions[: query.limit + 1])
    more = len(rows) > query.limit
    next_page = encode_cursor({"v": rows[query.limit - 1].version}) if more else None
    return {"data": [agent_json(v) for v in rows[: query.limit]], "next_page": next_page}
