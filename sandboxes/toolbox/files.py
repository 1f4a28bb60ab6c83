"""The file tools (read, write, edit) and the rule on which paths the file tools may touch."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO

from .call import Call
from .disk import full_message, is_full
from .errors import Failed, InputError
from .output import CAP_BYTES

WORKSPACE = "/workspace"
ALLOWED_ROOTS = (WORKSPACE, "/tmp")
LINE_CHARS = 2000
MAX_EDIT_BYTES = 64 * 1024 * 1024
MAX_LISTED = 1000


def resolve(path: str) -> str:
    """The real path of `path` (relative to /workspace), refused when outside the allowed roots.

    The check is on the path with symlinks resolved, so a link in /workspace to /etc is refused.
    The bash tool can of course reach any file the sandbox user can: this rule keeps the file tools
    to the model's working areas, it is not the sandbox's security boundary.
    """
    if not path or "\0" in path:
        raise InputError("the path must be a non-empty string without NUL characters")
    absolute = os.path.normpath(os.path.join(WORKSPACE, path))
    real = os.path.realpath(absolute)
    if not is_allowed(real):
        shown = path if real == absolute else f"{path} (which resolves to {real})"
        raise InputError(f"{shown} is outside the allowed directories: {' and '.join(ALLOWED_ROOTS)}")
    return real


def is_allowed(real_path: str) -> bool:
    return any(real_path == root or real_path.startswith(root + "/") for root in ALLOWED_ROOTS)


def _is_binary(file: BinaryIO) -> bool:
    sniff = file.read(8192)
    file.seek(0)
    return b"\0" in sniff


def _lines(file: BinaryIO) -> Iterator[tuple[bytes, bool]]:
    """Lines without their ending, each cut to LINE_CHARS bytes (bool: was cut), in bounded memory."""
    while True:
        line = file.readline(LINE_CHARS)
        if not line:
            return
        cut = False
        if len(line) == LINE_CHARS and not line.endswith(b"\n"):  # an overlong line: skip its rest
            rest = file.readline(LINE_CHARS)
            while rest and rest != b"\n":
                cut = True
                if rest.endswith(b"\n"):
                    break
                rest = file.readline(LINE_CHARS)
        yield line.rstrip(b"\n").rstrip(b"\r"), cut


def read(values: dict[str, Any], call: Call) -> str:
    path = resolve(values["file_path"])
    if os.path.isdir(path):
        return _list_directory(path)
    if not os.path.exists(path):
        raise Failed(f"{path} does not exist")
    start, end = _view_range(values["view_range"])
    shown: list[str] = []
    chars = 0
    last_shown = 0
    total = 0
    with open(path, "rb") as file:
        if _is_binary(file):
            size = os.fstat(file.fileno()).st_size
            raise Failed(
                f"{path} is a binary file ({size:,} bytes); use bash (e.g. xxd or file) to inspect it"
            )
        for total, (line, cut) in enumerate(_lines(file), 1):
            if total % 10_000 == 0:
                call.check()
            if total < start or (end != -1 and total > end) or chars > CAP_BYTES:
                continue
            text = line.decode("utf-8", "replace") + (" [line cut]" if cut else "")
            entry = f"{total:6}\t{text}"
            if chars + len(entry) > CAP_BYTES:
                chars = CAP_BYTES + 1
                continue
            shown.append(entry)
            chars += len(entry) + 1
            last_shown = total
    if total == 0:
        return f"[{path} is empty]"
    if start > total:
        raise InputError(f"view_range starts at line {start}, but {path} has {total} lines")
    wanted_end = total if end == -1 else min(end, total)
    if last_shown < wanted_end:
        shown.append(
            f"[showing lines {start}-{last_shown} of {total}: the output is capped at {CAP_BYTES:,} "
            f"characters; use view_range to read from line {last_shown + 1}]"
        )
    return "\n".join(shown)


def _view_range(view_range: list[Any] | None) -> tuple[int, int]:
    if view_range is None:
        return 1, -1
    if len(view_range) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in view_range):
        raise InputError("view_range must be [start, end]: two line numbers, end -1 meaning the last line")
    start, end = view_range
    if start < 1 or (end != -1 and end < start):
        raise InputError("view_range must have 1 <= start <= end, or end -1 for the last line")
    return start, end


def _list_directory(path: str) -> str:
    entries = sorted(os.scandir(path), key=lambda entry: entry.name)
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries[:MAX_LISTED]]
    header = f"[{path} is a directory with {len(entries)} entries"
    header += "]" if len(entries) <= MAX_LISTED else f"; the first {MAX_LISTED} are listed]"
    return "\n".join([header, *names])


def write(values: dict[str, Any], call: Call) -> str:
    path = resolve(values["file_path"])
    if os.path.isdir(path):
        raise InputError(f"{path} is a directory")
    existed = os.path.exists(path)
    data = values["content"].encode("utf-8", "surrogateescape")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _store(path, data, call)
    except OSError as error:
        if not is_full(error):
            raise
        raise Failed(full_message(f", so {path} was {'not changed' if existed else 'not created'}")) from None
    return f"{'Updated' if existed else 'Created'} {path} ({len(data):,} bytes)"


def _store(path: str, data: bytes, call: Call) -> None:
    """Make `data` the file's content. A file that exists is replaced only once all of the new content
    is written beside it (as `sed -i` does), so that a disk too full for it leaves the file as it was."""
    if not os.path.isfile(path):
        _write_whole(path, data)
        return
    beside = os.path.join(os.path.dirname(path), f".workbench-{call.id}.tmp")
    _write_whole(beside, data, mode=stat.S_IMODE(os.stat(path).st_mode))
    try:
        os.replace(beside, path)
    except BaseException:
        os.unlink(beside)
        raise


def _write_whole(path: str, data: bytes, *, mode: int | None = None) -> None:
    """Write `data` to `path`; a file made here that could not be written whole is removed."""
    created = not os.path.exists(path)
    try:
        with open(path, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.write(data)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise


def edit(values: dict[str, Any], call: Call) -> str:
    old, new = values["old_string"], values["new_string"]
    if old == "":
        raise InputError("old_string must not be empty (write creates or replaces a whole file)")
    if old == new:
        raise InputError("old_string and new_string are the same: there is nothing to change")
    path = resolve(values["file_path"])
    if not os.path.isfile(path):
        raise Failed(f"{path} does not exist" if not os.path.exists(path) else f"{path} is not a file")
    with open(path, "rb") as file:
        if _is_binary(file):
            raise Failed(f"{path} is a binary file")
        data = file.read(MAX_EDIT_BYTES + 1)
    if len(data) > MAX_EDIT_BYTES:
        raise Failed(f"{path} is larger than {MAX_EDIT_BYTES // (1024 * 1024)} MiB; edit it with bash (sed)")
    # surrogateescape keeps bytes that are not UTF-8 exactly as they were.
    text = data.decode("utf-8", "surrogateescape")
    count = text.count(old)
    if count == 0:
        raise Failed(
            f"old_string was not found in {path}; read the file and copy the text exactly, "
            "including whitespace and indentation"
        )
    if count > 1 and not values["replace_all"]:
        raise Failed(
            f"old_string occurs {count} times in {path}; include more surrounding lines to make it "
            "unique, or set replace_all to replace every occurrence"
        )
    first_line = text.count("\n", 0, text.index(old)) + 1
    text = text.replace(old, new) if values["replace_all"] else text.replace(old, new, 1)
    try:
        _store(path, text.encode("utf-8", "surrogateescape"), call)
    except OSError as error:
        if not is_full(error):
            raise
        raise Failed(full_message(f", so {path} was not changed")) from None
    plural = "s" if count > 1 else ""
    return f"Edited {path}: replaced {count} occurrence{plural}.\n" + _snippet(text, first_line, new)


def _snippet(text: str, first_line: int, new: str, context: int = 3) -> str:
    """The lines around the (first) replacement, numbered as read shows them."""
    lines = text.split("\n")
    start = max(1, first_line - context)
    end = min(len(lines), first_line + new.count("\n") + context)
    return "\n".join(f"{n:6}\t{lines[n - 1][:LINE_CHARS]}" for n in range(start, end + 1))
