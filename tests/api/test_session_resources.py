"""/v1/sessions/{id}/resources (reference §3.6): list, retrieve, add (files), delete, and the rotation of a
github_repository's token, which is resealed in the vault and never answered; bad input is a 4xx in the
envelope that changes nothing; and the official SDK's `client.beta.sessions.resources` against the server."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from harness.api.schemas import SessionResource, SessionResourceList
from sessions.models import Session
from tests.conftest import make_agent, make_environment
from vault.models import CredentialUse, RepositorySecret

TOKEN = "ghs_canary_resources_3f8a1c"
ROTATED = "ghs_canary_rotated_77b2e4"
URL = "https://github.com/octo/repo.git"
PUBLIC = "https://github.com/octo/public.git"


def new_session(api: Any) -> dict[str, Any]:
    response = api.post(
        "/v1/sessions",
        {
            "agent": make_agent(),
            "environment_id": make_environment(),
            "resources": [
                {"type": "github_repository", "url": URL, "authorization_token": TOKEN},
                {"type": "file", "file_id": "file_1"},
                {"type": "memory_store", "memory_store_id": "memstore_1"},
                {"type": "github_repository", "url": PUBLIC},
            ],
        },
    )
    assert response.status_code == 200, response.content
    return response.json()


def error_of(response: Any, status: int, kind: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return str(body["error"]["message"])


def state(session_id: str) -> tuple[Any, ...]:
    """What a refused request must leave as it was: the resources and every secret's sealed value."""
    secrets = RepositorySecret.objects.filter(session_id=session_id).order_by("resource_id")
    return (
        Session.objects.get(id=session_id).resources,
        [(s.resource_id, s.url, s.sealed, s.secret_version) for s in secrets],
    )


@pytest.mark.django_db
def test_list_and_retrieve_show_every_resource_in_order_and_never_the_token(api):
    session = new_session(api)
    listed = api.get(f"/v1/sessions/{session['id']}/resources").json()
    assert listed["next_page"] is None
    assert [r["type"] for r in listed["data"]] == [
        "github_repository",
        "file",
        "memory_store",
        "github_repository",
    ]
    assert listed["data"] == session["resources"]
    repository = api.get(f"/v1/sessions/{session['id']}/resources/{listed['data'][0]['id']}").json()
    assert repository == listed["data"][0] and "authorization_token" not in repository
    memory = api.get(f"/v1/sessions/{session['id']}/resources/memstore_1").json()
    assert memory["type"] == "memory_store" and memory["memory_store_id"] == "memstore_1"
    assert TOKEN not in str(listed) + str(repository)
    SessionResourceList.model_validate(listed)
    SessionResource.model_validate(memory)


@pytest.mark.django_db
def test_list_pages_with_limit_and_a_cursor_of_its_own(api):
    session = new_session(api)
    seen, page = [], None
    while True:
        body = api.get(
            f"/v1/sessions/{session['id']}/resources", limit=3, **({"page": page} if page else {})
        ).json()
        seen += body["data"]
        page = body["next_page"]
        if not page:
            break
    assert seen == session["resources"]
    first = api.get(f"/v1/sessions/{session['id']}/resources", limit=1).json()
    other = new_session(api)
    message = error_of(
        api.get(f"/v1/sessions/{other['id']}/resources", page=first["next_page"]),
        400,
        "invalid_request_error",
    )
    assert "another session" in message
    assert "limit" in error_of(
        api.get(f"/v1/sessions/{session['id']}/resources", limit=1001), 400, "invalid_request_error"
    )


@pytest.mark.django_db
def test_update_rotates_the_token_in_the_vault_and_answers_the_resource_without_it(api, vault_keyring):
    session = new_session(api)
    repository = session["resources"][0]
    before = RepositorySecret.objects.get(session_id=session["id"], resource_id=repository["id"])
    response = api.post(
        f"/v1/sessions/{session['id']}/resources/{repository['id']}", {"authorization_token": ROTATED}
    )
    assert response.status_code == 200, response.content
    shown = response.json()
    assert {k: v for k, v in shown.items() if k != "updated_at"} == {
        k: v for k, v in repository.items() if k != "updated_at"
    }
    assert shown["updated_at"] > repository["updated_at"]
    assert ROTATED not in response.content.decode() and TOKEN not in response.content.decode()
    after = RepositorySecret.objects.get(pk=before.pk)
    assert after.secret_version == before.secret_version + 1
    assert after.unseal(vault_keyring) == {"token": ROTATED}
    assert ROTATED not in str(Session.objects.get(id=session["id"]).resources)
    assert CredentialUse.objects.filter(session_id=session["id"], action="update").count() == 1
    assert ROTATED not in str(CredentialUse.objects.values())


@pytest.mark.django_db
def test_update_gives_a_public_repository_its_first_token(api, vault_keyring):
    session = new_session(api)
    public = session["resources"][3]
    assert not RepositorySecret.objects.filter(resource_id=public["id"]).exists()
    response = api.post(
        f"/v1/sessions/{session['id']}/resources/{public['id']}", {"authorization_token": ROTATED}
    )
    assert response.status_code == 200, response.content
    secret = RepositorySecret.objects.get(session_id=session["id"], resource_id=public["id"])
    assert secret.url == PUBLIC and secret.unseal(vault_keyring) == {"token": ROTATED}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("target", "body", "status", "kind", "said"),
    [
        ("sres_nope", {"authorization_token": ROTATED}, 404, "not_found_error", "sres_nope"),
        ("file", {"authorization_token": ROTATED}, 400, "invalid_request_error", "Only github_repository"),
        (
            "memstore_1",
            {"authorization_token": ROTATED},
            400,
            "invalid_request_error",
            "Only github_repository",
        ),
        ("repository", {}, 400, "invalid_request_error", "'authorization_token' is required"),
        ("repository", {"authorization_token": ""}, 400, "invalid_request_error", "must not be empty"),
        ("repository", {"authorization_token": 7}, 400, "invalid_request_error", "must be a string"),
        ("repository", {"authorization_token": "a\nb"}, 400, "invalid_request_error", "control characters"),
        ("repository", {"authorization_token": "x" * 4097}, 400, "invalid_request_error", "at most 4096"),
        (
            "repository",
            {"authorization_token": ROTATED, "url": "https://evil.example/x.git"},
            400,
            "invalid_request_error",
            "'url' is an unknown field",
        ),
    ],
)
def test_a_refused_update_is_an_error_in_the_envelope_and_changes_nothing(
    api, target, body, status, kind, said
):
    session = new_session(api)
    ids = {"repository": session["resources"][0]["id"], "file": session["resources"][1]["id"]}
    before = state(session["id"])
    response = api.post(f"/v1/sessions/{session['id']}/resources/{ids.get(target, target)}", body)
    message = error_of(response, status, kind)
    assert said in message, message
    assert ROTATED not in message and TOKEN not in message
    assert state(session["id"]) == before


@pytest.mark.django_db
def test_delete_takes_the_resource_off_and_destroys_its_token(api):
    session = new_session(api)
    repository, file = session["resources"][0], session["resources"][1]
    path = f"/v1/sessions/{session['id']}/resources"
    assert api.delete(f"{path}/{repository['id']}").json() == {
        "id": repository["id"],
        "type": "session_resource_deleted",
    }
    assert not RepositorySecret.objects.filter(session_id=session["id"]).exists()
    assert api.delete(f"{path}/{file['id']}").status_code == 200
    assert api.delete(f"{path}/memstore_1").json()["type"] == "session_resource_deleted"
    assert [r["url"] for r in api.get(path).json()["data"]] == [PUBLIC]
    before = state(session["id"])
    assert repository["id"] in error_of(api.delete(f"{path}/{repository['id']}"), 404, "not_found_error")
    assert state(session["id"]) == before


@pytest.mark.django_db
def test_add_takes_a_file_and_nothing_else(api):
    session = new_session(api)
    path = f"/v1/sessions/{session['id']}/resources"
    added = api.post(path, {"type": "file", "file_id": "file_2"}).json()
    assert added["id"].startswith("sres_") and added["type"] == "file"
    assert added["mount_path"] == "/mnt/session/uploads/file_2"
    placed = api.post(path, {"type": "file", "file_id": "file_3", "mount_path": "/mnt/session/x"}).json()
    assert placed["mount_path"] == "/mnt/session/x"
    assert [r.get("id") for r in api.get(path).json()["data"]][-2:] == [added["id"], placed["id"]]
    before = state(session["id"])
    for body, said in [
        ({"type": "github_repository", "url": URL, "authorization_token": TOKEN}, "'type' must be"),
        ({"type": "file"}, "'file_id' is required"),
        ({"type": "file", "file_id": ""}, "must not be empty"),
        ({"file_id": "file_4"}, "'type' is required"),
    ]:
        message = error_of(api.post(path, body), 400, "invalid_request_error")
        assert said in message, (body, message)
        assert TOKEN not in message
    assert state(session["id"]) == before


@pytest.mark.django_db
def test_the_routes_of_a_missing_or_deleted_session_are_404s(api):
    session = new_session(api)
    assert api.delete(f"/v1/sessions/{session['id']}").status_code == 200
    resource = session["resources"][0]["id"]
    for response in (
        api.get(f"/v1/sessions/{session['id']}/resources"),
        api.get(f"/v1/sessions/{session['id']}/resources/{resource}"),
        api.post(f"/v1/sessions/{session['id']}/resources/{resource}", {"authorization_token": ROTATED}),
        api.delete(f"/v1/sessions/{session['id']}/resources/{resource}"),
        api.post(f"/v1/sessions/{session['id']}/resources", {"type": "file", "file_id": "f"}),
        api.get("/v1/sessions/sesn_nope/resources"),
    ):
        error_of(response, 404, "not_found_error")
    assert not RepositorySecret.objects.exists()


@pytest.mark.server
def test_the_sdk_lists_retrieves_rotates_adds_and_deletes_resources(live_server_url, api_key, vault_keyring):
    sdk = anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=30)
    agent = sdk.beta.agents.create(name="resources", model="claude-sonnet-5-5")
    environment = sdk.beta.environments.create(name="resources-sdk")
    session = sdk.beta.sessions.create(
        agent=agent.id,
        environment_id=environment.id,
        resources=[
            {"type": "github_repository", "url": URL, "authorization_token": TOKEN},
            {"type": "file", "file_id": "file_1"},
        ],
    )
    resources = sdk.beta.sessions.resources
    listed = list(resources.list(session.id))
    assert [r.type for r in listed] == ["github_repository", "file"]
    repository = listed[0]
    assert repository.url == URL and repository.mount_path == "/workspace/repo"
    assert resources.retrieve(repository.id, session_id=session.id).id == repository.id
    rotated = resources.update(repository.id, session_id=session.id, authorization_token=ROTATED)
    assert rotated.id == repository.id and rotated.type == "github_repository"
    secret = RepositorySecret.objects.get(session_id=session.id, resource_id=repository.id)
    assert secret.unseal(vault_keyring) == {"token": ROTATED} and secret.secret_version == 2
    with pytest.raises(anthropic.BadRequestError, match="Only github_repository"):
        resources.update(listed[1].id, session_id=session.id, authorization_token=ROTATED)
    with pytest.raises(anthropic.NotFoundError):
        resources.retrieve("sres_nope", session_id=session.id)
    added = resources.add(session.id, type="file", file_id="file_2")
    assert added.type == "file" and added.mount_path == "/mnt/session/uploads/file_2"
    deleted = resources.delete(repository.id, session_id=session.id)
    assert deleted.id == repository.id and deleted.type == "session_resource_deleted"
    assert [r.id for r in resources.list(session.id, limit=1)] == [listed[1].id, added.id]
    assert not RepositorySecret.objects.filter(session_id=session.id).exists()
    everything = str([r.model_dump() for r in listed]) + str(rotated.model_dump()) + str(added.model_dump())
    assert TOKEN not in everything and ROTATED not in everything
