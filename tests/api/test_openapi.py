"""/v1/openapi.json describes every /v1 route, and the answers the routes give match what it declares."""

import re
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from harness.api import schemas as harness_schemas
from sandboxes import api as sandboxes_api
from tests.conftest import make_agent, make_environment
from vault import api as vault_api


def _v1_routes() -> set[str]:
    """Every /v1 route in the URL list, as an OpenAPI path (`/v1/agents/{agent_id}`)."""
    routes = set()

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("v1/") and "<path:" not in route:
                routes.add("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))

    walk(get_resolver().url_patterns, "")
    return routes - {"/v1/openapi.json", "/v1/"}  # the document itself, and ninja's root (a 404)


@pytest.fixture
def document(client: Any) -> dict[str, Any]:
    response = client.get("/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def test_every_v1_route_in_the_url_list_is_described(document):
    routes = _v1_routes()
    assert len(routes) >= 25
    assert routes <= set(document["paths"]), routes - set(document["paths"])


def test_every_operation_declares_its_answer_its_errors_and_its_body(document):
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "200" in responses and "400" in responses and "404" in responses, (method, path)
            assert responses["404"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorEnvelope")
            if method == "post" and not path.endswith(("/archive", "/detach", "/mcp_oauth_validate")):
                assert "requestBody" in operation, (method, path)
            assert operation.get("security"), (method, path)


def test_request_schemas_forbid_unknown_fields_and_name_the_required_ones(document):
    schemas = document["components"]["schemas"]
    assert schemas["AgentCreate"]["additionalProperties"] is False
    assert set(schemas["AgentCreate"]["required"]) == {"name", "model"}
    assert set(schemas["SessionCreate"]["required"]) == {"agent", "environment_id"}
    assert set(schemas["EventsSend"]["required"]) == {"events"}


@pytest.mark.django_db
def test_the_answers_match_the_declared_response_schemas(api):
    """The handlers render their own JSON; this holds what they render to what the document promises."""
    agent = api.post("/v1/agents", {"name": "a", "model": "m"}).json()
    harness_schemas.Agent.model_validate(agent)
    harness_schemas.AgentList.model_validate(api.get("/v1/agents").json())
    harness_schemas.AgentList.model_validate(api.get(f"/v1/agents/{agent['id']}/versions").json())
    environment = api.post("/v1/environments", {"name": "e-openapi"}).json()
    sandboxes_api.Environment.model_validate(environment)
    sandboxes_api.EnvironmentList.model_validate(api.get("/v1/environments").json())
    session = api.post("/v1/sessions", {"agent": make_agent(), "environment_id": make_environment()}).json()
    harness_schemas.Session.model_validate(session)
    harness_schemas.SessionList.model_validate(api.get("/v1/sessions").json())
    sent = api.post(
        f"/v1/sessions/{session['id']}/events",
        {"events": [{"type": "user.interrupt"}]},
    ).json()
    harness_schemas.EventList.model_validate(sent)
    harness_schemas.EventList.model_validate(api.get(f"/v1/sessions/{session['id']}/events").json())
    sandboxes_api.SandboxList.model_validate(api.get(f"/v1/sessions/{session['id']}/sandboxes").json())
    sandboxes_api.SandboxList.model_validate(api.get("/v1/sandboxes").json())
    harness_schemas.Session.model_validate(api.post(f"/v1/sessions/{session['id']}/archive").json())
    vault = api.post("/v1/vaults", {"display_name": "v"}).json()
    vault_api.Vault.model_validate(vault)
    vault_api.VaultList.model_validate(api.get("/v1/vaults").json())
    credential = api.post(
        f"/v1/vaults/{vault['id']}/credentials",
        {"auth": {"type": "static_bearer", "mcp_server_url": "https://mcp.example.com", "token": "t"}},
    ).json()
    vault_api.Credential.model_validate(credential)
    vault_api.CredentialList.model_validate(api.get(f"/v1/vaults/{vault['id']}/credentials").json())
