"""Workspaces on `/v1`: two workspaces, each with a full and a read-only key; every route, enumerated from
`/v1/openapi.json`, is tried with the other workspace's key on this one's objects (a 404 that reads exactly as
a missing object's), and with a read-only key for every write (a 403, and nothing changes). A route whose path
names a parameter this test does not know fails it, so a new route cannot arrive without a rule."""

from __future__ import annotations

import json
import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from harness.models import Agent
from kernel.keys import api_key_create
from kernel.models import ApiKey, AuditEntry, Workspace
from sandboxes.models import Environment, EnvironmentKey, Sandbox, WorkItem
from sandboxes.work import work_ensure
from sessions.models import Event, Session
from vault.models import Credential, Vault

pytestmark = pytest.mark.django_db

MCP = "https://mcp.example.com/mcp/"


class Caller:
    def __init__(self, client: Any, key: str):
        self.client, self.key = client, key

    def __call__(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        extra = {
            "HTTP_AUTHORIZATION": f"Bearer {self.key}",
            **{f"HTTP_{k.upper()}": v for k, v in headers.items()},
        }
        if method == "GET":
            return self.client.get(path, **extra)
        if method == "DELETE":
            return self.client.delete(path, **extra)
        return self.client.post(path, json.dumps(body or {}), content_type="application/json", **extra)


def _objects(call: Caller, workspace_id: str) -> dict[str, str]:
    """One of everything a path can name, made through the API with the workspace's full key."""
    agent = call("POST", "/v1/agents", {"name": "a", "model": "claude-sonnet-5-5"}).json()["id"]
    environment = call("POST", "/v1/environments", {"name": f"cloud-{workspace_id}"}).json()["id"]
    hosted = call("POST", "/v1/environments", {"name": "hosted", "config": {"type": "self_hosted"}}).json()[
        "id"
    ]
    session = call(
        "POST",
        "/v1/sessions",
        {"agent": agent, "environment_id": environment, "resources": [{"type": "file", "file_id": "file_1"}]},
    ).json()
    worked = call("POST", "/v1/sessions", {"agent": agent, "environment_id": hosted}).json()["id"]
    vault = call("POST", "/v1/vaults", {"display_name": "v"}).json()["id"]
    auth = {"type": "static_bearer", "mcp_server_url": MCP, "token": "canary"}
    credential = call("POST", f"/v1/vaults/{vault}/credentials", {"auth": auth}).json()["id"]
    key = call("POST", f"/v1/environments/{hosted}/keys", {"name": "k"}).json()["id"]
    sandbox = Sandbox.objects.create(
        environment_id=environment, session_id=session["id"], provider="docker", status="ready", handle="none"
    )
    return {
        "agent_id": agent,
        "environment_id": environment,
        "hosted_id": hosted,
        "session_id": session["id"],
        "resource_id": session["resources"][0]["id"],
        "vault_id": vault,
        "credential_id": credential,
        "key_id": key,
        "work_id": work_ensure(worked),
        "sandbox_id": sandbox.id,
        "api_key_id": str(api_key_create(name="spare", workspace_id=workspace_id)[0].pk),
    }


@pytest.fixture
def two(client: Any) -> dict[str, Any]:
    other = Workspace.objects.create(slug="other", name="Other")
    spaces: dict[str, Any] = {}
    for name, workspace_id in (("a", "wrkspc_default"), ("b", other.id)):
        full = Caller(client, api_key_create(name=f"{name}-full", workspace_id=workspace_id)[1])
        read = Caller(
            client, api_key_create(name=f"{name}-read", workspace_id=workspace_id, read_only=True)[1]
        )
        spaces[name] = {
            "id": workspace_id,
            "full": full,
            "read": read,
            "objects": _objects(full, workspace_id),
        }
    return spaces


def _routes(call: Caller) -> list[tuple[str, str]]:
    spec = call("GET", "/v1/openapi.json").json()
    return sorted((method.upper(), path) for path, item in spec["paths"].items() for method in item)


def _fill(path: str, objects: dict[str, str]) -> str:
    """The path with the workspace's objects in it; work and keys routes name the self-hosted environment."""

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name == "environment_id" and re.search(r"/(work|keys)\b", path):
            name = "hosted_id"
        assert name in objects, f"{path} names {{{match[1]}}}, which this test has no rule for: add one"
        return objects[name]

    return re.sub(r"\{(\w+)\}", value, path)


def _state() -> tuple[int, ...]:
    """What a refused request must not change."""
    models = (Agent, Environment, Session, Event, Sandbox, Vault, Credential, EnvironmentKey, WorkItem)
    counted = tuple(model.objects.count() for model in models)
    changed = tuple(
        model.objects.order_by("-updated_at").values_list("updated_at", flat=True).first() is not None
        and str(model.objects.order_by("-updated_at").values_list("updated_at", flat=True).first())
        or ""
        for model in (Agent, Environment, Session, Vault, Credential)
    )
    work = tuple(WorkItem.objects.order_by("id").values_list("state", flat=True))
    keys = (ApiKey.objects.count(), ApiKey.objects.filter(revoked_at__isnull=False).count())
    return (*counted, *keys, *map(hash, changed), *map(hash, work))


def test_another_workspaces_objects_are_404_as_if_missing_on_every_route(two):
    a, b = two["a"], two["b"]
    routes = _routes(b["full"])
    assert len(routes) > 40
    tried = 0
    for method, path in routes:
        if "{" not in path:
            continue
        before = _state()
        answer = b["full"](method, _fill(path, a["objects"]))
        assert answer.status_code == 404, (method, path, answer.content)
        assert answer.json()["error"]["type"] == "not_found_error"
        assert _state() == before, (method, path)
        # Exactly what a missing object of the first id in the path gets: nothing says it exists elsewhere.
        first = re.search(r"\{(\w+)\}", path)[1]  # type: ignore[index]
        real = _fill(path, a["objects"])
        named = a["objects"][
            "hosted_id" if first == "environment_id" and re.search(r"/(work|keys)\b", path) else first
        ]
        missing = b["full"](method, real.replace(named, named[:-4] + "zzzz"))
        assert answer.json()["error"]["message"] == missing.json()["error"]["message"].replace(
            named[:-4] + "zzzz", named
        ), (method, path)
        tried += 1
    assert tried > 30


def test_lists_show_only_the_callers_workspace_and_creates_land_in_it(two):
    a, b = two["a"], two["b"]
    for path, key in (
        ("/v1/agents", "agent_id"),
        ("/v1/environments", "environment_id"),
        ("/v1/sessions", "session_id"),
        ("/v1/vaults", "vault_id"),
        ("/v1/sandboxes", "sandbox_id"),
    ):
        ids = {row["id"] for row in b["full"]("GET", path).json()["data"]}
        assert a["objects"][key] not in ids and b["objects"][key] in ids, path
    assert Agent.objects.get(id=b["objects"]["agent_id"]).workspace_id == b["id"]
    assert Session.objects.get(id=b["objects"]["session_id"]).workspace_id == b["id"]
    assert Vault.objects.get(id=b["objects"]["vault_id"]).workspace_id == b["id"]
    # Names are unique within a workspace only.
    assert b["full"]("POST", "/v1/environments", {"name": "cloud-wrkspc_default"}).status_code == 200


def test_a_read_only_key_reads_and_is_refused_every_write_with_nothing_changed(two):
    a = two["a"]
    for method, path in _routes(a["read"]):
        filled = _fill(path, a["objects"])
        before = _state()
        answer = a["read"](method, filled)
        if method == "GET":  # (the worker's own routes refuse every API key, and say so)
            if answer.streaming:  # (not closed: closing it would end the test's connection)
                assert answer.status_code == 200, (method, path)
            else:
                assert "read-only" not in answer.content.decode(), (method, path, answer.content)
            continue
        assert answer.status_code == 403, (method, path, answer.content)
        assert answer.json()["error"]["type"] == "permission_error"
        assert "read-only" in answer.json()["error"]["message"]
        assert _state() == before, (method, path)


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda a, b: {"agent": a["agent_id"], "environment_id": b["environment_id"]}, "agent"),
        (lambda a, b: {"agent": b["agent_id"], "environment_id": a["environment_id"]}, "environment"),
        (
            lambda a, b: {
                "agent": b["agent_id"],
                "environment_id": b["environment_id"],
                "vault_ids": [a["vault_id"]],
            },
            "vault",
        ),
    ],
)
def test_a_session_cannot_be_made_of_another_workspaces_agent_environment_or_vault(two, build, says):
    a, b = two["a"], two["b"]
    before = Session.objects.count()
    answer = b["full"]("POST", "/v1/sessions", build(a["objects"], b["objects"]))
    assert answer.status_code == 404 and says in answer.json()["error"]["message"], answer.content
    assert Session.objects.count() == before


def test_hands_stay_home(two):
    a, b = two["a"], two["b"]
    mine = b["objects"]
    transfer = f"/v1/sessions/{mine['session_id']}/sandboxes/{mine['sandbox_id']}/transfer"
    answer = b["full"]("POST", transfer, {"to_session": a["objects"]["session_id"]})
    assert answer.status_code == 404 and a["objects"]["session_id"] in answer.json()["error"]["message"]
    free = Sandbox.objects.create(
        environment_id=a["objects"]["environment_id"], provider="docker", status="ready"
    )
    answer = b["full"]("POST", f"/v1/sessions/{mine['session_id']}/sandboxes", {"sandbox_id": free.id})
    assert answer.status_code == 404 and free.id in answer.json()["error"]["message"]
    assert Sandbox.objects.get(id=mine["sandbox_id"]).session_id == mine["session_id"]
    assert Sandbox.objects.get(id=free.id).session_id is None


def test_the_workspace_header_must_name_the_keys_own(two):
    b = two["b"]
    assert b["full"]("GET", "/v1/agents", **{"anthropic_workspace_id": b["id"]}).status_code == 200
    answer = b["full"]("GET", "/v1/agents", **{"anthropic_workspace_id": "wrkspc_default"})
    assert answer.status_code == 403 and b["id"] in answer.json()["error"]["message"]
    assert b["full"]("GET", "/v1/agents")["anthropic-workspace-id"] == b["id"]


def test_createapikey_makes_a_read_only_key_in_a_new_workspace(client):
    out = StringIO()
    call_command("createapikey", "--name", "dash", "--workspace", "team-x", "--read-only", stdout=out)
    raw = out.getvalue().strip().splitlines()[-1]
    space = Workspace.objects.get(slug="team-x")
    assert "read-only" in out.getvalue() and "team-x" in out.getvalue()
    call = Caller(client, raw)
    assert call("GET", "/v1/agents").json()["data"] == []
    assert call("POST", "/v1/agents", {"name": "x", "model": "claude-sonnet-5-5"}).status_code == 403
    assert AuditEntry.objects.filter(workspace=space, action="api_key.created").count() == 1
    with pytest.raises(Exception, match="slug"):
        call_command("createapikey", "--name", "x", "--workspace", "Bad Slug!", stdout=StringIO())


def test_the_admin_shows_the_audit_log_read_only(admin_client, two):
    listing = admin_client.get("/admin/workbench/auditentry/")
    assert listing.status_code == 200 and b"api_key.created" in listing.content
    entry = AuditEntry.objects.first()
    assert admin_client.get("/admin/workbench/auditentry/add/").status_code == 403
    assert (
        admin_client.post(f"/admin/workbench/auditentry/{entry.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_each_owners_lookup_answers_as_the_orm_does(two):
    """The edge's lookups are written out (kernel.tenancy.workspace_lookup): each finds the workspace the row
    holds, and None for an id no row has."""
    from kernel.tenancy import owner

    models = {"agent_id": Agent, "environment_id": Environment, "session_id": Session, "vault_id": Vault}
    for param, model in models.items():
        lookup = owner(param)
        assert lookup is not None, param
        for space in (two["a"], two["b"]):
            object_id = space["objects"][param]
            assert lookup.workspace_of(object_id) == space["id"], param
            assert model.objects.get(pk=object_id).workspace_id == space["id"]
        assert lookup.workspace_of(object_id[:-4] + "zzzz") is None, param
