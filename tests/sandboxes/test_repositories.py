"""Cloning a session's repositories on the worker: the worker never holds a repository token (the egress
proxy's door adds it; a fake door here, the real proxy in tests/vault/egress/test_worker_clone.py), the door's
identity lives in git's environment and never on a command line, and git reaches nothing but the repository's
own https:// (or allowed http://) host."""

from __future__ import annotations

import base64
import http.client
import io
import secrets
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import override_settings

from sandboxes.repositories import checkout_repositories, repository_archive
from tests.git_server import USERNAME, GitServer, git_http_server, make_repository

TOKEN = "ghs_" + secrets.token_hex(16)
HARNESS_TOKEN = "harness-" + secrets.token_hex(16)
SESSION = "sesn_clone_test"
# What the door takes (kernel/egress.py): user `session`, password `<session id>:<EGRESS_HARNESS_TOKEN>`.
IDENTITY = "Basic " + base64.b64encode(f"session:{SESSION}:{HARNESS_TOKEN}".encode()).decode()


def identity(session_id: str) -> str:
    return "Basic " + base64.b64encode(f"session:{session_id}:{HARNESS_TOKEN}".encode()).decode()


HOP_BY_HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "transfer-encoding"}


class Processes(threading.Thread):
    """Reads every process's /proc/<pid>/cmdline (what any host user sees) and environ (what the process's
    uid and root see), over and over, until stopped."""

    def __init__(self) -> None:
        super().__init__(name="proc-poller", daemon=True)
        self.cmdlines: set[bytes] = set()
        self.environs: set[bytes] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for folder in Path("/proc").glob("[0-9]*"):
                for name, seen in (("cmdline", self.cmdlines), ("environ", self.environs)):
                    try:
                        data = (folder / name).read_bytes()
                    except OSError:  # the process ended between the listing and the read
                        continue
                    if data:
                        seen.add(data)

    def __enter__(self) -> Processes:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()

    def holding(self, secret: str) -> list[bytes]:
        return [seen for seen in self.cmdlines | self.environs if secret.encode() in seen]


@dataclass
class FakeDoor:
    """Stands in for the egress proxy's workers' door: a plain-http forward proxy that takes only
    `session:<id>:<HARNESS_TOKEN>` (of its one session) and adds the repository token it holds as git's
    Basic auth."""

    token: str
    session: str = SESSION
    port: int = 0
    identities: list[str | None] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _door_handler(door: FakeDoor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def _forward(self) -> None:
            sent = self.headers.get("Proxy-Authorization")
            door.identities.append(sent)
            if sent != identity(door.session):
                self.send_response(407)
                self.send_header("Proxy-Authenticate", 'Basic realm="egress"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            target = urlsplit(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
            headers["Authorization"] = (
                "Basic " + base64.b64encode(f"{USERNAME}:{door.token}".encode()).decode()
            )
            upstream = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=30)
            upstream.request(
                self.command, target.path + (f"?{target.query}" if target.query else ""), body, headers
            )
            answer = upstream.getresponse()
            payload = answer.read()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in HOP_BY_HOP | {"content-length"}:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            upstream.close()

    return Handler


@contextmanager
def fake_door(token: str, *, session: str = SESSION) -> Iterator[FakeDoor]:
    door = FakeDoor(token=token, session=session)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _door_handler(door))
    door.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="fake-door", daemon=True)
    thread.start()
    try:
        yield door
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def through(door: FakeDoor, *, token: str = HARNESS_TOKEN) -> Any:
    return override_settings(
        EGRESS_HARNESS_URL=door.url, EGRESS_HARNESS_TOKEN=token, EGRESS_CA_FILE="/etc/workbench-test/ca.pem"
    )


class Recorder:
    """Stands in for a provider: keeps what would be copied into the sandbox."""

    def __init__(self) -> None:
        self.archives: list[bytes] = []

    def copy_in(self, handle: str, archive: bytes) -> None:
        self.archives.append(archive)


def _repository(root: Path) -> str:
    return make_repository(
        root / "repo.git",
        {"README.md": "hello from the repository\n"},
        branches={"feature": {"feature.txt": "on the branch\n"}},
    )


@pytest.fixture
def private(tmp_path: Path) -> Iterator[GitServer]:
    """A private repository (main, and a branch `feature`) served over http on 127.0.0.1, behind TOKEN."""
    _repository(tmp_path / "private")
    with (
        git_http_server(tmp_path / "private", token=TOKEN, delay_s=0.1) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], EGRESS_HARNESS_URL=""),
    ):
        yield server


@pytest.fixture
def public(tmp_path: Path) -> Iterator[tuple[GitServer, str]]:
    """The same repository, public; yields the server and main's commit."""
    head = _repository(tmp_path / "public")
    with (
        git_http_server(tmp_path / "public") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], EGRESS_HARNESS_URL=""),
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


def clone_errors(resources: list[dict[str, Any]], provider: Recorder | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    checkout_repositories(provider or Recorder(), "h", resources, events.append, session_id=SESSION)
    return events


def test_through_the_door_a_private_repository_clones_with_no_token_on_the_worker(private):
    """git speaks to the door as the session (its identity in git's environment, never a command line); the
    door adds the token; no worker process holds the token, in its environ or its command line."""
    url = private.url("repo.git")
    with fake_door(TOKEN) as door, through(door), Processes() as seen:
        archive = repository_archive(resource(url), session_id=SESSION)
    assert members(archive)["app/README.md"] == b"hello from the repository\n"
    assert door.identities and set(door.identities) == {IDENTITY}
    assert any(authorized for _, _, authorized in private.requests)
    assert any(f"127.0.0.1:{private.port}".encode() in line for line in seen.cmdlines), "saw no git process"
    assert any(b"https_proxy=http://session:" in env for env in seen.environs), "saw no git environment"
    assert any(b"GIT_SSL_CAINFO=/etc/workbench-test/ca.pem" in env for env in seen.environs)
    assert not seen.holding(TOKEN)
    assert not [line for line in seen.cmdlines if HARNESS_TOKEN.encode() in line]
    assert TOKEN.encode() not in archive and HARNESS_TOKEN.encode() not in archive
    config = members(archive)["app/.git/config"]
    assert url.encode() in config and b"proxy" not in config


def test_without_the_door_a_public_repository_clones_directly(public):
    server, _ = public
    with Processes() as seen:
        archive = repository_archive(resource(server.url("repo.git")), session_id=SESSION)
    assert members(archive)["app/README.md"] == b"hello from the repository\n"
    assert not any(b"https_proxy=" in env and b"session:" in env for env in seen.environs)


def test_without_the_door_a_private_repository_is_an_authentication_error_naming_EGRESS_HARNESS_URL(private):
    provider = Recorder()
    [event] = clone_errors([resource(private.url("repo.git"))], provider)
    assert event["type"] == "session.error"
    assert event["error"]["type"] == "repository_authentication_error"
    assert "egress proxy" in event["error"]["message"] and "EGRESS_HARNESS_URL" in event["error"]["message"]
    assert event["error"]["repository_url"] == private.url("repo.git")
    assert event["error"]["retry_status"] == {"type": "retrying"}
    assert provider.archives == [] and not any(authorized for _, _, authorized in private.requests)


def test_a_wrong_token_at_the_door_is_an_authentication_error_that_shows_no_secret(private):
    wrong = "ghs_" + secrets.token_hex(16)
    with fake_door(wrong) as door, through(door):
        [event] = clone_errors([resource(private.url("repo.git"))])
    assert event["error"]["type"] == "repository_authentication_error"
    assert f"/v1/sessions/{SESSION}/resources/sres_test" in event["error"]["message"]
    assert wrong not in str(event) and HARNESS_TOKEN not in str(event)
    assert not any(authorized for _, _, authorized in private.requests)


def test_a_door_that_refuses_the_workers_identity_is_a_clone_error_that_shows_no_secret(private):
    with fake_door(TOKEN) as door, through(door, token="not-the-" + HARNESS_TOKEN):
        [event] = clone_errors([resource(private.url("repo.git"))])
    assert event["error"]["type"] == "repository_clone_error"
    assert "EGRESS_HARNESS_TOKEN" in event["error"]["message"] and "407" in event["error"]["message"], event
    assert HARNESS_TOKEN not in str(event) and private.requests == []


def test_a_branch_and_a_commit_are_checked_out(public):
    server, head = public
    branch = members(
        repository_archive(
            resource(server.url("repo.git"), checkout={"type": "branch", "name": "feature"}),
            session_id=SESSION,
        )
    )
    assert branch["app/feature.txt"] == b"on the branch\n"
    commit = repository_archive(
        resource(server.url("repo.git"), checkout={"type": "commit", "sha": head[:12]}), session_id=SESSION
    )
    assert "app/feature.txt" not in members(commit)
    assert members(commit)["app/.git/HEAD"] == f"{head}\n".encode()


def test_a_missing_branch_is_a_checkout_error(public):
    server, _ = public
    events = clone_errors([resource(server.url("repo.git"), checkout={"type": "branch", "name": "nowhere"})])
    assert [e["error"]["type"] for e in events] == ["repository_checkout_error"]


def test_a_token_left_in_a_stored_resource_is_never_handed_to_git(public):
    """A row from before tokens moved to the vault (the migration removes them): the clone ignores it."""
    server, _ = public
    with Processes() as seen:
        repository_archive(resource(server.url("repo.git"), authorization_token=TOKEN), session_id=SESSION)
    assert not seen.holding(TOKEN)


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
    provider = Recorder()
    events = clone_errors(stored, provider)
    assert provider.archives == [] and not pwned.exists()
    assert [e["type"] for e in events] == ["session.error"] * len(stored)
    assert all(e["error"]["retry_status"] == {"type": "retrying"} for e in events)
    for i, name in enumerate(
        ["url", "url", "url", "checkout.name", "checkout", "checkout.name", "mount_path", "url", "url"]
    ):
        assert f"resources[{i}].{name}" in events[i]["error"]["message"], events[i]
    assert events[2]["error"]["repository_url"] == f"ext::sh -c touch% {pwned}"
