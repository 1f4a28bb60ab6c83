"""The toolset: routes a call to its tool, and the bash tool on top of the persistent shell."""

from __future__ import annotations

from typing import Any

from . import files, search
from .call import Call
from .disk import SANDBOX_DISK, full_message
from .errors import Failed
from .output import render, spool
from .schema import validate
from .shell import Shell

STOPPED = {
    "timeout": "the command timed out after {timeout:g} s and was stopped",
    "cancelled": "interrupted: the call was cancelled and the command was stopped",
    "output": "the command printed more than {limit} MiB and was stopped",
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
        out = spool(call.id, "bash")
        outcome = self.shell.run(
            call.id,
            command,
            out_path=out.path,
            timeout_s=call.timeout_s,
            cancel=call.cancel,
            max_output_bytes=out.max_bytes,
        )
        text = render(out)
        notes += outcome.notes
        if SANDBOX_DISK.check():
            lost = ", and what the command printed once it was full could not be kept"
            notes.append(f"[{full_message(lost if out.place == 'disk' else '')}]")
        if outcome.stopped:
            if outcome.exit_code is not None:
                notes.append("[the shell is still usable: working directory and variables are kept]")
            limit = out.max_bytes // (1024 * 1024)
            stopped = "[" + STOPPED[outcome.stopped].format(timeout=call.timeout_s, limit=limit) + "]"
            raise Failed("\n".join(filter(None, [text, stopped, *notes])))
        if outcome.exit_code:
            notes.insert(0, f"[exit code {outcome.exit_code}]")
        return "\n".join(filter(None, [text, *notes]))
