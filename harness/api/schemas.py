"""Request and response schemas of `/v1/agents` and `/v1/sessions` (reference §4 and §6).

The nested configuration an agent or a session carries (tools, MCP servers, resources, events) is
declared here by its outer shape; its rules (which tool types, which event types, which URLs) are the
services', which name the field they refuse.
"""

from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import WithJsonSchema

from kernel.api.schemas import Body, CreatedRange, Metadata, MetadataPatch, Page, Timestamp

# Either form: a string or an object; the service says which object fields are wrong.
StringOrObject = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "object"}]})]
ModelRef = StringOrObject
Tools = list[dict[str, Any]]


class AgentFields(Body):
    description: str | None = Field(None, max_length=100_000)
    system: str | None = Field(None, max_length=100_000)
    tools: Tools | None = None
    mcp_servers: list[dict[str, Any]] | None = None
    skills: list[dict[str, Any]] | None = None
    metadata: MetadataPatch | None = None
    multiagent: dict[str, Any] | None = None
    execution_identity: dict[str, Any] | None = None
    harness: str | None = Field(
        None, description="Workbench's own: the harness that runs the agent's brains."
    )
    context: dict[str, Any] | None = Field(
        None, description="Workbench's own: how the brain selects the log slice the model sees."
    )


class AgentCreate(AgentFields):
    name: str = Field(..., min_length=1, max_length=256)
    model: ModelRef = Field(..., description="A model id, or {id, effort, inference_geo, speed}.")


class AgentUpdate(AgentFields):
    name: str | None = Field(None, min_length=1, max_length=256)
    model: ModelRef | None = None
    version: int | None = Field(
        None, description="The version this update expects to replace (409 if stale)."
    )


class AgentsQuery(CreatedRange, Page):
    limit: int = Field(20, ge=1, le=100)
    include_archived: bool = False


class AgentVersionQuery(Schema):
    version: int | None = Field(None, ge=1, le=10**9)


class VersionsQuery(Page):
    limit: int = Field(20, ge=1, le=100)


class Agent(Schema):
    id: str
    type: Literal["agent"]
    version: int
    name: str
    description: str | None
    system: str | None
    model: dict[str, Any]
    tools: Tools
    mcp_servers: list[dict[str, Any]]
    skills: list[dict[str, Any]]
    metadata: dict[str, str]
    multiagent: dict[str, Any] | None
    execution_identity: dict[str, Any] | None
    harness: str | None = None
    context: dict[str, Any] | None = None
    created_at: Timestamp
    updated_at: Timestamp
    archived_at: Timestamp | None


class AgentList(Schema):
    data: list[Agent]
    next_page: str | None


# -- sessions


class SessionCreate(Body):
    agent: StringOrObject = Field(
        ..., description='An agent id, or {"type": "agent" | "agent_with_overrides", "id", "version"?, …}.'
    )
    environment_id: str = Field(..., min_length=1)
    title: str | None = Field(None, max_length=500)
    metadata: Metadata | None = None
    resources: list[dict[str, Any]] | None = None
    initial_events: list[dict[str, Any]] | None = Field(None, max_length=50)
    vault_ids: list[str] | None = None
    budget: dict[str, Any] | None = None


class SessionUpdate(Body):
    title: str | None = Field(None, max_length=500)
    metadata: MetadataPatch | None = None
    agent: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    vault_ids: list[str] | None = None
    harness: str | None = Field(None, description="Workbench's own: switch the harness between turns.")


class SessionFork(Body):
    at_seq: int = Field(..., description="The fork copies events [0:at_seq] of the session.")
    harness: str | None = None
    title: str | None = Field(None, max_length=500)


class SessionsQuery(CreatedRange, Page):
    limit: int = Field(20, ge=1, le=1000)
    order: Literal["asc", "desc"] = "desc"
    include_archived: bool = False
    agent_id: str | None = None
    agent_version: int | None = Field(None, ge=1, le=10**9)
    statuses: list[Literal["idle", "running", "rescheduling", "terminated"]] = Field([], alias="statuses[]")


class Session(Schema):
    id: str
    type: Literal["session"]
    status: str
    agent: dict[str, Any]
    environment_id: str
    title: str | None
    metadata: dict[str, str]
    resources: list[dict[str, Any]]
    vault_ids: list[str]
    budget: dict[str, Any] | None
    outcome_evaluations: list[Any]
    stats: dict[str, Any]
    usage: dict[str, Any]
    deployment_id: str | None
    created_at: Timestamp
    updated_at: Timestamp
    archived_at: Timestamp | None


class SessionList(Schema):
    data: list[Session]
    next_page: str | None
    prev_page: str | None


# -- a session's resources (reference §3.6)


class ResourcesQuery(Page):
    limit: int | None = Field(None, ge=1, le=1000, description="Omitted: all of them.")


class ResourceUpdate(Body):
    authorization_token: str = Field(
        ...,
        min_length=1,
        max_length=4096,
        description="A github_repository's new token (only repositories rotate); never returned.",
        json_schema_extra={"writeOnly": True},
    )


class ResourceAdd(Body):
    type: Literal["file"]
    file_id: str = Field(..., min_length=1, max_length=255)
    mount_path: str | None = Field(None, max_length=1024)


class SessionResource(Schema):
    """A github_repository, file or memory_store resource, as the reference shows it (no token)."""

    type: Literal["github_repository", "file", "memory_store"]
    id: str | None = None

    model_config = {"extra": "allow"}


class SessionResourceList(Schema):
    data: list[SessionResource]
    next_page: str | None


# -- events


class EventsSend(Body):
    events: list[dict[str, Any]] = Field(..., min_length=1, description="User events, appended all or none.")


class EventsQuery(CreatedRange, Page):
    limit: int = Field(100, ge=1, le=1000)
    order: Literal["asc", "desc"] = "asc"
    types: list[str] = Field([], alias="types[]")


class StreamQuery(Schema):
    event_deltas: list[Literal["agent.message", "agent.thinking"]] = Field(
        [], alias="event_deltas[]", description="Workbench's own: stream these events' text as it is written."
    )


class Event(Schema):
    id: str
    type: str
    processed_at: Timestamp

    model_config = {"extra": "allow"}


class EventList(Schema):
    data: list[Event]
    next_page: str | None = None
