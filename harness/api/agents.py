"""/v1/agents."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from harness.agents import agent_archive, agent_create, agent_json, agent_update, get_agent, get_agent_version
from harness.models import Agent, AgentVersion
from kernel.api.endpoint import endpoint
from kernel.api.pagination import decode_cursor, encode_cursor, keyset_page
from kernel.api.validation import query_bool, query_datetime_ranges, query_int


def agents_create(request: HttpRequest) -> dict[str, Any]:
    return agent_json(agent_create(request.json))  # type: ignore[attr-defined]


def agents_list(request: HttpRequest) -> dict[str, Any]:
    params = request.GET
    limit = query_int(params, "limit", default=20, minimum=1, maximum=100)
    agents = Agent.objects.all()
    if not query_bool(params, "include_archived"):
        agents = agents.filter(archived_at__isnull=True)
    for op, value in query_datetime_ranges(params, "created_at").items():
        agents = agents.filter(**{f"created_at__{op}": value})
    page = keyset_page(agents, params, order="desc", limit=limit)
    versions = {
        (v.agent_id, v.version): v
        for v in AgentVersion.objects.select_related("agent").filter(agent__in=page["rows"])
    }
    data = [agent_json(versions[(agent.id, agent.version)]) for agent in page["rows"]]
    return {"data": data, "next_page": page["next_page"]}


def agents_retrieve(request: HttpRequest, agent_id: str) -> dict[str, Any]:
    version = request.GET.get("version")
    number = query_int(request.GET, "version", default=0, minimum=1, maximum=10**9) if version else None
    return agent_json(get_agent_version(agent_id, number))


def agents_update(request: HttpRequest, agent_id: str) -> dict[str, Any]:
    return agent_json(agent_update(agent_id, request.json))  # type: ignore[attr-defined]


def agents_archive(request: HttpRequest, agent_id: str) -> dict[str, Any]:
    return agent_json(agent_archive(agent_id))


def agent_versions_list(request: HttpRequest, agent_id: str) -> dict[str, Any]:
    agent = get_agent(agent_id)
    limit = query_int(request.GET, "limit", default=20, minimum=1, maximum=100)
    versions = AgentVersion.objects.select_related("agent").filter(agent=agent).order_by("-version")
    token = request.GET.get("page")
    if token:
        versions = versions.filter(version__lt=decode_cursor(token, expect_keys=("v",))["v"])
    rows = list(versions[: limit + 1])
    next_page = encode_cursor({"v": rows[limit - 1].version}) if len(rows) > limit else None
    return {"data": [agent_json(v) for v in rows[:limit]], "next_page": next_page}


collection = endpoint(GET=agents_list, POST=agents_create)
item = endpoint(GET=agents_retrieve, POST=agents_update)
archive = endpoint(POST=agents_archive)
versions = endpoint(GET=agent_versions_list)
