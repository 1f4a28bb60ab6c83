"""A self-hosted environment's sessions take no resource its worker cannot have (reference §13): repositories
and files (the platform provisions nothing there) and memory stores (none exist here) are a 400 naming the
resource, and no session is made."""

from __future__ import annotations

import pytest

from sessions.models import Session
from tests.conftest import make_agent, make_environment

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("resource", "says"),
    [
        ({"type": "github_repository", "url": "https://github.com/octo/repo"}, "no github_repository"),
        ({"type": "file", "file_id": "file_123"}, "no file resources"),
        ({"type": "memory_store", "memory_store_id": "memstore_1"}, "no memory stores yet"),
    ],
)
def test_a_self_hosted_session_refuses_what_its_worker_cannot_have(api, resource, says):
    environment = make_environment(config={"type": "self_hosted"})
    answer = api.post(
        "/v1/sessions", {"agent": make_agent(), "environment_id": environment, "resources": [resource]}
    )
    assert answer.status_code == 400, answer.content
    assert "resources[0]" in answer.json()["error"]["message"] and says in answer.json()["error"]["message"]
    assert not Session.objects.exists()


def test_a_file_added_later_to_a_self_hosted_session_is_refused_too(api):
    environment = make_environment(config={"type": "self_hosted"})
    session = api.post("/v1/sessions", {"agent": make_agent(), "environment_id": environment}).json()
    answer = api.post(f"/v1/sessions/{session['id']}/resources", {"type": "file", "file_id": "file_1"})
    assert answer.status_code == 400 and "no file resources" in answer.json()["error"]["message"]
    assert Session.objects.get(id=session["id"]).resources == []


def test_a_cloud_session_still_takes_them(api):
    answer = api.post(
        "/v1/sessions",
        {
            "agent": make_agent(),
            "environment_id": make_environment(),
            "resources": [{"type": "file", "file_id": "file_1"}],
        },
    )
    assert answer.status_code == 200, answer.content


def test_a_self_hosted_session_refuses_an_agent_with_skills_unless_overridden_away(api):
    """Its worker would download them from /v1/skills, which this installation does not serve."""
    environment = make_environment(config={"type": "self_hosted"})
    agent = make_agent(skills=[{"type": "custom", "skill_id": "skill_pdf"}])
    answer = api.post("/v1/sessions", {"agent": agent, "environment_id": environment})
    assert answer.status_code == 400, answer.content
    assert (
        "'skill_pdf'" in answer.json()["error"]["message"]
        and "no skills store" in answer.json()["error"]["message"]
    )
    assert not Session.objects.exists()
    without = {"type": "agent_with_overrides", "id": agent, "skills": []}
    assert api.post("/v1/sessions", {"agent": without, "environment_id": environment}).status_code == 200
    assert api.post("/v1/sessions", {"agent": agent, "environment_id": make_environment()}).status_code == 200
