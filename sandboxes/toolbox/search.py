"""The search tools: glob (file names) and grep (file contents, with ripgrep when present)."""

from __future__ import annotations

import contextlib
import fnmatch
import glob as globbing
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

from .call import Call
from .errors import Failed, InputError
from .files import ALLOWED_ROOTS, WORKSPACE, is_allowed, resolve
from .output import discard, render, spool

MAX_GLOB_MATCHES = 100_000
MAX_GLOB_SCANNED = 1_000_000  # directory entries looked at
MAX_GLOB_LISTED = 1000


class _ScanCut(Exception):
    pass


class _Scan:
    """Glob's matching, over directory listings and within the allowed directories only.

    Python's glob walks wherever a pattern leads (`../**`, a symlink to /, /proc's endless links) and
    leaves the filtering to the caller, so a pattern that matches nothing allowed could run to the
    call's limit. Here a symlinked directory is entered only if its real path is allowed, `**` never
    follows symlinks (as bash's globstar), and every entry listed counts toward MAX_GLOB_SCANNED. As
    in glob, a wildcard matches a leading dot only when its part starts with one.
    """

    def __init__(self, call: Call):
        self.call = call
        self.scanned = 0

    def matches(
        self, directory: str, parts: list[str], listing: list[os.DirEntry[str]] | None = None
    ) -> Iterator[str]:
        part, rest = parts[0], parts[1:]
        if part == "**":
            yield from self._recursive(directory, rest)
            return
        if globbing.has_magic(part):
            entries = self._list(directory) if listing is None else listing
            candidates = [entry.path for entry in entries if _match(entry.name, part)]
        else:
            path = os.path.join(directory, part)
            candidates = [path] if os.path.lexists(path) else []
        for path in candidates:
            if not rest:
                if _allowed(path):
                    yield path
            elif os.path.isdir(path) and _allowed(path):
                yield from self.matches(path, rest)

    def _recursive(self, top: str, rest: list[str]) -> Iterator[str]:
        """`**`: top and every directory under it, not through symlinks, then the rest of the pattern."""
        stack = [top]
        while stack:
            directory = stack.pop()
            listing = self._list(directory)
            if rest:
                yield from self.matches(directory, rest, listing)
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                if not rest and _allowed(entry.path):
                    yield entry.path
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)

    def _list(self, directory: str) -> list[os.DirEntry[str]]:
        self.call.check()
        try:
            with os.scandir(directory) as entries:
                listing = list(entries)
        except OSError:
            return []
        self.scanned += len(listing)
        if self.scanned > MAX_GLOB_SCANNED:
            raise _ScanCut
        return listing


def _match(name: str, part: str) -> bool:
    return fnmatch.fnmatchcase(name, part) and (not name.startswith(".") or part.startswith("."))


def _allowed(path: str) -> bool:
    """Whether a path found under an allowed directory stays there: only a symlink may lead out."""
    return not os.path.islink(path) or is_allowed(os.path.realpath(path))


def glob(values: dict[str, Any], call: Call) -> str:
    pattern = values["pattern"]
    base = resolve(values["path"] or WORKSPACE)
    if not os.path.isdir(base):
        raise InputError(f"{base} is not a directory")
    if pattern.startswith("/"):
        raise InputError("pattern must be relative (e.g. **/*.py); put the directory in path")
    parts: list[str] = []
    for part in pattern.split("/"):
        if part not in ("", ".") and not (part == "**" and parts[-1:] == ["**"]):
            parts.append(part)
    if ".." in parts:
        raise InputError(
            "pattern must not climb out of its directory with '..': put the directory in path "
            f"(one of {' and '.join(ALLOWED_ROOTS)} or under them)"
        )
    found: list[tuple[float, str]] = []
    complete = True
    try:
        for path in _Scan(call).matches(base, parts) if parts else ():
            with contextlib.suppress(FileNotFoundError):
                found.append((os.lstat(path).st_mtime, os.path.normpath(path)))
            if len(found) >= MAX_GLOB_MATCHES:
                complete = False
                break
    except _ScanCut:
        complete = False
    if not found:
        if not complete:
            return (
                f"No files match {pattern} in the first {MAX_GLOB_SCANNED:,} entries under {base}; "
                "narrow the pattern or the path"
            )
        return f"No files match {pattern} in {base}"
    # Newest first, as the model most often wants what it just worked on.
    found.sort(key=lambda item: (-item[0], item[1]))
    lines = [path for _, path in found[:MAX_GLOB_LISTED]]
    if len(found) > MAX_GLOB_LISTED or not complete:
        total = f"{len(found):,}" if complete else f"at least {len(found):,} (the search stopped there)"
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
    out = spool(call.id, "grep")
    errors_path = os.devnull if out.place == "nowhere" else out.path + ".err"
    with open(out.path, "wb") as stdout, open(errors_path, "w+b") as stderr:
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
            discard(out)
            raise
        finally:
            stderr.seek(0)
            errors = stderr.read(2000).decode("utf-8", "replace").strip()
            if errors_path != os.devnull:
                os.unlink(errors_path)
    if code == 1:
        discard(out)
        return f"No matches for {pattern} in {target}"
    text = render(out)
    if code == 0:
        return text
    if not text:
        raise Failed(f"grep failed: {errors or f'exit code {code}'}")
    return f"{text}\n[some files could not be searched: {errors}]"
