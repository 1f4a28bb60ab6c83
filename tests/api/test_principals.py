"""Narrower bearer credentials (kernel.auth.Principal): a registered resolver's principal reaches only the
requests it allows; anything else is a 403 in the envelope that says why, and an unknown token a 401."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kernel import auth
from kernel.models import DEFAULT_WORKSPACE_ID

pytestmark = pytest.mark.django_db


@dataclass
class Scoped:
    session_id: str
    workspace_id: str = DEFAULT_WORKSPACE_ID

    @property
    def actor(self) -> str:
        return f"scoped token for {self.session_id}"

    def allows(self, method: str, path: str) -> str | None:
        if method == "GET" and path == f"/v1/sessions/{self.session_id}":
            return None
        return f"this token may only read session {self.session_id}"


@pytest.fixture
def scoped(session_id: str) -> Iterator[str]:
    def resolve(raw: str) -> Scoped | None:
        return Scoped(session_id) if raw == "scoped-token" else None

    auth.add_bearer_resolver(resolve)
    yield session_id
    auth._resolvers.remove(resolve)


def test_a_principal_reaches_what_it_allows_and_gets_a_403_saying_why_elsewhere(client, scoped):
    headers = {"HTTP_AUTHORIZATION": "Bearer scoped-token"}
    assert client.get(f"/v1/sessions/{scoped}", **headers).status_code == 200
    refused = client.get("/v1/sessions", **headers)
    assert refused.status_code == 403
    assert refused.json()["error"] == {
        "type": "permission_error",
        "message": f"this token may only read session {scoped}",
    }
    assert client.get(f"/v1/sessions/{scoped}", HTTP_AUTHORIZATION="Bearer other").status_code == 401
