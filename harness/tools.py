"""The tools a brain offers the model, how their input is checked, and who runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TOOLSET_SCHEMAS: dict[str, dict[str, Any]] = {
    "bash": {
        "description": "Run a command in a persistent bash shell in the sandbox.",
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "restart": {"type": "boolean"},
                "timeout_ms": {"type": "integer"},
            },
        },
    },
    "read": {
        "description": "Read a file, with line numbers; view_range [start, end] picks lines.",
        "input_schema": {
            "type": "object",
            "required": ["file_path"],
            "properties": {
                "file_path": {"type": "string"},
                "view_range": {"type": "array", "items": {"type": "integer"}},
            },
        },
    },
    "write": {
        "description": "Write a file, replacing its contents.",
        "input_schema": {
            "type": "object",
            "required": ["file_path", "content"],
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
        },
    },
    "edit": {
        "description": "Replace old_string by new_string in a file (all occurrences with replace_all).",
        "input_schema": {
            "type": "object",
            "required": ["file_path", "old_string", "new_string"],
            "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"},
            },
        },
    },
    "glob": {
        "description": "List files matching a glob pattern.",
        "input_schema": {
            "type": "object",
            "required": ["pattern"],
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
        },
    },
    "grep": {
        "description": "Search file contents for a regular expression.",
        "input_schema": {
            "type": "object",
            "required": ["pattern"],
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
        },
    },
}
for _schema in TOOLSET_SCHEMAS.values():
    _schema["input_schema"]["properties"]["sandbox"] = {
        "type": "string",
        "description": "Which of your sandboxes runs this call (default: your first).",
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
_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


@dataclass(frozen=True)
class Tool:
    name: str
    kind: str  # "toolset" (runs in a sandbox), "hands" (manages sandboxes) or "custom" (the client runs it)
    definition: dict[str, Any]
    permission: str  # "allow" or "ask"


def agent_tools(agent: dict[str, Any], *, only: frozenset[str] | None = None) -> dict[str, Tool]:
    tools: dict[str, Tool] = {}
    for entry in agent.get("tools") or []:
        if entry["type"] == "agent_toolset_20260401":
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


def input_problem(schema: dict[str, Any], value: Any, where: str = "input") -> str | None:
    """What is wrong with `value` for a JSON schema (the common subset tools use), or None."""
    expected = schema.get("type")
    if expected in _JSON_TYPES:
        kind = _JSON_TYPES[expected]
        if not isinstance(value, kind) or (expected in ("integer", "number") and isinstance(value, bool)):
            return f"{where} must be of type {expected}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                return f"{where} is missing the required field {key!r}"
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                problem = input_problem(sub, value[key], f"{where}.{key}")
                if problem:
                    return problem
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = input_problem(schema["items"], item, f"{where}[{i}]")
            if problem:
                return problem
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}"
    return None
