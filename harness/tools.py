"""The tools a brain offers the model, how their input is checked, and who runs them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sandboxes.toolbox.schema import TOOLS, TOOLSET
from sandboxes.toolbox.schema import input_problem as input_problem

# The toolbox's table is the one source; the harness adds the field that picks which sandbox runs a call.
TOOLSET_SCHEMAS: dict[str, dict[str, Any]] = {
    name: {
        "description": definition["description"],
        "input_schema": {
            **definition["input_schema"],
            "properties": {
                **definition["input_schema"]["properties"],
                "sandbox": {
                    "type": "string",
                    "description": "Which of your sandboxes runs this call (default: your first).",
                },
            },
        },
    }
    for name, definition in TOOLS.items()
}

# A self-hosted environment's toolset runs on the SDK's environment worker (its `agent_toolset_20260401`
# tools, anthropic/lib/tools/agent_toolset.py), on the worker's machine. The inputs are the toolbox's, which
# are the SDK's (bash, read, write, edit, glob, grep, the same fields), without the harness's `sandbox`: the
# SDK's tools refuse a field they do not have. The descriptions say what the SDK's implementations do.
WORKER_DESCRIPTIONS = {
    "bash": "Run a command in a persistent bash shell on the worker's machine; its working directory and "
    "variables persist across calls (restart=true starts a new shell).",
    "read": "Read a file under the worker's working directory; view_range [start, end] picks lines (1-based, "
    "inclusive; an end of 0 or less reads to the end).",
    "write": "Write a file, replacing its contents and creating its parent directories.",
    "edit": "Replace old_string by new_string in a file; old_string must occur once unless replace_all.",
    "glob": "List files matching a glob pattern (e.g. **/*.py) under the working directory, newest first.",
    "grep": "Search file contents for a regular expression, returning the matching lines.",
}


def _as_the_worker_takes_it(schema: dict[str, Any]) -> dict[str, Any]:
    """The toolbox's input schema as the SDK's input types have it (types/beta/
    beta_managed_agents_agent_toolset20260401_*_input.py): an optional field may be null, and bash's
    timeout_ms may be 0 (the runner's default). The worker checks those fields itself."""
    required = schema.get("required", [])
    properties = {
        name: field
        if name in required
        else {"anyOf": [{k: v for k, v in field.items() if k != "minimum"}, {"type": "null"}]}
        for name, field in schema["properties"].items()
    }
    return {**schema, "properties": properties}


WORKER_SCHEMAS: dict[str, dict[str, Any]] = {
    name: {
        "description": WORKER_DESCRIPTIONS[name],
        "input_schema": _as_the_worker_takes_it(definition["input_schema"]),
    }
    for name, definition in TOOLS.items()
}

HAND_TOOLS: dict[str, dict[str, Any]] = {
    "provision_sandbox": {
        "description": "Provision a new sandbox under a name; pass sandbox=<name> to toolset calls to use it.",
        "input_schema": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    },
    "release_sandbox": {
        "description": "Terminate one of your sandboxes by name.",
        "input_schema": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    },
    "transfer_sandbox": {
        "description": "Pass one of your sandboxes, with its files and running processes, to another session.",
        "input_schema": {
            "type": "object",
            "required": ["name", "to_session"],
            "properties": {"name": {"type": "string"}, "to_session": {"type": "string"}},
        },
    },
}

# Their default permission policies. Passing a sandbox gives another session its files and running processes,
# so the user confirms it unless the agent's toolset says otherwise (a `configs` entry named for the tool).
HAND_TOOL_POLICIES = {
    "provision_sandbox": "always_allow",
    "release_sandbox": "always_allow",
    "transfer_sandbox": "always_ask",
}

# Running these twice has the effect of running them once, so recovery may re-run them.
SAFE_TO_REPEAT = frozenset({"read", "glob", "grep", "write"})


@dataclass(frozen=True)
class McpTarget:
    """Where an MCP tool lives: the agent's server (its `mcp_servers[].name` and URL) and the tool's own name."""

    server: str
    url: str
    tool: str


@dataclass(frozen=True)
class Tool:
    name: str
    # "toolset" (runs in a sandbox), "hands" (manages sandboxes), "custom" (the client runs it), "worker" (a
    # self-hosted environment's worker runs it) or "mcp" (an MCP server runs it: harness.mcp)
    kind: str
    definition: dict[str, Any]
    permission: str  # "allow" or "ask"
    mcp: McpTarget | None = None


def agent_tools(agent: dict[str, Any], *, only: frozenset[str] | None = None) -> dict[str, Tool]:
    tools: dict[str, Tool] = {}
    for entry in agent.get("tools") or []:
        if entry["type"] == TOOLSET:
            configs = {config["name"]: config for config in entry["configs"]}
            if only is None and configs.get("bash", {}).get("enabled"):
                for name, schema in HAND_TOOLS.items():
                    config = configs.get(name) or {
                        "enabled": True,
                        "permission_policy": {"type": HAND_TOOL_POLICIES[name]},
                    }
                    if config["enabled"]:
                        tools[name] = Tool(name, "hands", {"name": name, **schema}, _permission(config))
            for name, config in configs.items():
                if config["enabled"] and name in TOOLSET_SCHEMAS and (only is None or name in only):
                    tools[name] = Tool(
                        name, "toolset", {"name": name, **TOOLSET_SCHEMAS[name]}, _permission(config)
                    )
        elif entry["type"] == "custom" and (only is None or entry["name"] in only):
            tools[entry["name"]] = Tool(
                entry["name"],
                "custom",
                {
                    "name": entry["name"],
                    "description": entry["description"],
                    "input_schema": entry["input_schema"],
                },
                "allow",
            )
    return tools


def runs_on_worker(environment: dict[str, Any]) -> bool:
    """Whether an environment's (its config's) toolset calls are run by its self-hosted worker."""
    return environment.get("type") == "self_hosted"


def on_worker(tools: dict[str, Tool]) -> dict[str, Tool]:
    """A self-hosted session's tools: the toolset's run by the worker, in the shapes the SDK's worker runs.

    The hands tools are not offered: they provision and pass the platform's sandboxes, and a self-hosted
    session has none (its hands are the worker's). The others (custom, MCP) are run where they always are."""
    return {
        name: replace(tool, kind="worker", definition={"name": name, **WORKER_SCHEMAS[name]})
        if tool.kind == "toolset"
        else tool
        for name, tool in tools.items()
        if tool.kind != "hands"
    }


def _permission(config: dict[str, Any]) -> str:
    return "ask" if config["permission_policy"]["type"] == "always_ask" else "allow"
