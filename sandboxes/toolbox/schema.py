"""The `agent_toolset_20260401` tools: the one table of their definitions, and the one check of an input.

The harness offers the model these definitions (adding its own `sandbox` field) and checks each call
against them with `input_problem`; the daemon checks what reaches it with `validate`, as the boundary
that any process able to reach its socket meets. Both read this table: the toolbox is copied into every
sandbox whole (`bundle.py`), this file with it.
"""

from __future__ import annotations

from typing import Any

from .errors import InputError

TOOLSET = "agent_toolset_20260401"


def _object(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


_STRING: dict[str, Any] = {"type": "string"}
_BOOLEAN: dict[str, Any] = {"type": "boolean"}

TOOLS: dict[str, dict[str, Any]] = {
    "bash": {
        "description": "Run a command in a persistent bash shell in the sandbox.",
        "input_schema": _object(
            {"command": _STRING, "restart": _BOOLEAN, "timeout_ms": {"type": "integer", "minimum": 1}}
        ),
    },
    "read": {
        "description": "Read a file, with line numbers; view_range [start, end] picks lines.",
        "input_schema": _object(
            {"file_path": _STRING, "view_range": {"type": "array", "items": {"type": "integer"}}},
            "file_path",
        ),
    },
    "write": {
        "description": "Write a file, replacing its contents.",
        "input_schema": _object({"file_path": _STRING, "content": _STRING}, "file_path", "content"),
    },
    "edit": {
        "description": "Replace old_string by new_string in a file (all occurrences with replace_all).",
        "input_schema": _object(
            {"file_path": _STRING, "old_string": _STRING, "new_string": _STRING, "replace_all": _BOOLEAN},
            "file_path",
            "old_string",
            "new_string",
        ),
    },
    "glob": {
        "description": "List files matching a glob pattern.",
        "input_schema": _object({"pattern": _STRING, "path": _STRING}, "pattern"),
    },
    "grep": {
        "description": "Search file contents for a regular expression.",
        "input_schema": _object({"pattern": _STRING, "path": _STRING}, "pattern"),
    },
}
TOOL_NAMES = frozenset(TOOLS)

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


def input_problem(schema: dict[str, Any], value: Any, where: str = "input") -> str | None:
    """What is wrong with `value` for a JSON schema (the subset tools use), or None.

    It recurses along the schema, not the value, so a deeply nested hostile value costs no depth.
    """
    expected = schema.get("type")
    if expected in _JSON_TYPES and (
        not isinstance(value, _JSON_TYPES[expected])
        or (expected in ("integer", "number") and isinstance(value, bool))
    ):
        return f"{where} must be of type {expected}"
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties") or {}
        for key in schema.get("required", []):
            if key not in value:
                return f"{where} is missing the required field {key!r}"
        if schema.get("additionalProperties") is False:
            unknown = sorted(str(key) for key in value if key not in properties)
            if unknown:
                fields = ", ".join(map(repr, unknown))
                return f"{where} has no field {fields}; its fields are {', '.join(properties)}"
        for key, sub in properties.items():
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
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        return f"{where} must be at least {schema['minimum']}"
    return None


def validate(tool: str, input: Any) -> dict[str, Any]:
    """The input of a call with every field (absent optional ones as None); InputError naming the first
    problem."""
    definition = TOOLS.get(tool)
    if definition is None:
        raise InputError(f"unknown tool {tool!r}; the toolset has {', '.join(sorted(TOOLS))}")
    schema = definition["input_schema"]
    problem = input_problem(schema, input)
    if problem:
        raise InputError(problem)
    return {name: input.get(name) for name in schema["properties"]}
