"""Cloning a session's repositories on the worker: the token stays off every command line, and git reaches
nothing but the repository's own https:// (or allowed http://) host."""

from __future__ import annotations

import io
import secrets
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from sandboxes.repositories import checkout_repositories, repository_archive
from tests.git_server import GitServer, git_http_server, make_repository

TOKEN = "ghs_" + secrets.token_hex(16)


class CommandLines(threading.Thread):
    """Reads every process's /proc/<pid>/cmdline, over and over, until stopped: what any host user sees."""

    def __init__(self) -> None:
        super().__init__(name="cmdline-poller", daemon=True)
        self.seen: set[bytes] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for path in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    line = path.read_bytes()
                except OSError:  # the process ended between the listing and the read
                    continue
                if line:
                    self.seen.add(line)

    def __enter__(self) -> CommandLines:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


class Recorder:
    """Stands in for a provider: keeps what would be copied into the sandbox."""

    def __init__(self) -> None:
        self.archives: list[bytes] = []

    def copy_in(self, handle: str, archive: bytes) -> None:
        self.archives.append(archive)


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[tuple[GitServer, str]]:
    """A private repository (main, and a branch `feature`) served over http on 127.0.0.1, behind TOKEN;
    yields the server and main's commit."""
    head = make_repository(
        tmp_path / "served" / "repo.git",
        {"README.md": "hello from the repository\n"},
        branches={"feature": {"feature.txt": "on the branch\n"}},
    )
    with (
        git_http_server(tmp_path / "served", token=TOKEN, delay_s=0.1) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        yield server, head


def resource(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "github_repository",
        "id": "sres_test",
        "url": url,
        "mount_path": "/workspace/app",
        "checkout": None,
        **fields,
    }


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_token_is_on_no_command_line_while_a_clone_runs_and_the_clone_gets_the_private_repository(origin):
    server, _ = origin
    url = server.url("repo.git")
    with CommandLines() as lines:
        archive = repository_archive(resource(url, authorization_token=TOKEN))
    assert members(archive)["app/README.md"] == b"hello from the repository\n"
    assert any(f"127.0.0.1:{server.port}".encode() in line for line in lines.seen), "saw no git process"
    assert not [line for line in lines.seen if TOKEN.encode() in line]
    assert any(authorized for _, _, authorized in server.requests)
    assert TOKEN.encode() not in archive
    assert url.encode() in members(archive)["app/.git/config"]


def test_a_wrong_token_is_a_session_error_that_does_not_show_it(origin):
    server, _ = origin
    events: list[dict[str, Any]] = []
    provider = Recorder()
    wrong = "ghs_" + secrets.token_hex(16)
    checkout_repositories(
        provider, "h", [resource(server.url("repo.git"), authorization_token=wrong)], events.append
    )
    [event] = events
    assert event["type"] == "session.error"
    assert event["error"]["type"] == "repository_authentication_error"
    assert event["error"]["repository_url"] == server.url("repo.git")
    assert event["error"]["retry_status"] == {"type": "retrying"}
    assert wrong not in str(event) and provider.archives == []
    assert not any(authorized for _, _, authorized in server.requests)


def test_a_branch_and_a_commit_are_checked_out(origin):
    server, head = origin
    branch = members(
        repository_archive(
            resource(
                server.url("repo.git"),
                authorization_token=TOKEN,
                checkout={"type": "branch", "name": "feature"},
            )
        )
    )
    assert branch["app/feature.txt"] == b"on the branch\n"
    commit = repository_archive(
        resource(
            server.url("repo.git"), authorization_token=TOKEN, checkout={"type": "commit", "sha": head[:12]}
        )
    )
    assert "app/feature.txt" not in members(commit)
    assert members(commit)["app/.git/HEAD"] == f"{head}\n".encode()


def test_a_missing_branch_is_a_checkout_error(origin):
    server, _ = origin
    events: list[dict[str, Any]] = []
    checkout_repositories(
        Recorder(),
        "h",
        [
            resource(
                server.url("repo.git"),
                authorization_token=TOKEN,
                checkout={"type": "branch", "name": "nowhere"},
            )
        ],
        events.append,
    )
    assert [e["error"]["type"] for e in events] == ["repository_checkout_error"]


def test_a_stored_resource_git_must_not_be_handed_is_a_session_error_and_runs_no_git(tmp_path):
    """Rows written before the API checked resources: each is refused before git runs, and the next still
    gets its turn."""
    make_repository(tmp_path / "local.git", {"README.md": "local\n"})
    pwned = tmp_path / "pwned"
    stored = [
        resource(f"file://{tmp_path}/local.git"),
        resource(str(tmp_path / "local.git")),
        resource(f"ext::sh -c touch% {pwned}"),
        resource("https://127.0.0.1:9/r.git", checkout={"type": "branch"}),
        resource("https://127.0.0.1:9/r.git", checkout="main"),
        resource("https://127.0.0.1:9/r.git", checkout={"type": "branch", "name": "--upload-pack=touch"}),
        resource("https://127.0.0.1:9/r.git", mount_path="/etc/cron.d"),
        resource("http://127.0.0.1:9/r.git"),
        {"type": "github_repository", "id": "sres_old"},
    ]
    events: list[dict[str, Any]] = []
    provider = Recorder()
    checkout_repositories(provider, "h", stored, events.append)
    assert provider.archives == [] and not pwned.exists()
    assert [e["type"] for e in events] == ["session.error"] * len(stored)
    assert all(e["error"]["retry_status"] == {"type": "retrying"} for e in events)
    for i, field in enumerate(
        ["url", "url", "url", "checkout.name", "checkout", "checkout.name", "mount_path", "url", "url"]
    ):
        assert f"resources[{i}].{field}" in events[i]["error"]["message"], events[i]
    assert events[2]["error"]["repository_url"] == f"ext::sh -c touch% {pwned}"
