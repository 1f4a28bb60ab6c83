"""The worker's clone at provisioning, through the real egress proxy's workers' door: a private repository
(the git server wants the token) lands in a Docker sandbox while no worker process holds the token; a token
rotated through the resources route is the one the next clone carries; and without EGRESS_HARNESS_URL the
private clone fails with a message that says what adds tokens."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import override_settings

from sandboxes.hands import sandbox_provision
from sandboxes.models import Sandbox
from sandboxes.provisioning import provider_of
from sessions.selectors import get_events
from tests.conftest import make_agent, make_environment
from tests.git_server import make_repository
from tests.sandboxes.test_repositories import Processes
from tests.vault.egress.conftest import GIT_TOKEN, Egress
from vault.models import RepositorySecret

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

README = "hello from the worker's clone"


def _private(egress: Egress) -> str:
    """A new repository on the fixture's git server, which serves only requests carrying GIT_TOKEN."""
    name = f"worker-{uuid.uuid4().hex[:8]}.git"
    make_repository(egress.git.root / name, {"README.md": README + "\n"})
    return egress.git.url(name)


def _session(api: Any, url: str, token: str | None) -> dict[str, Any]:
    repository = {"type": "github_repository", "url": url, "mount_path": "/workspace/repo"}
    response = api.post(
        "/v1/sessions",
        {
            "agent": make_agent(),
            "environment_id": make_environment(),
            "resources": [{**repository, **({"authorization_token": token} if token else {})}],
        },
    )
    assert response.status_code == 200, response.content
    return response.json()


def _bash(sandbox: Sandbox, command: str) -> str:
    return provider_of(sandbox).execute(sandbox.handle, "bash", {"command": command}, timeout_s=60)


def _errors(session_id: str) -> list[dict[str, Any]]:
    return [e.payload["error"] for e in get_events(session_id) if e.type == "session.error"]


def _asked(egress: Egress, url: str) -> list[bool]:
    """Whether each request the git server got for the repository carried the token."""
    path = url.rsplit("/", 1)[1]
    return [authorized for _, seen, authorized in egress.git.requests if seen.startswith(f"/{path}/")]


def test_a_private_repository_is_cloned_through_the_door_and_no_worker_process_holds_the_token(
    egress: Egress, docker_engine: Any, api: Any
):
    url = _private(egress)
    with override_settings(SANDBOX_PROVIDER="docker", **egress.harness_settings()):
        session = _session(api, url, GIT_TOKEN)
        with Processes() as seen:
            sandbox = sandbox_provision(session["id"])
    assert _errors(session["id"]) == []
    assert _bash(sandbox, "cat /workspace/repo/README.md").strip() == README
    asked = _asked(egress, url)
    assert asked and all(asked), "every request of the clone reached the server with the token"
    assert any(b"https_proxy=http://session:" in environ for environ in seen.environs), "git ran via the door"
    assert not seen.holding(GIT_TOKEN), "the token was in a process's environment or command line"
    assert not [line for line in seen.cmdlines if egress.harness_token.encode() in line]
    shown = _bash(sandbox, "cd /workspace/repo && git config --list --show-origin; git remote -v; env")
    assert url in shown and GIT_TOKEN not in shown and "x-access-token" not in shown
    assert GIT_TOKEN not in _bash(sandbox, "grep -r -l ghp_ /workspace || true")


def test_a_token_rotated_through_the_route_is_the_one_the_next_clone_carries(
    egress: Egress, docker_engine: Any, api: Any
):
    url = _private(egress)
    wrong = f"ghp_wrong_{uuid.uuid4().hex}"
    with override_settings(SANDBOX_PROVIDER="docker", **egress.harness_settings()):
        session = _session(api, url, wrong)
        resource_id = session["resources"][0]["id"]
        first = sandbox_provision(session["id"])
        [refused] = _errors(session["id"])
        assert refused["type"] == "repository_authentication_error", refused
        assert f"/v1/sessions/{session['id']}/resources/{resource_id}" in refused["message"]
        assert wrong not in refused["message"] and egress.harness_token not in refused["message"]
        assert "No such file" in _bash(first, "cat /workspace/repo/README.md 2>&1")
        assert _asked(egress, url) and not any(_asked(egress, url))

        rotated = api.post(
            f"/v1/sessions/{session['id']}/resources/{resource_id}", {"authorization_token": GIT_TOKEN}
        )
        assert rotated.status_code == 200, rotated.content
        assert RepositorySecret.objects.get(session_id=session["id"]).secret_version == 2
        # The proxy read the session's policy (the old token) for the first clone, and keeps it for the
        # fixture's 600 s: the rotation's notice makes it read the new one.
        second = sandbox_provision(session["id"], name="second")
    assert len(_errors(session["id"])) == 1, _errors(session["id"])
    assert _bash(second, "cat /workspace/repo/README.md").strip() == README
    assert _asked(egress, url)[-1] is True


def test_without_the_door_a_private_clone_fails_saying_the_egress_proxy_adds_tokens(
    egress: Egress, docker_engine: Any, api: Any
):
    url = _private(egress)
    with override_settings(SANDBOX_PROVIDER="docker", EGRESS_HARNESS_URL=""):
        session = _session(api, url, GIT_TOKEN)
        sandbox = sandbox_provision(session["id"])
    [refused] = _errors(session["id"])
    assert refused["type"] == "repository_authentication_error"
    assert "egress proxy" in refused["message"] and "EGRESS_HARNESS_URL" in refused["message"]
    assert refused["repository_url"] == url and GIT_TOKEN not in str(refused)
    assert "No such file" in _bash(sandbox, "cat /workspace/repo/README.md 2>&1")
    assert _asked(egress, url) and not any(_asked(egress, url)), "the worker sent no token of its own"
