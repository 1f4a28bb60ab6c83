"""The toolset's one table: the brain offers and checks what the sandbox's toolbox checks, in the same words."""

from __future__ import annotations

import ast
import io
import sys
import tarfile
from typing import Any

import pytest

from harness.tools import TOOLSET_SCHEMAS, input_problem
from sandboxes.toolbox import schema
from sandboxes.toolbox.bundle import SOURCE_DIR, archive
from sandboxes.toolbox.errors import InputError

BAD_INPUTS: list[tuple[str, Any, str]] = [
    ("read", {}, "input is missing the required field 'file_path'"),
    ("read", {"file_path": "a", "view_range": [1, "2"]}, "input.view_range[1] must be of type integer"),
    ("bash", {"command": 3}, "input.command must be of type string"),
    ("bash", {"restart": 1}, "input.restart must be of type boolean"),
    ("bash", {"command": "true", "timeout_ms": True}, "input.timeout_ms must be of type integer"),
    ("bash", {"command": "true", "timeout_ms": 0}, "input.timeout_ms must be at least 1"),
    ("glob", {"pattern": "*", "path": None}, "input.path must be of type string"),
    ("edit", {"file_path": "a", "old_string": "x"}, "input is missing the required field 'new_string'"),
    ("write", ["a", "b"], "input must be of type object"),
]


def test_the_brain_offers_the_toolbox_table_with_only_the_sandbox_field_added() -> None:
    assert set(TOOLSET_SCHEMAS) == schema.TOOL_NAMES
    for name, offered in TOOLSET_SCHEMAS.items():
        own = schema.TOOLS[name]
        assert offered["description"] == own["description"]
        properties = dict(offered["input_schema"]["properties"])
        assert properties.pop("sandbox")["type"] == "string"
        assert properties == own["input_schema"]["properties"]
        assert {**offered["input_schema"], "properties": properties} == own["input_schema"]
    assert all("sandbox" not in tool["input_schema"]["properties"] for tool in schema.TOOLS.values()), (
        "the harness's field must not leak into the toolbox's own table"
    )


@pytest.mark.parametrize(("tool", "value", "message"), BAD_INPUTS)
def test_the_brain_and_the_daemon_refuse_a_bad_input_in_the_same_words(
    tool: str, value: Any, message: str
) -> None:
    assert input_problem(TOOLSET_SCHEMAS[tool]["input_schema"], value) == message
    with pytest.raises(InputError) as refused:
        schema.validate(tool, value)
    assert str(refused.value) == message


def test_an_unknown_field_is_refused_naming_the_fields_each_side_takes() -> None:
    value = {"file_path": "a", "content": "b", "mode": "x"}
    assert input_problem(TOOLSET_SCHEMAS["write"]["input_schema"], value) == (
        "input has no field 'mode'; its fields are file_path, content, sandbox"
    )
    with pytest.raises(InputError, match=r"^input has no field 'mode'; its fields are file_path, content$"):
        schema.validate("write", value)


def test_the_daemon_refuses_a_tool_outside_the_table_and_fills_absent_fields_with_none() -> None:
    with pytest.raises(
        InputError, match="unknown tool 'paint'; the toolset has bash, edit, glob, grep, read, write"
    ):
        schema.validate("paint", {})
    assert schema.validate("glob", {"pattern": "*"}) == {"pattern": "*", "path": None}
    assert input_problem(TOOLSET_SCHEMAS["glob"]["input_schema"], {"pattern": "*", "sandbox": "main"}) is None


def test_a_deeply_nested_hostile_value_costs_no_recursion() -> None:
    nested: Any = 1
    for _ in range(sys.getrecursionlimit() * 2):
        nested = [nested]
    assert schema.validate("read", {"file_path": "a"}) == {"file_path": "a", "view_range": None}
    with pytest.raises(InputError, match=r"input.view_range\[0\] must be of type integer"):
        schema.validate("read", {"file_path": "a", "view_range": nested})


def test_the_sandbox_gets_this_very_table_and_it_imports_nothing_but_the_standard_library() -> None:
    with tarfile.open(fileobj=io.BytesIO(archive())) as tar:
        shipped = tar.extractfile("opt/workbench/toolbox/schema.py")
        assert shipped is not None and shipped.read() == (SOURCE_DIR / "schema.py").read_bytes()
    tree = ast.parse((SOURCE_DIR / "schema.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            assert node.module and node.module.split(".")[0] in sys.stdlib_module_names | {"__future__"}
        elif isinstance(node, ast.Import):
            assert all(alias.name.split(".")[0] in sys.stdlib_module_names for alias in node.names)
