"""Environment keys: issued by `manage.py environment_key` and /v1/environments/{id}/keys (an API key only),
shown once and stored hashed, for a self_hosted environment only, refused once revoked."""

from __future__ import annotations

from io import StringIO
from typing import Any

import anthropic
import pytest
from django.core.management import CommandError, call_command

from kernel.models import hash_key
from sandboxes.models import EnvironmentKey
from tests.conftest import make_environment

pytestmark = pytest.mark.django_db


@pytest.fixture
def env_id(db: Any) -> str:
    return make_environment(config={"type": "self_hosted"})


def command(*args: str) -> list[str]:
    out = StringIO()
    call_command("environment_key", *args, stdout=out)
    return out.getvalue().splitlines()


def poll(client: Any, env_id: str, key: str) -> Any:
    return client.get(f"/v1/environments/{env_id}/work/poll", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_the_command_creates_a_key_printed_last_and_stored_only_hashed(client, env_id):
    lines = command("create", env_id, "--name", "lab worker")
    raw = lines[-1]
    assert raw.startswith("wbek_") and len(raw) > 40
    key = EnvironmentKey.objects.get(environment_id=env_id)
    assert key.key_hash == hash_key(raw) and key.name == "lab worker" and key.prefix == raw[:12]
    assert raw not in " ".join(str(v) for v in EnvironmentKey.objects.values().first().values())
    assert poll(client, env_id, raw).status_code == 200
    listed = command("list", env_id)
    assert len(listed) == 1 and key.id in listed[0] and "active" in listed[0] and raw not in listed[0]


def test_the_command_revokes_a_key_and_it_is_refused_with_a_401_saying_so(client, env_id):
    raw = command("create", env_id)[-1]
    key = EnvironmentKey.objects.get(environment_id=env_id)
    assert "revoked" in command("revoke", key.id)[0]
    refused = poll(client, env_id, raw)
    assert refused.status_code == 401
    assert f"({key.prefix}…, {key.id}) was revoked" in refused.json()["error"]["message"]
    assert raw not in refused.content.decode()
    assert "revoked" in command("list")[0]


def test_the_command_says_what_is_wrong(db, env_id):
    with pytest.raises(CommandError, match="not self-hosted"):
        command("create", make_environment())
    with pytest.raises(CommandError, match="No environment with id 'env_nope'"):
        command("create", "env_nope")
    with pytest.raises(CommandError, match="No environment key with id 'envkey_nope'"):
        command("revoke", "envkey_nope")
    assert command("list") == ["No environment keys."]


def test_the_api_creates_lists_and_revokes_keys_with_an_api_key(api, client, env_id):
    created = api.post(f"/v1/environments/{env_id}/keys", {"name": "ci worker"})
    assert created.status_code == 200
    shown = created.json()
    raw = shown["key"]
    assert shown["type"] == "environment_key" and shown["name"] == "ci worker" and raw.startswith("wbek_")
    assert shown["prefix"] == raw[:12] and shown["revoked_at"] is None
    assert poll(client, env_id, raw).status_code == 200
    listed = api.get(f"/v1/environments/{env_id}/keys").json()
    assert [k["id"] for k in listed["data"]] == [shown["id"]] and listed["next_page"] is None
    assert "key" not in listed["data"][0] or listed["data"][0]["key"] is None
    assert listed["data"][0]["last_used_at"] is not None
    revoked = api.post(f"/v1/environments/{env_id}/keys/{shown['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert (
        api.post(f"/v1/environments/{env_id}/keys/{shown['id']}/revoke").json()["revoked_at"]
        == revoked.json()["revoked_at"]
    )
    assert poll(client, env_id, raw).status_code == 401


def test_the_api_refuses_keys_for_other_environments_and_bad_bodies(api, env_id):
    cloud = make_environment()
    refused = api.post(f"/v1/environments/{cloud}/keys", {})
    assert refused.status_code == 400
    assert "not self-hosted" in refused.json()["error"]["message"]
    assert api.post("/v1/environments/env_nope/keys", {}).status_code == 404
    assert api.post(f"/v1/environments/{env_id}/keys", {"label": "x"}).status_code == 400
    assert api.post(f"/v1/environments/{env_id}/keys", {"name": 3}).status_code == 400
    assert api.post(f"/v1/environments/{env_id}/keys/envkey_nope/revoke").status_code == 404
    other = make_environment(config={"type": "self_hosted"})
    other_key = api.post(f"/v1/environments/{other}/keys", {}).json()
    assert api.post(f"/v1/environments/{env_id}/keys/{other_key['id']}/revoke").status_code == 404
    api.post(f"/v1/environments/{env_id}/archive")
    archived = api.post(f"/v1/environments/{env_id}/keys", {})
    assert archived.status_code == 400 and "archived" in archived.json()["error"]["message"]


def test_an_environment_key_cannot_manage_keys_or_reach_another_environment(api, client, env_id):
    raw = api.post(f"/v1/environments/{env_id}/keys", {}).json()["key"]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    for response in (
        client.post(f"/v1/environments/{env_id}/keys", b"{}", content_type="application/json", **headers),
        client.get(f"/v1/environments/{env_id}/keys", **headers),
    ):
        assert response.status_code == 403
        assert "use an API key" in response.json()["error"]["message"]
    other = make_environment(config={"type": "self_hosted"})
    refused = poll(client, other, raw)
    assert refused.status_code == 403
    assert f"belongs to environment {env_id}, not {other}" in refused.json()["error"]["message"]


def test_the_openapi_document_calls_the_key_routes_a_workbench_extension(client):
    paths = client.get("/v1/openapi.json").json()["paths"]
    create = paths["/v1/environments/{environment_id}/keys"]["post"]
    assert "Workbench extension" in create["description"]
    assert "/v1/environments/{environment_id}/keys/{key_id}/revoke" in paths


@pytest.mark.server
@pytest.mark.django_db(transaction=True)
def test_the_sdk_is_refused_with_a_revoked_key(live_server_url, api, env_id):
    created = api.post(f"/v1/environments/{env_id}/keys", {}).json()
    worker = anthropic.Anthropic(base_url=live_server_url, api_key=created["key"], max_retries=0)
    assert worker.beta.environments.work.poll(env_id) is None
    api.post(f"/v1/environments/{env_id}/keys/{created['id']}/revoke")
    with pytest.raises(anthropic.AuthenticationError, match="was revoked"):
        worker.beta.environments.work.poll(env_id)
