"""The search tools: glob (file names) and grep (file contents, with ripgrep when present)."""

from __future__ import annotations

import glob as globbing
import os
import shutil
import signal
import subprocess
from typing import Any

from .call import Call
from .errors import Failed, InputError
from .files import WORKSPACE, is_allowed, resolve
from .output import output_path, render

MAX_GLOB_SCANNED = 100_000
MAX_GLOB_LISTED = 1000


def glob(values: dict[str, Any], call: Call) -> str:
    pattern = values["pattern"]
    base = resolve(values["path"] or WORKSPACE)
    if not os.path.isdir(base):
        raise InputError(f"{base} is not a directory")
    if pattern.startswith("/"):
        raise InputError("pattern must be relative (e.g. **/*.py); put the directory in path")
    found: list[tuple[float, str]] = []
    scanned_all = True
    for n, relative in enumerate(globbing.iglob(pattern, root_dir=base, recursive=True), 1):
        if n % 256 == 0:
            call.check()
        path = os.path.normpath(os.path.join(base, relative))
        if not is_allowed(os.path.realpath(path)):
            continue
        try:
            found.append((os.lstat(path).st_mtime, path))
        except FileNotFoundError:
            continue
        if len(found) >= MAX_GLOB_SCANNED:
            scanned_all = False
            break
    if not found:
        return f"No files match {pattern} in {base}"
    # Newest first, as the model most often wants what it just worked on.
    found.sort(key=lambda item: (-item[0], item[1]))
    lines = [path for _, path in found[:MAX_GLOB_LISTED]]
    if len(found) > MAX_GLOB_LISTED or not scanned_all:
        total = f"{len(found):,}" if scanned_all else f"more than {MAX_GLOB_SCANNED:,}"
        lines.append(f"[{total} files match; the {MAX_GLOB_LISTED} most recently modified are listed]")
    return "\n".join(lines)


def grep(values: dict[str, Any], call: Call) -> str:
    pattern = values["pattern"]
    target = resolve(values["path"] or WORKSPACE)
    if not os.path.exists(target):
        raise Failed(f"{target} does not exist")
    rg = shutil.which("rg")
    if rg:
        command = [rg, "--line-number", "--no-heading", "--with-filename", "--color=never"]
        command += ["--max-columns=500", "--max-columns-preview", "--regexp", pattern, "--", target]
    elif shutil.which("grep"):
        command = ["grep", "-r", "-n", "-H", "-I", "-E", "--exclude-dir=.git", "-e", pattern, "--", target]
    else:
        raise Failed("neither rg nor grep is installed in this sandbox")
    out = output_path(call.id, "grep")
    errors_path = out + ".err"
    with open(out, "wb") as stdout, open(errors_path, "w+b") as stderr:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True
        )
        try:
            while True:
                try:
                    code = process.wait(0.1)
                    break
                except subprocess.TimeoutExpired:
                    call.check()
        except Failed:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            os.unlink(out)
            raise
        finally:
            stderr.seek(0)
            errors = stderr.read(2000).decode("utf-8", "replace").strip()
            os.unlink(errors_path)
    if code == 1:
        os.unlink(out)
        return f"No matches for {pattern} in {target}"
    text = render(out)
    if code == 0:
        return text
    if not text:
        raise Failed(f"grep failed: {errors or f'exit code {code}'}")
    return f"{text}\n[some files could not be searched: {errors}]"
