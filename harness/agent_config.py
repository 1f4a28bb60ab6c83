"""Validation and normalisation of an agent's configuration into the form the API returns (§4)."""

from __future__ import annotations

import re
from typing import Any

from harness.context import validate_context
from harness.registry import validate_harness_name
from harness.tools import HAND_TOOL_POLICIES
from kernel.api.validation import MISSING, check_metadata, expect, no_unknown_fields, patch_metadata, text
from kernel.errors import Invalid

TOOLSET_TYPE = "agent_toolset_20260401"
TOOLSET_TOOLS = ("bash", "edit", "read", "write", "glob", "grep", "web_fetch", "web_search")
PERMISSION_POLICIES = ("always_allow", "always_ask", "auto")
CONFIG_FIELDS = (
    "name",
    "description",
    "system",
    "model",
    "tools",
    "mcp_servers",
    "skills",
    "multiagent",
    "execution_identity",
    "metadata",
    "harness",
    "context",
)
DEFAULT_HARNESS = "claude"
DEFAULT_CONTEXT: dict[str, Any] = {"type": "full"}
_CUSTOM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _policy(value: Any, where: str) -> dict[str, str]:
    expect(value, dict, where)
    if value.get("type") not in PERMISSION_POLICIES:
        raise Invalid(
            f"{where}.type must be one of {', '.join(PERMISSION_POLICIES)}, not {value.get('type')!r}."
        )
    return {"type": value["type"]}


def _tool_config(value: Any, where: str, default_policy: str) -> dict[str, Any]:
    expect(value, dict, where)
    enabled = value.get("enabled", True)
    expect(enabled, bool, f"{where}.enabled")
    policy = (
        _policy(value["permission_policy"], f"{where}.permission_policy")
        if "permission_policy" in value
        else {"type": default_policy}
    )
    return {"enabled": enabled, "permission_policy": policy}


def _toolset(tool: dict[str, Any], where: str) -> dict[str, Any]:
    no_unknown_fields(tool, ("type", "default_config", "configs"), where)
    default = _tool_config(tool.get("default_config", {}), f"{where}.default_config", "always_allow")
    given: dict[str, dict[str, Any]] = {}
    for i, config in enumerate(expect(tool.get("configs", []), list, f"{where}.configs")):
        cwhere = f"{where}.configs[{i}]"
        expect(config, dict, cwhere)
        name = config.get("name")
        if name not in TOOLSET_TOOLS and name not in HAND_TOOL_POLICIES:
            raise Invalid(
                f"{cwhere}.name must be one of {', '.join([*TOOLSET_TOOLS, *HAND_TOOL_POLICIES])}, "
                f"not {name!r}."
            )
        given[name] = config
    configs = []
    for name in TOOLSET_TOOLS:
        config = given.get(name, {})
        resolved = _tool_config(
            {
                "enabled": config.get("enabled", default["enabled"]),
                "permission_policy": config.get("permission_policy", default["permission_policy"]),
            },
            f"{where}.configs[{name}]",
            default["permission_policy"]["type"],
        )
        extras = {
            k: v for k, v in config.items() if k not in ("name", "type", "enabled", "permission_policy")
        }
        configs.append({"name": name, "type": name, **resolved, **extras})
    # Workbench's tools for the model's sandboxes are listed only when configured; each has its own default
    # policy (passing a sandbox asks), not the toolset's.
    for name, policy in HAND_TOOL_POLICIES.items():
        if name in given:
            no_unknown_fields(
                given[name], ("name", "type", "enabled", "permission_policy"), f"{where}.configs[{name}]"
            )
            configs.append(
                {"name": name, "type": name, **_tool_config(given[name], f"{where}.configs[{name}]", policy)}
            )
    return {"type": TOOLSET_TYPE, "default_config": default, "configs": configs}


def _mcp_toolset(tool: dict[str, Any], where: str, servers: set[str]) -> dict[str, Any]:
    no_unknown_fields(tool, ("type", "mcp_server_name", "default_config", "configs"), where)
    server = text(tool, "mcp_server_name", where, required=True, min_length=1)
    if server not in servers:
        raise Invalid(f"{where}.mcp_server_name {server!r} does not name any of the agent's mcp_servers.")
    default = _tool_config(tool.get("default_config", {}), f"{where}.default_config", "always_ask")
    configs = []
    for i, config in enumerate(expect(tool.get("configs", []), list, f"{where}.configs")):
        cwhere = f"{where}.configs[{i}]"
        name = text(expect(config, dict, cwhere), "name", cwhere, required=True, min_length=1)
        resolved = _tool_config(
            {k: v for k, v in config.items() if k != "name"}, cwhere, default["permission_policy"]["type"]
        )
        if "enabled" not in config:
            resolved["enabled"] = default["enabled"]
        configs.append({"name": name, **resolved})
    return {"type": "mcp_toolset", "mcp_server_name": server, "default_config": default, "configs": configs}


def _custom(tool: dict[str, Any], where: str) -> dict[str, Any]:
    no_unknown_fields(tool, ("type", "name", "description", "input_schema"), where)
    name = text(tool, "name", where, required=True)
    if not _CUSTOM_NAME.match(name):
        raise Invalid(f"{where}.name must be 1-128 characters of letters, digits, '_' or '-', not {name!r}.")
    description = text(tool, "description", where, required=True)
    schema = expect(tool.get("input_schema"), dict, f"{where}.input_schema")
    if schema.get("type") != "object":
        raise Invalid(f"{where}.input_schema.type must be 'object'.")
    return {"type": "custom", "name": name, "description": description, "input_schema": schema}


def _tools(value: Any, servers: set[str]) -> list[dict[str, Any]]:
    expect(value, list, "'tools'")
    tools, names, referenced = [], set(), set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        kind = expect(tool, dict, where).get("type")
        if kind == TOOLSET_TYPE:
            resolved = _toolset(tool, where)
            tool_names = [c["name"] for c in resolved["configs"] if c["enabled"]]
        elif kind == "mcp_toolset":
            resolved = _mcp_toolset(tool, where, servers)
            referenced.add(resolved["mcp_server_name"])
            tool_names = []
        elif kind == "custom":
            resolved = _custom(tool, where)
            tool_names = [resolved["name"]]
        else:
            raise Invalid(f"{where}.type must be {TOOLSET_TYPE}, mcp_toolset or custom, not {kind!r}.")
        for name in tool_names:
            if name in names:
                raise Invalid(f"{where}: tool name {name!r} is defined twice.")
            names.add(name)
        tools.append(resolved)
    unreferenced = servers - referenced
    if unreferenced:
        raise Invalid(
            f"mcp_servers {', '.join(sorted(unreferenced))} must each be used by an mcp_toolset in 'tools'."
        )
    return tools


def _mcp_servers(value: Any) -> list[dict[str, Any]]:
    expect(value, list, "'mcp_servers'")
    if len(value) > 20:
        raise Invalid("'mcp_servers' may hold at most 20 servers.")
    servers, names = [], set()
    for i, server in enumerate(value):
        where = f"mcp_servers[{i}]"
        no_unknown_fields(expect(server, dict, where), ("type", "name", "url"), where)
        if server.get("type") != "url":
            raise Invalid(f"{where}.type must be 'url'.")
        name = text(server, "name", where, required=True, min_length=1, max_length=255)
        url = text(server, "url", where, required=True, min_length=1)
        if name in names:
            raise Invalid(f"{where}.name {name!r} is used twice.")
        names.add(name)
        servers.append({"type": "url", "name": name, "url": url})
    return servers


def _model(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = {"id": value}
    expect(value, dict, "'model'")
    no_unknown_fields(value, ("id", "effort", "inference_geo", "speed"), "model")
    model_id = text(value, "id", "model", required=True, min_length=1)
    effort = value.get("effort")
    if isinstance(effort, str):
        effort = {"type": effort}
    return {
        "id": model_id,
        "effort": effort,
        "inference_geo": value.get("inference_geo"),
        "speed": value.get("speed", "standard"),
    }


def _skills(value: Any) -> list[dict[str, Any]]:
    skills = []
    for i, skill in enumerate(expect(value, list, "'skills'")):
        where = f"skills[{i}]"
        expect(skill, dict, where)
        if skill.get("type") not in ("anthropic", "custom"):
            raise Invalid(f"{where}.type must be 'anthropic' or 'custom'.")
        skill_id = text(skill, "skill_id", where, required=True, min_length=1)
        skills.append(
            {"type": skill["type"], "skill_id": skill_id, "version": str(skill.get("version") or "latest")}
        )
    return skills


def _context(value: Any) -> dict[str, Any]:
    return validate_context(value)


def _harness(value: Any) -> str:
    return validate_harness_name(value)


def normalise_agent_config(body: dict[str, Any], *, current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The full configuration of an agent version from a create body, or from an update over `current`."""
    config = dict(current or {})
    creating = current is None
    name = text(body, "name", required=creating, min_length=1, max_length=256)
    if name is not MISSING:
        config["name"] = name
    for key in ("description", "system"):
        value = text(body, key, nullable=True, max_length=100_000)
        if value is not MISSING:
            config[key] = value
        config.setdefault(key, None)
    if "model" in body or creating:
        if "model" not in body:
            raise Invalid("'model' is required.")
        config["model"] = _model(body["model"])
    if "mcp_servers" in body or creating:
        config["mcp_servers"] = _mcp_servers(body.get("mcp_servers") or [])
    if "tools" in body or "mcp_servers" in body or creating:
        servers = {server["name"] for server in config["mcp_servers"]}
        raw_tools = body["tools"] if "tools" in body else config.get("tools", [])
        config["tools"] = _tools(raw_tools or [], servers)
    if "skills" in body or creating:
        config["skills"] = _skills(body.get("skills") or [])
    if "multiagent" in body or creating:
        config["multiagent"] = expect(body.get("multiagent"), dict, "'multiagent'", nullable=True)
    if "execution_identity" in body or creating:
        identity = body.get("execution_identity") or {"type": "service_account"}
        expect(identity, dict, "'execution_identity'")
        if identity.get("type") not in ("service_account", "aws_role"):
            raise Invalid("'execution_identity.type' must be 'service_account' or 'aws_role'.")
        config["execution_identity"] = identity
    if "metadata" in body:
        patch = check_metadata(body["metadata"], patch=not creating)
        config["metadata"] = (
            patch_metadata(config.get("metadata", {}), patch) if not creating else dict(patch)
        )
    config.setdefault("metadata", {})
    if "harness" in body or creating:
        config["harness"] = _harness(body.get("harness", DEFAULT_HARNESS))
    if "context" in body or creating:
        config["context"] = _context(body.get("context", DEFAULT_CONTEXT))
    return config
