"""The tools a brain offers the model, how their input is checked, and who runs them."""

from __future__ import annotations

from dataclasses import dataclass
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
    # "toolset" (runs in a sandbox), "hands" (manages sandboxes), "custom" (the client runs it) or "mcp"
    # (an MCP server runs it: harness.mcp)
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


def _permission(config: dict[str, Any]) -> str:
    return "ask" if config["permission_policy"]["type"] == "always_ask" else "allow"
