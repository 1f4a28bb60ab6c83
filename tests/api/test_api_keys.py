"""/v1/api_keys: a workspace's API keys made, listed and revoked over the API, as the keys page does."""

from __future__ import annotations

import pytest

from kernel.keys import api_key_create
from kernel.models import ApiKey, AuditEntry, Workspace
from sandboxes.environments import environment_create
from sandboxes.work_keys import environment_key_create
from tests.api.test_tenancy import Caller

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(client):
    return Caller(client, api_key_create(name="admin")[1])


def test_a_key_made_over_the_api_works_is_listed_without_its_secret_and_stops_when_revoked(client, admin):
    made = admin("POST", "/v1/api_keys", {"name": "dashboard", "read_only": True})
    assert made.status_code == 200, made.content
    body = made.json()
    assert body["type"] == "api_key" and body["read_only"] and body["workspace_id"] == "wrkspc_default"
    assert body["key"].startswith(body["prefix"])
    reader = Caller(client, body["key"])
    assert reader("GET", "/v1/agents").status_code == 200
    assert reader("POST", "/v1/agents", {"name": "a", "model": "m"}).status_code == 403
    assert reader("POST", "/v1/api_keys", {"name": "escalate"}).status_code == 403

    listed = admin("GET", "/v1/api_keys").json()["data"]
    assert {k["name"] for k in listed} == {"admin", "dashboard"}
    assert all("key" not in k for k in listed)

    revoked = admin("POST", f"/v1/api_keys/{body['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert reader("GET", "/v1/agents").status_code == 401
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "actor"))
    assert ("api_key.created", "api key admin (" + ApiKey.objects.get(name="admin").prefix + "…)") in actions
    assert [a for a, _ in actions].count("api_key.revoked") == 1


def test_another_workspaces_key_answers_as_a_missing_one_and_nothing_changes(client, admin):
    other = Workspace.objects.create(slug="other", name="Other")
    theirs, _ = api_key_create(name="theirs", workspace_id=other.id)
    answer = admin("POST", f"/v1/api_keys/{theirs.pk}/revoke")
    assert (
        answer.status_code == 404
        and answer.json()["error"]["message"] == f"No API key with id '{theirs.pk}'."
    )
    assert (
        admin("POST", "/v1/api_keys/99999/revoke").json()["error"]["message"] == "No API key with id '99999'."
    )
    assert admin("POST", "/v1/api_keys/not-a-number/revoke").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert "theirs" not in {k["name"] for k in admin("GET", "/v1/api_keys").json()["data"]}


def test_bad_bodies_are_refused_in_the_envelope(admin):
    for body, says in (({}, "name"), ({"name": ""}, "name"), ({"name": "x", "scope": "all"}, "scope")):
        answer = admin("POST", "/v1/api_keys", body)
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
        assert says in answer.json()["error"]["message"], answer.content
    assert ApiKey.objects.count() == 1


def test_an_environment_key_cannot_make_api_keys(client):
    environment = environment_create(name="hosted", config={"type": "self_hosted"})
    _, raw = environment_key_create(environment.id, name="worker")
    answer = Caller(client, raw)("POST", "/v1/api_keys", {"name": "escalate"})
    assert answer.status_code == 403 and answer.json()["error"]["type"] == "permission_error"
    assert ApiKey.objects.count() == 0
