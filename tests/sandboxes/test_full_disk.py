"""A sandbox whose disk is full stays usable enough to recover, and says why, on both providers.

The toolbox's own files (call scripts, outputs, its log) live on the sandbox's disk, under its quota:
when the model fills it, the toolbox must still run calls and answer them, so that the model learns
the disk is full and can free it from inside.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from sandboxes.providers.base import Provider, SandboxError, ToolFailed
from tests.conftest import require

from .conftest import Sandbox

DISK_MB = 256
FILL = "dd if=/dev/zero of=/workspace/big bs=1M count=400"
FULL = f"the sandbox's disk is full: its quota is {DISK_MB} MB"
ADVICE = "free space, e.g. remove large files, then retry"


def says_full(text: str) -> bool:
    return FULL in text and ADVICE in text


@pytest.fixture(scope="module", params=["docker", "local"])
def provider(request: pytest.FixtureRequest) -> Provider:
    if request.param == "local":
        require(os.geteuid() == 0, "the local provider's disk quota needs root")
    return request.getfixturevalue(f"{request.param}_provider")


@pytest.fixture
def full(provider: Provider, new_sandbox: Callable[..., Sandbox]) -> tuple[Sandbox, str]:
    """A sandbox of `provider` with a small file in its workspace, then its disk filled: (sandbox, what
    the fill said)."""
    try:
        sandbox = new_sandbox(disk_mb=DISK_MB)
    except SandboxError as error:
        require(False, f"this provider cannot enforce a disk quota here: {error}")
    sandbox.call("write", file_path="notes.txt", content="a needle in the notes\n")
    return sandbox, sandbox.bash(FILL, timeout_s=120)


def test_the_command_that_fills_the_disk_says_the_disk_is_full_and_its_output_may_be_lost(
    full: tuple[Sandbox, str],
) -> None:
    _, said = full
    assert "[exit code 1]" in said
    assert says_full(said) and "what the command printed once it was full could not be kept" in said


def test_on_a_full_disk_ls_and_rm_answer_and_then_the_disk_works_again(full: tuple[Sandbox, str]) -> None:
    sandbox, _ = full
    listing = sandbox.bash("ls -la /workspace")
    assert " big\n" in listing and "notes.txt" in listing
    assert says_full(listing)  # still full: the model is told so with each call
    assert sandbox.bash("rm /workspace/big && echo removed") == "removed"  # and it is no longer full
    assert sandbox.bash("echo ok > /workspace/x && cat /workspace/x") == "ok"
    assert (
        sandbox.call("write", file_path="after.txt", content="fits")
        == "Created /workspace/after.txt (4 bytes)"
    )


def fill_again(sandbox: Sandbox) -> None:
    """Fill the room the toolbox gave back when the disk filled: its own files then have none at all."""
    said = sandbox.bash("head -c 64M /dev/zero > /workspace/more")
    assert "No space left on device" in said or "Disk quota exceeded" in said, said
    assert says_full(said)


def test_once_even_the_toolbox_s_reserve_is_used_up_ls_and_rm_still_answer(full: tuple[Sandbox, str]) -> None:
    sandbox, _ = full
    fill_again(sandbox)
    listing = sandbox.bash("ls /workspace; echo multi-line\necho '!quoted!'")
    assert listing.startswith("big\nmore\nnotes.txt\nmulti-line\n!quoted!\n[") and says_full(listing)
    assert sandbox.bash("rm /workspace/big /workspace/more && echo removed") == "removed"
    assert sandbox.bash("echo ok > /workspace/x && cat /workspace/x") == "ok"


def test_with_dev_shm_full_too_rm_still_runs_and_says_the_output_was_not_kept(
    full: tuple[Sandbox, str],
) -> None:
    sandbox, _ = full
    fill_again(sandbox)
    sandbox.bash("cat /dev/zero > /dev/shm/filler")
    said = sandbox.bash("rm /workspace/big && echo removed")
    assert said.startswith("[the output could not be kept: the sandbox's disk is full"), said
    assert "/dev/shm" in said
    assert sandbox.bash("ls /workspace") == "more\nnotes.txt"


def test_on_a_full_disk_truncate_frees_it(full: tuple[Sandbox, str]) -> None:
    sandbox, _ = full
    assert sandbox.bash("truncate -s 0 /workspace/big && echo truncated") == "truncated"
    assert sandbox.bash("echo ok > /workspace/x && cat /workspace/x && stat -c %s /workspace/big") == "ok\n0"


def test_a_write_on_a_full_disk_is_a_tool_error_that_says_the_disk_is_full(full: tuple[Sandbox, str]) -> None:
    sandbox, _ = full
    with pytest.raises(ToolFailed) as raised:  # more than the room the toolbox gave back as the disk filled
        sandbox.call("write", file_path="more.txt", content="x" * (16 * 1024 * 1024))
    assert says_full(str(raised.value)) and "/workspace/more.txt was not" in str(raised.value)
    with pytest.raises(ToolFailed) as raised:
        sandbox.call("edit", file_path="notes.txt", old_string="needle", new_string="pin" * (8 * 1024 * 1024))
    assert says_full(str(raised.value)) and "/workspace/notes.txt was not changed" in str(raised.value)
    assert sandbox.call("read", file_path="notes.txt") == "     1\ta needle in the notes"


def test_on_a_full_disk_the_read_only_tools_answer(full: tuple[Sandbox, str]) -> None:
    sandbox, _ = full
    fill_again(sandbox)
    assert sandbox.call("grep", pattern="needle") == "/workspace/notes.txt:1:a needle in the notes"
    listed = {"/workspace/big", "/workspace/more", "/workspace/notes.txt"}
    assert set(sandbox.call("glob", pattern="*").splitlines()) == listed
    assert "a needle" in sandbox.call("read", file_path="notes.txt")


@pytest.mark.parametrize("provider", ["docker"], indirect=True)
def test_a_toolbox_that_restarts_on_a_full_disk_answers(full: tuple[Sandbox, str]) -> None:
    """In docker a killed daemon is forked again at once: it must start on a full disk too (the local
    provider's daemon is the sandbox itself, so there it is not restarted)."""
    sandbox, _ = full
    with pytest.raises(ToolFailed, match="toolbox ended during the call"):
        sandbox.bash("kill -9 $PPID")
    said = sandbox.bash("rm /workspace/big && echo removed")
    assert said.startswith("removed\n[the sandbox's toolbox restarted since the last call"), said
