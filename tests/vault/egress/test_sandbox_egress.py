"""From inside a Docker sandbox, through the real egress proxy: secrets substituted only where allowed and
never handed back, hosts refused with the reason and audited, the host's services out of reach, and no
canary anywhere in the sandbox."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from sandboxes.hands import sandbox_provision, sandbox_transfer
from sandboxes.models import Sandbox
from sandboxes.pool import pool_refill
from sandboxes.provisioning import provider_of
from tests.conftest import VAULT_KEYRING, make_agent, make_environment, make_session
from tests.git_server import make_repository
from tests.vault.egress.conftest import GIT_TOKEN, STREAMED_OVER, Egress, healthz
from vault import crypto
from vault.egress.policy import placeholder
from vault.models import CredentialUse, RepositorySecret
from vault.services import credential_archive, credential_create, vault_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

CANARY = "canary-egress-3b8f1d2e9a61"
FETCH = r"""
import json, os, sys, urllib.error, urllib.request
# The tests' "outside" is the host's loopback, which only the proxy reaches: do not bypass it for 127.0.0.1.
os.environ.pop("NO_PROXY", None); os.environ.pop("no_proxy", None)
url, method = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 and sys.argv[3] else None
headers = dict(h.split(": ", 1) for h in sys.argv[4:])
request = urllib.request.Request(url, data=data, method=method, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=20) as answer:
        print("STATUS", answer.status)
        print("HEADERS", json.dumps(dict(answer.headers)))
        print("BODY", answer.read().decode())
except urllib.error.HTTPError as error:
    print("STATUS", error.code, error.reason)
    print("BODY", error.read().decode())
except Exception as error:
    print("ERROR", repr(error))
"""


def _bash(sandbox: Sandbox, command: str) -> str:
    return provider_of(sandbox).execute(sandbox.handle, "bash", {"command": command}, timeout_s=60)


def _fetch(sandbox: Sandbox, url: str, *, method: str = "GET", data: str = "", headers: tuple[str, ...] = ()):
    quoted = " ".join(f'"{h}"' for h in headers)
    return _bash(sandbox, f'python3 /tmp/fetch.py "{url}" {method} "{data}" {quoted}')


def _hand(config: dict[str, Any], *, vault_ids: list[str] | None = None) -> Sandbox:
    session_id = make_session(environment_id=make_environment(config=config), vault_ids=vault_ids or [])
    sandbox = sandbox_provision(session_id)
    _bash(sandbox, f"cat > /tmp/fetch.py <<'EOF'\n{FETCH}\nEOF")
    return sandbox


def _limited(*hosts: str) -> dict[str, Any]:
    return {"type": "cloud", "networking": {"type": "limited", "allowed_hosts": list(hosts)}}


def _env_credential(vault_id: str, *, hosts: list[str], body: bool = False, name: str = "ECHO_TOKEN") -> Any:
    return credential_create(
        vault_id,
        auth={
            "type": "environment_variable",
            "secret_name": name,
            "secret_value": CANARY,
            "networking": {"type": "limited", "allowed_hosts": hosts},
            "injection_location": {"header": True, "body": body},
        },
        actor="test",
    )


def _audited(timeout: float = 5.0, **match: Any) -> list[CredentialUse]:
    deadline = time.monotonic() + timeout
    while True:
        rows = list(CredentialUse.objects.filter(actor="egress proxy", **match))
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_an_allowed_https_call_gets_the_secret_and_the_sandbox_only_ever_sees_the_placeholder(egress: Egress):
    vault = vault_create(display_name="echo")
    credential = _env_credential(vault.id, hosts=["127.0.0.1"], body=True)
    sandbox = _hand(_limited("127.0.0.1"), vault_ids=[vault.id])
    mark = placeholder(credential.id)
    assert _bash(sandbox, "echo $ECHO_TOKEN").strip() == mark

    out = _fetch(sandbox, f"{egress.echo.url}/call", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert "STATUS 200" in out, out
    path, seen, _ = egress.echo.seen[-1]
    assert seen["Authorization"] == f"Bearer {CANARY}", "the host got the real secret"
    assert CANARY not in out, "the echoed secret came back to the sandbox"
    assert f"Bearer {mark}" in out  # in the echoed body and in the X-Echo-Authorization header
    assert (
        json.loads(out.split("HEADERS ", 1)[1].split("\n", 1)[0])["X-Echo-Authorization"] == f"Bearer {mark}"
    )

    out = _fetch(sandbox, f"{egress.echo.url}/post", method="POST", data="token=$ECHO_TOKEN")
    assert "STATUS 200" in out and CANARY not in out, out
    assert egress.echo.seen[-1][2] == f"token={CANARY}".encode(), "body injection is on for this credential"

    used = _audited(action="inject", credential_id=credential.id)
    assert used and all(row.host == "127.0.0.1" and row.sandbox_id == sandbox.id for row in used)
    assert all(CANARY not in row.detail for row in CredentialUse.objects.all())


def test_a_host_outside_the_allowlist_is_refused_with_the_reason_and_audited(egress: Egress):
    sandbox = _hand(_limited("127.0.0.1"))
    out = _fetch(sandbox, "https://blocked.example/x")
    assert "403" in out and "blocked.example is not allowed" in out, out
    out = _fetch(sandbox, "http://blocked.example/x")
    assert (
        "STATUS 403" in out
        and "host blocked.example is not allowed" in out
        and "allowed_hosts [127.0.0.1]" in out
    )
    refused = _audited(action="refuse", host="blocked.example")
    assert refused and not refused[0].allowed and refused[0].session_id == sandbox.session_id


@pytest.mark.parametrize("allow", [True, False])
def test_allow_mcp_servers_opens_the_hosts_of_the_agents_mcp_servers_only(egress: Egress, allow: bool):
    agent = make_agent(
        mcp_servers=[{"type": "url", "name": "echo", "url": f"{egress.echo.url}/mcp"}],
        tools=[{"type": "mcp_toolset", "mcp_server_name": "echo"}],
    )
    networking = {"type": "limited", "allowed_hosts": ["pypi.org"], "allow_mcp_servers": allow}
    session_id = make_session(
        agent=agent, environment_id=make_environment(config={"type": "cloud", "networking": networking})
    )
    sandbox = sandbox_provision(session_id)
    _bash(sandbox, f"cat > /tmp/fetch.py <<'EOF'\n{FETCH}\nEOF")
    out = _fetch(sandbox, f"{egress.echo.url}/mcp")
    if allow:
        assert "STATUS 200" in out, out
    else:
        assert "403 Forbidden: the host 127.0.0.1 is not allowed" in out, out
    out = _fetch(sandbox, f"{egress.other.url}/x")
    assert "403 Forbidden: the host 127.0.0.2 is not allowed" in out, f"other hosts stay closed: {out}"


def test_a_placeholder_sent_to_a_host_its_credential_does_not_allow_goes_unchanged_and_is_audited(
    egress: Egress,
):
    vault = vault_create(display_name="echo")
    credential = _env_credential(vault.id, hosts=["127.0.0.1"])
    sandbox = _hand(_limited("127.0.0.1", "127.0.0.2"), vault_ids=[vault.id])
    out = _fetch(sandbox, f"{egress.other.url}/steal", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert "STATUS 200" in out, out
    assert egress.other.seen[-1][1]["Authorization"] == f"Bearer {placeholder(credential.id)}"
    refused = _audited(action="refuse", credential_id=credential.id)
    assert refused and refused[0].host == "127.0.0.2" and "does not allow" in refused[0].detail


PROBE = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print("OPEN", target)
    except OSError as error:
        print("CLOSED", target, type(error).__name__)
"""


def test_the_hosts_services_are_out_of_reach_directly_and_through_the_proxy(egress: Egress):
    """The database on the host's loopback, and a service listening on every address of the host (which
    only the firewall on the sandboxes' bridge keeps from them); the proxy's port is the one way out."""
    pg_port = int(connection.settings_dict["PORT"])
    listener = socket.create_server(("0.0.0.0", 0))
    everywhere = listener.getsockname()[1]
    try:
        sandbox = _hand({"type": "cloud", "networking": {"type": "unrestricted"}})
        _bash(sandbox, f"cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF")
        gateway = egress.gateway
        targets = [
            f"127.0.0.1:{pg_port}",
            f"{gateway}:{pg_port}",
            f"{gateway}:{everywhere}",
            f"{gateway}:{egress.port}",
        ]
        out = _bash(sandbox, "python3 /tmp/probe.py " + " ".join(targets))
        for target in targets[:3]:
            assert f"CLOSED {target}" in out, out
        assert f"OPEN {gateway}:{egress.port}" in out, out
        for url in (
            f"http://127.0.0.1:{pg_port}/",
            f"https://127.0.0.1:{pg_port}/",
            f"http://{gateway}:{pg_port}/",
            f"https://{gateway}:{everywhere}/",
        ):
            out = _fetch(sandbox, url)
            assert "403" in out and "which sandboxes may not reach" in out, (url, out)
    finally:
        listener.close()


def test_no_canary_in_the_sandbox_environment_processes_or_files(egress: Egress, docker_engine: Any):
    vault = vault_create(display_name="echo")
    _env_credential(vault.id, hosts=["127.0.0.1"])
    sandbox = _hand(_limited("127.0.0.1"), vault_ids=[vault.id])
    _bash(sandbox, "(sleep 300 &) ; echo $ECHO_TOKEN > /workspace/placeholder")
    out = _fetch(sandbox, f"{egress.echo.url}/call", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert "STATUS 200" in out
    as_sandbox = _bash(
        sandbox,
        "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '",
    )
    assert "ECHO_TOKEN=wbph_" in as_sandbox and CANARY not in as_sandbox
    container = docker_engine.containers.get(sandbox.handle)
    # From the host, as root: every process of the container's, its environment and command line.
    pids = [int(row[1]) for row in container.top(ps_args="-e -o user,pid")["Processes"]]
    assert len(pids) >= 4  # the init, the supervisor, the daemon and its shell, the sleep
    seen = b""
    for pid in pids:
        for name in ("environ", "cmdline"):
            with contextlib.suppress(OSError):
                seen += Path(f"/proc/{pid}/{name}").read_bytes()
    assert b"wbph_" in seen and CANARY.encode() not in seen
    # Every file of the container's file system (its export, as a tar stream), searched across chunk edges.
    tail, size, marks = b"", 0, 0
    for chunk in container.export():
        window = tail + chunk
        assert CANARY.encode() not in window
        marks += window.count(b"wbph_vcrd_")
        tail, size = window[-len(CANARY) :], size + len(chunk)
    assert size > 10_000_000 and marks, "the export holds the image's files and the workspace's"
    assert CANARY not in egress.log.read_text(), "nor in the proxy's own log"


def test_a_request_without_a_valid_sandbox_identity_gets_a_407_that_says_why(egress: Egress):
    sandbox = _hand(_limited("127.0.0.1"))
    out = _bash(
        sandbox,
        f"export HTTPS_PROXY=http://{sandbox.id}:wrong@{egress.gateway}:{egress.port} https_proxy=$HTTPS_PROXY; "
        f"python3 /tmp/fetch.py {egress.echo.url}/ GET; "
        f"export HTTP_PROXY=http://{egress.gateway}:{egress.port} http_proxy=http://{egress.gateway}:{egress.port}; "
        "python3 /tmp/fetch.py http://blocked.example/ GET",
    )
    assert "407" in out and "serves sandboxes only" in out, out


def test_the_control_endpoint_answers_healthz_and_its_door(egress: Egress):
    assert healthz(egress)["status"] == "ok"
    assert healthz(egress)["workers_door"] == egress.door_url.removeprefix("http://")
    assert healthz(egress)["policy_notices"] == "listening"


def test_an_archived_credential_is_not_added_from_its_commit_on(egress: Egress):
    vault = vault_create(display_name="archived")
    credential = _env_credential(vault.id, hosts=["127.0.0.1"])
    sandbox = _hand(_limited("127.0.0.1"), vault_ids=[vault.id])
    _fetch(sandbox, f"{egress.echo.url}/before", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert egress.echo.seen[-1][1]["Authorization"] == f"Bearer {CANARY}"
    credential_archive(vault.id, credential.id, actor="test")
    # The proxy read this sandbox's policy a moment ago and keeps it for 600 s: only the notice makes it
    # read again.
    _fetch(sandbox, f"{egress.echo.url}/after", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert egress.echo.seen[-1][1]["Authorization"] == f"Bearer {placeholder(credential.id)}"


def test_git_clone_pull_and_push_through_the_proxy_land_with_the_token_never_in_the_sandbox(
    egress: Egress, docker_engine: Any
):
    """The repository's token is a RepositorySecret; the proxy adds it to git's smart HTTP requests."""
    head = make_repository(egress.git.root / "repo.git", {"README.md": "hello\n"})
    url = egress.git.url("repo.git")
    # Only the repository's host is allowed beyond pypi.org: a session's repositories are reachable.
    session_id = make_session(environment_id=make_environment(config=_limited("pypi.org")))
    secret = RepositorySecret(session_id=session_id, resource_id="res_1", url=url)
    secret.seal({"token": GIT_TOKEN})
    secret.save()
    sandbox = sandbox_provision(session_id)
    git = "env -u NO_PROXY -u no_proxy git -c user.name=agent -c user.email=agent@example.com"
    out = _bash(
        sandbox,
        f"cd /workspace && {git} clone -q {url} repo && cd repo && git log --format=%H -1 && "
        f"echo change > CHANGE.md && git add CHANGE.md && {git} commit -qm 'from the sandbox' && "
        f"{git} push -q origin main && {git} pull -q && git log --format=%s -1",
    )
    assert head in out and "from the sandbox" in out, out
    landed = subprocess.run(
        ["git", "-C", str(egress.git.root / "repo.git"), "log", "--format=%s", "-1", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert landed.strip() == "from the sandbox", "the push landed on the server"
    assert any(path.endswith("git-receive-pack") and ok for _, path, ok in egress.git.requests)
    assert _audited(action="inject", session_id=session_id, host="127.0.0.1")

    # The token is nowhere: not in the git config, the remote URL, the environment or a process.
    shown = _bash(sandbox, "cd /workspace/repo && git config --list --show-origin; git remote -v; env")
    assert GIT_TOKEN not in shown and "x-access-token" not in shown
    container = docker_engine.containers.get(sandbox.handle)
    tail = b""
    for chunk in container.export():
        window = tail + chunk
        assert GIT_TOKEN.encode() not in window
        tail = window[-len(GIT_TOKEN) :]
    for row in container.top(ps_args="-e -o pid")["Processes"]:
        for name in ("environ", "cmdline"):
            with contextlib.suppress(OSError):
                assert GIT_TOKEN.encode() not in Path(f"/proc/{row[0]}/{name}").read_bytes()


def test_git_without_the_proxys_token_is_refused_by_the_server(egress: Egress):
    """The control: a session without the repository's secret cannot clone it (the server wants the token)."""
    make_repository(egress.git.root / "private.git", {"a": "b\n"})
    sandbox = _hand({"type": "cloud", "networking": {"type": "unrestricted"}})
    out = _bash(
        sandbox,
        f"cd /workspace && GIT_TERMINAL_PROMPT=0 env -u NO_PROXY -u no_proxy git clone -q "
        f"{egress.git.url('private.git')} p 2>&1; echo exit=$?",
    )
    assert "exit=128" in out and (
        "401" in out or "Authentication failed" in out or "could not read" in out
    ), out


def test_a_hand_passed_to_another_session_gets_that_sessions_placeholders_and_secrets(egress: Egress):
    first, second = vault_create(display_name="first"), vault_create(display_name="second")
    mine = _env_credential(first.id, hosts=["127.0.0.1"])
    theirs = credential_create(
        second.id,
        auth={
            "type": "environment_variable",
            "secret_name": "ECHO_TOKEN",
            "secret_value": "second-canary-77a1",
            "networking": {"type": "limited", "allowed_hosts": ["127.0.0.1"]},
        },
        actor="test",
    )
    sandbox = _hand(_limited("127.0.0.1"), vault_ids=[first.id])
    assert _bash(sandbox, "echo $ECHO_TOKEN").strip() == placeholder(mine.id)
    environment = Sandbox.objects.get(id=sandbox.id).environment
    receiver = make_session(environment_id=environment.id, vault_ids=[second.id])
    # The proxy has read the first session's policy for this sandbox, and keeps it for the fixture's 600 s.
    _fetch(sandbox, f"{egress.echo.url}/before", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert egress.echo.seen[-1][1]["Authorization"] == f"Bearer {CANARY}"
    sandbox_transfer(sandbox.id, receiver)
    assert _bash(sandbox, "echo $ECHO_TOKEN").splitlines()[0] == placeholder(theirs.id)
    # At once: the database told the proxy at the transfer's commit.
    out = _fetch(sandbox, f"{egress.echo.url}/call", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert "STATUS 200" in out and "second-canary" not in out, out
    assert egress.echo.seen[-1][1]["Authorization"] == "Bearer second-canary-77a1"
    out = _fetch(
        sandbox, f"{egress.echo.url}/old", headers=(f"Authorization: Bearer {placeholder(mine.id)}",)
    )
    assert egress.echo.seen[-1][1]["Authorization"] == f"Bearer {placeholder(mine.id)}", (
        "no longer its session's"
    )
    # A toolbox daemon that dies is forked again: it starts with the new holder's variables too.
    with contextlib.suppress(Exception):
        _bash(sandbox, "kill -9 $PPID; sleep 5")
    out = _bash(sandbox, "echo $ECHO_TOKEN")
    assert "toolbox restarted" in out and out.splitlines()[0] == placeholder(theirs.id), out


def test_a_pooled_sandbox_taken_by_a_session_gets_its_placeholders(egress: Egress, redis_url: str):
    vault = vault_create(display_name="pool")
    credential = _env_credential(vault.id, hosts=["127.0.0.1"])
    environment_id = make_environment(config={**_limited("127.0.0.1"), "sandbox": {"warm_pool": 1}})
    assert pool_refill(environment_id) == 1
    sandbox = sandbox_provision(make_session(environment_id=environment_id, vault_ids=[vault.id]))
    assert sandbox.labels.get("from_pool")
    assert _bash(sandbox, "echo $ECHO_TOKEN").splitlines()[0] == placeholder(credential.id)


def test_a_request_whose_host_header_names_another_host_than_its_tunnel_is_refused(egress: Egress):
    sandbox = _hand(_limited("127.0.0.1", "127.0.0.2"))
    out = _fetch(sandbox, f"{egress.echo.url}/front", headers=(f"Host: 127.0.0.2:{egress.other.port}",))
    assert "STATUS 403" in out and "Host header names 127.0.0.2" in out, out
    assert not [path for path, _, _ in egress.echo.seen + egress.other.seen if path == "/front"]


def test_a_secret_sealed_to_a_key_added_while_the_proxy_runs_is_opened_after_a_keyring_reload(egress: Egress):
    """`vault_key rotate` rewrites the keyring file with a new current key: the proxy reads it again when it
    meets a secret sealed to a key it does not hold."""
    rotated = crypto.new_key(VAULT_KEYRING)
    crypto.write_atomically(egress.keyring_file, crypto.dump(rotated), 0o600)
    with override_settings(VAULT_PUBLIC_KEYS=crypto.dump(rotated.public())):
        vault = vault_create(display_name="rotated")
        credential = _env_credential(vault.id, hosts=["127.0.0.1"])
    assert credential.sealed["secret_value"]["kid"] == rotated.current != VAULT_KEYRING.current
    sandbox = _hand(_limited("127.0.0.1"), vault_ids=[vault.id])
    out = _fetch(sandbox, f"{egress.echo.url}/rotated", headers=("Authorization: Bearer $ECHO_TOKEN",))
    assert "STATUS 200" in out and egress.echo.seen[-1][1]["Authorization"] == f"Bearer {CANARY}", out


def test_a_long_answer_is_scrubbed_as_it_streams(egress: Egress):
    vault = vault_create(display_name="stream")
    _env_credential(vault.id, hosts=["127.0.0.1"], body=True)
    sandbox = _hand(_limited("127.0.0.1"), vault_ids=[vault.id])
    padding = "x" * (STREAMED_OVER * 3)
    out = _fetch(sandbox, f"{egress.echo.url}/long", method="POST", data=f"{padding}${{ECHO_TOKEN}}{padding}")
    assert "STATUS 200" in out and len(out) > STREAMED_OVER * 6, out[:300]  # longer than the buffer
    assert egress.echo.seen[-1][2].count(CANARY.encode()) == 1, "the host got the secret in the body"
    assert CANARY not in out and "wbph_vcrd_" in out


WEBSOCKET = r"""
import base64, os, socket, ssl, sys
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["HTTPS_PROXY"])
host, port = sys.argv[1], int(sys.argv[2])
raw = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
identity = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: Basic {identity}\r\n\r\n".encode())
answer = b""
while b"\r\n\r\n" not in answer:
    answer += raw.recv(4096)
assert answer.startswith(b"HTTP/1.1 200"), answer
tls = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
tls.sendall(
    f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    f"Authorization: Bearer {os.environ['ECHO_TOKEN']}\r\n\r\n".encode()
)
data = b""
while b"\r\n\r\n" not in data:
    data += tls.recv(4096)
head, _, data = data.partition(b"\r\n\r\n")
print("HANDSHAKE", head.split(b"\r\n")[0].decode())
while len(data) < 4:
    data += tls.recv(4096)
length, start = data[1] & 0x7F, 2
if length == 126:
    length, start = int.from_bytes(data[2:4], "big"), 4
while len(data) < start + length:
    data += tls.recv(4096)
print("MESSAGE", data[start : start + length].decode())
"""


def test_a_websocket_gets_the_secret_in_its_handshake_and_its_messages_back_scrubbed(egress: Egress):
    vault = vault_create(display_name="ws")
    _env_credential(vault.id, hosts=["127.0.0.1"])
    sandbox = _hand(_limited("127.0.0.1"), vault_ids=[vault.id])
    _bash(sandbox, f"cat > /tmp/ws.py <<'EOF'\n{WEBSOCKET}\nEOF")
    out = _bash(sandbox, f"python3 /tmp/ws.py 127.0.0.1 {egress.echo.port} 2>&1")
    assert "HANDSHAKE HTTP/1.1 101" in out, out
    path, headers, _ = egress.echo.seen[-1]
    assert path == "/ws" and headers["Authorization"] == f"Bearer {CANARY}", (
        "the handshake carried the secret"
    )
    message = out.split("MESSAGE ", 1)[1]
    assert CANARY not in message and "Bearer wbph_vcrd_" in message, message
