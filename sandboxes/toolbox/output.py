"""A tool's output, streamed to a file and returned capped.

A command may print gigabytes, so output never passes through memory whole: the command writes
straight into a file, and the reply carries the file's head and tail around a marker saying what was
cut and where the whole output was kept. The file is on the sandbox's disk; while the disk is full
it is in /dev/shm instead (memory, so a smaller cap), where the model's call that frees the disk
still has room to say what it did (see `disk.py`).
"""

from __future__ import annotations

import codecs
import contextlib
import os
from dataclasses import dataclass

from .client import RUNTIME_DIR
from .disk import SANDBOX_DISK, full_message, is_full

LIVE_DIR = RUNTIME_DIR + "/live"
OUTPUT_DIR = RUNTIME_DIR + "/out"
MEMORY_DIR = "/dev/shm/.toolbox"
CAP_BYTES = 30_000
HEAD_BYTES = 12_000
TAIL_BYTES = CAP_BYTES - HEAD_BYTES
# A command printing more than this is stopped: the file lives on the sandbox's disk.
MAX_OUTPUT_BYTES = 256 * 1024 * 1024
# The same while the disk is full, when the file is in memory.
MAX_MEMORY_OUTPUT_BYTES = 8 * 1024 * 1024
KEPT_OUTPUTS = 20
BINARY_NOTE = "[binary output: bytes that are not UTF-8 text are shown as \ufffd]"


@dataclass(frozen=True)
class Spool:
    """Where a running call's output goes: `place` is "disk", "memory" (the disk is full) or
    "nowhere" (/dev/shm is full too: the path is /dev/null)."""

    path: str
    place: str
    max_bytes: int


def spool(call_id: str, tool: str) -> Spool:
    """Where a running call's output goes; `render` deletes it, or keeps it in OUTPUT_DIR if cut."""
    name = f"{tool}-{call_id}.txt"
    if SANDBOX_DISK.has_room():
        try:
            return Spool(_created(LIVE_DIR, name), "disk", MAX_OUTPUT_BYTES)
        except OSError as error:
            if not is_full(error):
                raise
    try:
        # /dev/shm makes a file even when it is full: the room for a shown output is made sure of.
        return Spool(_created(MEMORY_DIR, name, room=CAP_BYTES), "memory", MAX_MEMORY_OUTPUT_BYTES)
    except OSError:
        return Spool(os.devnull, "nowhere", MAX_MEMORY_OUTPUT_BYTES)


def _created(directory: str, name: str, *, room: int = 0) -> str:
    """An empty file for an output; with `room`, one that so many bytes were found free for."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as file:
        if room:
            try:
                os.posix_fallocate(file.fileno(), 0, room)
                os.ftruncate(file.fileno(), 0)
            except OSError:
                os.unlink(path)
                raise
    return path


def discard(spool: Spool) -> None:
    """Remove an output that is not shown."""
    if spool.place != "nowhere":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spool.path)


def render(spool: Spool) -> str:
    """The file's text, or its head and tail around a marker naming where the whole file was kept."""
    if spool.place == "nowhere":
        return f"[the output could not be kept: {full_message(', and so is /dev/shm, where it goes then')}]"
    with open(spool.path, "rb") as file:
        data = file.read(CAP_BYTES + 1)
        if len(data) <= CAP_BYTES:
            os.unlink(spool.path)
            text, binary = _decode(data)
            return _finish(text, binary)
        size = os.fstat(file.fileno()).st_size
        head = _cut_at_line_end(data[:HEAD_BYTES])
        file.seek(size - TAIL_BYTES)
        tail = _cut_at_line_start(file.read(TAIL_BYTES))
        cut_bytes = size - len(head) - len(tail)
        file.seek(len(head))
        cut_lines = _count_lines(file, cut_bytes)
    kept = _keep(spool)
    where = f"is kept in {kept}" if kept else "could not be kept, as the sandbox's disk is full"
    head_text, head_binary = _decode(head)
    tail_text, tail_binary = _decode(tail, skip_partial_start=True)
    marker = (
        f"\n\n[... {cut_bytes:,} bytes ({cut_lines:,} lines) cut here; the whole output "
        f"({_size(size)}) {where} ...]\n\n"
    )
    return _finish(head_text + marker + tail_text, head_binary or tail_binary)


def _keep(spool: Spool) -> str | None:
    """The whole output's path in OUTPUT_DIR, or None when the disk has no room for it."""
    if spool.place == "disk":
        kept = os.path.join(OUTPUT_DIR, os.path.basename(spool.path))
        try:
            os.makedirs(OUTPUT_DIR, mode=0o700, exist_ok=True)
            _prune()
            os.rename(spool.path, kept)
            return kept
        except OSError as error:
            if not is_full(error):
                raise
    os.unlink(spool.path)
    return None


def _finish(text: str, binary: bool) -> str:
    text = text.rstrip("\n")
    if binary:
        text = f"{text}\n{BINARY_NOTE}" if text else BINARY_NOTE
    return text


def _decode(data: bytes, *, skip_partial_start: bool = False) -> tuple[str, bool]:
    """Text and whether it held bytes that are not UTF-8 (a sequence cut at the edges does not count)."""
    if skip_partial_start:
        # A tail read from the middle of a file may start inside a multi-byte character.
        start = 0
        while start < min(3, len(data)) and 0x80 <= data[start] < 0xC0:
            start += 1
        data = data[start:]
    binary = b"\0" in data
    try:
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(data, final=False)
    except UnicodeDecodeError:
        binary = True
        text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)
    return text.replace("\0", "\ufffd"), binary


def _cut_at_line_end(head: bytes) -> bytes:
    """End the head after a newline when one is near its end, so the marker starts a line."""
    newline = head.rfind(b"\n", len(head) // 2)
    return head[: newline + 1] if newline >= 0 else head


def _cut_at_line_start(tail: bytes) -> bytes:
    newline = tail.find(b"\n", 0, len(tail) // 2)
    return tail[newline + 1 :] if newline >= 0 else tail


def _count_lines(file, length: int) -> int:
    lines = 0
    while length > 0:
        chunk = file.read(min(1 << 20, length))
        if not chunk:
            break
        lines += chunk.count(b"\n")
        length -= len(chunk)
    return lines


def _size(size: int) -> str:
    if size < 1024:
        return f"{size:,} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:,.1f} KiB"
    return f"{size / (1024 * 1024):,.1f} MiB"


def _prune() -> None:
    """Make room for one more kept output: each may be hundreds of MiB on the sandbox's disk."""
    paths = [os.path.join(OUTPUT_DIR, name) for name in os.listdir(OUTPUT_DIR)]

    def mtime(path: str) -> float:
        try:
            return os.stat(path).st_mtime
        except FileNotFoundError:
            return 0.0

    for path in sorted(paths, key=mtime)[: max(0, len(paths) - (KEPT_OUTPUTS - 1))]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
