"""The toolset: routes a call to its tool, and the bash tool on top of the persistent shell."""

from __future__ import annotations

from typing import Any

from . import files, search
from .call import Call
from .errors import Failed
from .output import MAX_OUTPUT_BYTES, output_path, render
from .schema import validate
from .shell import Shell

STOPPED = {
    "timeout": "the command timed out after {timeout:g} s and was stopped",
    "cancelled": "interrupted: the call was cancelled and the command was stopped",
    "output": f"the command printed more than {MAX_OUTPUT_BYTES // (1024 * 1024)} MiB and was stopped",
}


class Toolset:
    def __init__(self, shell: Shell):
        self.shell = shell
        self._tools = {
            "bash": self.bash,
            "read": files.read,
            "write": files.write,
            "edit": files.edit,
            "glob": search.glob,
            "grep": search.grep,
        }

    def run(self, tool: str, input: Any, call: Call) -> str:
        values = validate(tool, input)
        return self._tools[tool](values, call)

    def bash(self, values: dict[str, Any], call: Call) -> str:
        """Run a command in the persistent shell; stdout and stderr come back interleaved.

        The call's time limit is the request's (the provider derives it from timeout_ms).
        """
        notes = []
        if values["restart"]:
            notes.append(self.shell.restart())
        command = values["command"]
        if command is None or not command.strip():
            if notes:
                return "\n".join(notes)
            raise Failed("bash needs a command (or restart: true)")
        out = output_path(call.id, "bash")
        outcome = self.shell.run(call.id, command, out_path=out, timeout_s=call.timeout_s, cancel=call.cancel)
        text = render(out)
        notes += outcome.notes
        if outcome.stopped:
            if outcome.exit_code is not None:
                notes.append("[the shell is still usable: working directory and variables are kept]")
            stopped = "[" + STOPPED[outcome.stopped].format(timeout=call.timeout_s) + "]"
            raise Failed("\n".join(filter(None, [text, stopped, *notes])))
        if outcome.exit_code:
            notes.insert(0, f"[exit code {outcome.exit_code}]")
        return "\n".join(filter(None, [text, *notes]))
