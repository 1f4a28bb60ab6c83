"""github_repository resources at the API: checked by their documented shapes before anything is stored; the
token is write-only (sealed into the vault, never in Session.resources, never returned, forked or shown in the
admin); a stored resource git cannot use is a session.error on every path that provisions a sandbox, never a
500."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from harness import model
from harness.brain import run_brain
from harness.services.lifecycle import session_create, session_send_events
from sessions.models import Session
from sessions.selectors import get_events
from tests.conftest import make_agent, make_environment
from vault.models import RepositorySecret

pytestmark = pytest.mark.django_db
TOKEN = "ghs_never-shown-4c1f9a"
URL = "https://github.com/octo/repo.git"


def create(api: Any, *resources: dict[str, Any]) -> Any:
    return api.post(
        "/v1/sessions",
        {"agent": make_agent(), "environment_id": make_environment(), "resources": list(resources)},
    )


def repository(**fields: Any) -> dict[str, Any]:
    return {"type": "github_repository", "url": URL, **fields}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"url": "file:///etc"}, "resources[0].url"),
        ({"url": "/root"}, "resources[0].url"),
        ({"url": "ext::sh -c touch% /tmp/pwned"}, "resources[0].url"),
        ({"url": "fd::3"}, "resources[0].url"),
        ({"url": "git@github.com:octo/repo.git"}, "resources[0].url"),
        ({"url": "github.com:octo/repo.git"}, "resources[0].url"),
        ({"url": "ssh://git@github.com/octo/repo.git"}, "resources[0].url"),
        ({"url": "git://127.0.0.1/repo.git"}, "resources[0].url"),
        ({"url": "http://github.com/octo/repo.git"}, "resources[0].url"),
        ({"url": "http://127.0.0.1:9418/repo.git"}, "resources[0].url"),
        ({"url": "https://x-access-token:abc@github.com/octo/repo.git"}, "resources[0].url"),
        ({"url": "https:///octo/repo.git"}, "resources[0].url"),
        ({"url": "https://github.com:notaport/octo"}, "resources[0].url"),
        ({"url": "https://github.com/octo/repo.git\n--upload-pack=x"}, "resources[0].url"),
        ({"url": "-https://github.com/octo"}, "resources[0].url"),
        ({"url": 7}, "resources[0].url"),
        ({"checkout": {"type": "branch"}}, "resources[0].checkout.name"),
        ({"checkout": "main"}, "resources[0].checkout"),
        ({"checkout": {"type": "tag", "name": "v1"}}, "resources[0].checkout.type"),
        ({"checkout": {"type": "branch", "name": "-x"}}, "resources[0].checkout.name"),
        (
            {"checkout": {"type": "branch", "name": "--upload-pack=touch /tmp/x"}},
            "resources[0].checkout.name",
        ),
        ({"checkout": {"type": "branch", "name": "a..b"}}, "resources[0].checkout.name"),
        ({"checkout": {"type": "branch", "name": "a b"}}, "resources[0].checkout.name"),
        ({"checkout": {"type": "branch", "name": "x.lock"}}, "resources[0].checkout.name"),
        ({"checkout": {"type": "branch", "name": "main", "sha": "abcdef1"}}, "resources[0].checkout"),
        ({"checkout": {"type": "commit", "sha": "main"}}, "resources[0].checkout.sha"),
        ({"checkout": {"type": "commit", "sha": "abc"}}, "resources[0].checkout.sha"),
        ({"checkout": {"type": "commit"}}, "resources[0].checkout.sha"),
        ({"mount_path": "/etc/cron.d"}, "resources[0].mount_path"),
        ({"mount_path": "/workspace/../etc"}, "resources[0].mount_path"),
        ({"mount_path": "workspace/app"}, "resources[0].mount_path"),
        ({"mount_path": "/workspace/"}, "resources[0].mount_path"),
        ({"mount_path": "/workspace"}, "resources[0].mount_path"),
        ({"mount_path": "/workspacefoo/app"}, "resources[0].mount_path"),
        ({"authorization_token": "abc\nprotocol=file"}, "resources[0].authorization_token"),
        ({"authorization_token": "abc def"}, "resources[0].authorization_token"),
        ({"authorization_token": 5}, "resources[0].authorization_token"),
        ({"authorization_token": "x" * 4097}, "resources[0].authorization_token"),
    ],
)
def test_a_repository_git_must_not_be_handed_is_a_400_naming_the_field_and_stores_nothing(api, fields, named):
    response = create(api, repository(**fields))
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert named in error["error"]["message"], error["error"]["message"]
    assert not Session.objects.exists() and not RepositorySecret.objects.exists()


def test_the_field_named_is_that_of_the_bad_resource(api):
    response = create(api, repository(), {"type": "file", "file_id": "file_1"}, repository(url="/root"))
    assert response.status_code == 400 and "resources[2].url" in response.json()["error"]["message"]
    assert not Session.objects.exists()


def test_repositories_by_their_documented_shapes_are_stored_and_the_token_is_sealed_apart(api, vault_keyring):
    sha = "0123456789abcdef0123456789abcdef01234567"
    response = create(
        api,
        repository(checkout={"type": "branch", "name": "feature/x-1"}, authorization_token=TOKEN),
        repository(
            url="https://git.example.com:8443/a/b",
            checkout={"type": "commit", "sha": sha},
            mount_path="/workspace/deep/b",
        ),
        repository(checkout={"type": "commit", "sha": "abcdef1"}),
    )
    assert response.status_code == 200, response.content
    first, second, third = response.json()["resources"]
    assert (
        first["checkout"] == {"type": "branch", "name": "feature/x-1"}
        and first["mount_path"] == "/workspace/repo"
    )
    assert (
        second["checkout"] == {"type": "commit", "sha": sha} and second["mount_path"] == "/workspace/deep/b"
    )
    assert third["checkout"] == {"type": "commit", "sha": "abcdef1"}
    assert set(first) == {"type", "id", "url", "mount_path", "checkout", "created_at", "updated_at"}
    assert TOKEN not in str(response.content)
    stored = Session.objects.get().resources
    assert TOKEN not in str(stored) and all("authorization_token" not in r for r in stored)
    [secret] = RepositorySecret.objects.all()
    assert (secret.session_id, secret.resource_id, secret.url) == (response.json()["id"], first["id"], URL)
    assert TOKEN not in str(secret.sealed) and secret.unseal(vault_keyring) == {"token": TOKEN}


def test_plain_http_is_accepted_only_for_the_hosts_the_setting_allows(api):
    assert create(api, repository(url="http://127.0.0.1:8080/repo.git")).status_code == 400
    with override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]):
        assert create(api, repository(url="http://127.0.0.1:8080/repo.git")).status_code == 200
        assert create(api, repository(url="http://localhost:8080/repo.git")).status_code == 400


def test_a_fork_does_not_copy_the_token(api):
    origin = create(api, repository(authorization_token=TOKEN)).json()
    response = api.post(f"/v1/sessions/{origin['id']}/fork", {"at_seq": 0})
    assert response.status_code == 200, response.content
    fork = Session.objects.get(id=response.json()["id"])
    assert [r["url"] for r in fork.resources] == [URL]
    assert TOKEN not in str(fork.resources) and TOKEN not in str(response.content)
    assert not RepositorySecret.objects.filter(session_id=fork.id).exists()
    assert RepositorySecret.objects.filter(session_id=origin["id"]).count() == 1


def test_the_admin_never_shows_the_token(api, client):
    session_id = create(api, repository(authorization_token=TOKEN)).json()["id"]
    client.force_login(User.objects.create_superuser("root", password="x"))
    page = client.get(f"/admin/agent_sessions/session/{session_id}/change/")
    assert page.status_code == 200
    assert URL in page.content.decode() and TOKEN not in page.content.decode()
    listing = client.get("/admin/agent_sessions/session/")
    assert listing.status_code == 200 and TOKEN not in listing.content.decode()
    secret = RepositorySecret.objects.get(session_id=session_id)
    for path in (
        "/admin/vault/repositorysecret/",
        f"/admin/vault/repositorysecret/{secret.pk}/change/",
        "/admin/vault/credentialuse/",
    ):
        shown = client.get(path)
        assert shown.status_code == 200, path
        assert session_id in shown.content.decode() or path.endswith("/change/"), path
        assert TOKEN not in shown.content.decode(), path
        assert secret.sealed["token"]["ct"] not in shown.content.decode(), path


MALFORMED = [
    {
        "type": "github_repository",
        "id": "sres_a",
        "url": "https://127.0.0.1:9/a.git",
        "mount_path": "/workspace/a",
        "checkout": {"type": "branch"},
    },
    {
        "type": "github_repository",
        "id": "sres_b",
        "url": "https://127.0.0.1:9/b.git",
        "mount_path": "/workspace/b",
        "checkout": "main",
    },
    {"type": "github_repository", "id": "sres_c", "url": "file:///etc", "mount_path": "/workspace/c"},
]


def stored_malformed() -> str:
    """A session whose row holds resources an older API let through (written directly)."""
    session_id = session_create(
        **{
            "agent": make_agent(tools=[{"type": "agent_toolset_20260401"}]),
            "environment_id": make_environment(),
        }
    ).id
    Session.objects.filter(id=session_id).update(resources=MALFORMED)
    return session_id


def repository_errors(session_id: str) -> list[str]:
    return [e.payload["error"]["message"] for e in get_events(session_id) if e.type == "session.error"]


@pytest.mark.django_db(transaction=True)
def test_the_hands_endpoint_with_a_malformed_stored_resource_answers_and_logs_a_session_error(
    api, docker_engine
):
    with override_settings(SANDBOX_PROVIDER="docker"):
        session_id = stored_malformed()
        response = api.post(f"/v1/sessions/{session_id}/sandboxes", {"name": "main"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "ready"
    errors = repository_errors(session_id)
    assert len(errors) == 3
    assert "resources[0].checkout.name" in errors[0] and "resources[1].checkout" in errors[1]
    assert "resources[2].url" in errors[2]


@pytest.mark.django_db(transaction=True)
def test_a_wake_with_a_malformed_stored_resource_logs_a_session_error_and_goes_idle(
    offline_model, docker_engine
):
    with override_settings(
        ANTHROPIC_BASE_URL=offline_model.base_url, SANDBOX_PROVIDER="docker", SANDBOX_PROVISIONING="eager"
    ):
        model.client.cache_clear()
        try:
            session_id = stored_malformed()
            session_send_events(
                session_id,
                events=[
                    {
                        "type": "user.message",
                        "content": [{"type": "text", "text": "/bash ls /workspace | wc -l"}],
                    }
                ],
            )
            assert run_brain(session_id) == "idle"
        finally:
            model.client.cache_clear()
    assert len(repository_errors(session_id)) == 3
    [result] = [e for e in get_events(session_id) if e.type == "agent.tool_result"]
    assert result.payload["content"][0]["text"] == "0" and not result.payload["is_error"]
    assert Session.objects.get(id=session_id).status == "idle"
