"""The input schemas of the `agent_toolset_20260401` tools, and their validation."""

from __future__ import annotations

from typing import Any

from .errors import InputError

TOOLSET = "agent_toolset_20260401"

# field -> (type, required)
SCHEMAS: dict[str, dict[str, tuple[type, bool]]] = {
    "bash": {"command": (str, False), "restart": (bool, False), "timeout_ms": (int, False)},
    "read": {"file_path": (str, True), "view_range": (list, False)},
    "write": {"file_path": (str, True), "content": (str, True)},
    "edit": {
        "file_path": (str, True),
        "old_string": (str, True),
        "new_string": (str, True),
        "replace_all": (bool, False),
    },
    "glob": {"pattern": (str, True), "path": (str, False)},
    "grep": {"pattern": (str, True), "path": (str, False)},
}
TOOL_NAMES = frozenset(SCHEMAS)
_TYPE_NAMES = {str: "a string", bool: "true or false", int: "an integer", list: "a list"}


def validate(tool: str, input: Any) -> dict[str, Any]:
    """The input with absent optional fields as None; InputError naming the first problem."""
    schema = SCHEMAS.get(tool)
    if schema is None:
        raise InputError(f"unknown tool {tool!r}; the toolset has {', '.join(sorted(SCHEMAS))}")
    if not isinstance(input, dict):
        raise InputError(f"the input of {tool} must be an object")
    unknown = sorted(set(input) - set(schema))
    if unknown:
        raise InputError(f"{tool} has no field {', '.join(unknown)}; its fields are {', '.join(schema)}")
    values: dict[str, Any] = {}
    for name, (kind, required) in schema.items():
        value = input.get(name)
        if value is None:
            if required:
                raise InputError(f"{tool} needs {name}")
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise InputError(f"{name} must be {_TYPE_NAMES[kind]}")
        values[name] = value
    return values
