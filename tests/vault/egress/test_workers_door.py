"""The egress proxy's workers' door, as a real process: a real brain calls a local MCP server (the `mcp` SDK)
that requires a bearer token, through the door, with the credential of the session's vault; the door
refreshes an expired or revoked `mcp_oauth` token at a local token endpoint, and validates credentials for
`mcp_oauth_validate`. The harness (this process) never holds a token: what it sends and what it gets back
are checked for one.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import anthropic
import pytest
from anthropic.types.beta.vaults.beta_managed_agents_credential_validation import (
    BetaManagedAgentsCredentialValidation,
)
from django.test import override_settings
from mcp.server.mcpserver import Context
from mcp.server.transport_security import TransportSecuritySettings

from harness import mcp, model
from harness.brain import run_brain
from sessions.selectors import get_events
from tests.conftest import ROOT, child_env, make_agent, make_environment
from tests.harness.test_mcp import of, say, serving, texts, tool_server
from tests.vault.egress.conftest import DOOR_HOST, Egress
from vault.egress.door import Door
from vault.models import Credential, CredentialUse
from vault.services import credential_create, credential_delete, vault_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

TOKEN = "canary-mcp-bearer-5c1e7a"
OLD_TOKEN = "canary-mcp-old-access-91d3"
NEW_TOKEN = "canary-mcp-new-access-2b7f"
REFRESH_TOKEN = "canary-mcp-refresh-77aa"
ROTATED_REFRESH = "canary-mcp-refresh-rotated-4e"
CLIENT_SECRET = "canary-mcp-client-secret-0c"
SECRETS = (TOKEN, OLD_TOKEN, NEW_TOKEN, REFRESH_TOKEN, ROTATED_REFRESH, CLIENT_SECRET)


def guarded(app: Any, accepted: set[str], seen: list[str]) -> Any:
    """`app` behind bearer tokens (`accepted` may change while it serves); `seen` gets each Authorization."""

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization", b"").decode()
            seen.append(header)
            if header.removeprefix("Bearer ") not in accepted:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"www-authenticate", b'Bearer realm="mcp"'), (b"content-length", b"0")],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return serve


def whoami_server() -> Any:
    """The tools, and one that answers with the request's own Authorization header (an echoing server)."""
    server = tool_server()

    @server.tool()
    def whoami(ctx: Context) -> str:
        """The Authorization header this request came with."""
        request = ctx.request_context.request
        return "authorization=" + (request.headers.get("authorization", "") if request is not None else "")

    return server


def token_endpoint(grants: list[dict[str, Any]], *, fail: bool = False) -> Any:
    """An OAuth token endpoint: the refresh grant for REFRESH_TOKEN with client_secret_basic gives NEW_TOKEN
    (and rotates the refresh token); `grants` gets each request's form and Authorization."""

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        basic = dict(scope["headers"]).get(b"authorization", b"").decode()
        grants.append({"form": form, "authorization": basic})
        expected = "Basic " + base64.b64encode(f"workbench-client:{CLIENT_SECRET}".encode()).decode()
        ok = not fail and form.get("refresh_token") == REFRESH_TOKEN and basic == expected
        answer = (
            {
                "access_token": NEW_TOKEN,
                "token_type": "Bearer",
                "expires_in": 3600,
                "refresh_token": ROTATED_REFRESH,
            }
            if ok
            else {
                "error": "invalid_grant",
                "error_description": f"refresh token {form.get('refresh_token')} refused",
            }
        )
        payload = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200 if ok else 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return serve


@pytest.fixture(autouse=True)
def through_the_door(egress: Egress, offline_model: Any) -> Iterator[None]:
    """This process's brains talk to the offline model, and to MCP servers through the door."""
    mcp.listings.clear()
    with override_settings(
        **egress.harness_settings(),
        MCP_TIMEOUT_SECONDS=20.0,
        EGRESS_PLAIN_HOSTS=[DOOR_HOST],
        ANTHROPIC_BASE_URL=offline_model.base_url,
        MODEL_RETRY_BASE_SECONDS=0.01,
    ):
        model.client.cache_clear()
        yield
    model.client.cache_clear()
    mcp.listings.clear()


@contextmanager
def mcp_server(accepted: set[str]) -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    # The MCP SDK guards a local server against DNS rebinding by its Host header: let DOOR_HOST in.
    security = TransportSecuritySettings(
        allowed_hosts=[f"{DOOR_HOST}:*"], allowed_origins=[f"http://{DOOR_HOST}:*"]
    )
    app = whoami_server().streamable_http_app(host=DOOR_HOST, transport_security=security)
    with serving(guarded(app, accepted, seen), host=DOOR_HOST) as base:
        yield f"{base}/mcp", seen


def session_with(url: str, vault_ids: list[str]) -> str:
    from harness.services.lifecycle import session_create

    agent = make_agent(
        mcp_servers=[{"type": "url", "name": "tools", "url": url}],
        tools=[
            {
                "type": "mcp_toolset",
                "mcp_server_name": "tools",
                "default_config": {"permission_policy": {"type": "always_allow"}},
            }
        ],
    )
    return session_create(agent=agent, environment_id=make_environment(), vault_ids=vault_ids).id


def call(session_id: str, tool: str, arguments: dict[str, Any]) -> None:
    say(session_id, f"/tool mcp__tools__{tool} {json.dumps(arguments)}")
    run_brain(session_id)


def oauth_credential(vault_id: str, url: str, *, expires_in: timedelta | None) -> dict[str, Any]:
    auth: dict[str, Any] = {
        "type": "mcp_oauth",
        "mcp_server_url": url,
        "access_token": OLD_TOKEN,
        "refresh": {
            "client_id": "workbench-client",
            "refresh_token": REFRESH_TOKEN,
            "token_endpoint": "",
            "token_endpoint_auth": {"type": "client_secret_basic", "client_secret": CLIENT_SECRET},
            "scope": "tools",
        },
    }
    if expires_in is not None:
        auth["expires_at"] = (datetime.now(UTC) + expires_in).isoformat()
    return auth


def no_secret_in_the_log(session_id: str) -> None:
    log = json.dumps([e.as_api() for e in get_events(session_id)])
    for secret in SECRETS:
        assert secret not in log, f"a token reached the session's log: {secret}"


def audited(timeout: float = 5.0, **match: Any) -> list[CredentialUse]:
    deadline = time.monotonic() + timeout
    while True:
        rows = list(CredentialUse.objects.filter(actor="egress proxy", **match))
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_an_agent_calls_a_bearer_protected_mcp_tool_with_its_vaults_credential_it_never_holds(egress: Egress):
    with mcp_server({TOKEN}) as (url, seen):
        vault = vault_create(display_name="mcp")
        credential = credential_create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": url, "token": TOKEN}, actor="test"
        )
        session_id = session_with(url, [vault.id])
        call(session_id, "echo", {"text": "through the door"})
        [result] = of(session_id, "agent.mcp_tool_result")
        assert texts(result) == "echo: through the door", texts(result)
        assert f"Bearer {TOKEN}" in seen, "the server got the vault's token"

        # A server that echoes the request's token back hands the harness the proxy's redaction, not it.
        call(session_id, "whoami", {})
        whoami = of(session_id, "agent.mcp_tool_result")[-1]
        assert texts(whoami) == "authorization=Bearer [redacted by the egress proxy]", texts(whoami)
    no_secret_in_the_log(session_id)
    rows = audited(action="inject", credential_id=credential.id, session_id=session_id)
    assert rows and all(row.allowed and row.host == DOOR_HOST for row in rows)
    deadline = time.monotonic() + 5
    while Credential.objects.get(id=credential.id).last_used_at is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert Credential.objects.get(id=credential.id).last_used_at is not None, "where it was last used is kept"


def test_with_the_credential_removed_the_session_gets_mcp_authentication_failed_error(egress: Egress):
    with mcp_server({TOKEN}) as (url, _):
        vault = vault_create(display_name="mcp")
        credential = credential_create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": url, "token": TOKEN}, actor="test"
        )
        session_id = session_with(url, [vault.id])
        call(session_id, "add", {"a": 2, "b": 3})
        assert texts(of(session_id, "agent.mcp_tool_result")[-1]) == "5"
        credential_delete(vault.id, credential.id, actor="test")
        mcp.listings.clear()
        call(session_id, "add", {"a": 1, "b": 1})
    # The listing fails, and so does the call the model makes anyway: each says why.
    errors = [e.payload["error"] for e in of(session_id, "session.error")]
    assert errors and {e["type"] for e in errors} == {"mcp_authentication_failed_error"}, errors
    assert all("401" in e["message"] for e in errors)
    no_secret_in_the_log(session_id)


def test_an_expired_oauth_token_is_refreshed_once_resealed_and_the_call_succeeds(egress: Egress):
    grants: list[dict[str, Any]] = []
    with mcp_server({NEW_TOKEN}) as (url, seen), serving(token_endpoint(grants), host=DOOR_HOST) as tokens:
        vault = vault_create(display_name="oauth")
        auth = oauth_credential(vault.id, url, expires_in=timedelta(seconds=20))  # inside the refresh margin
        auth["refresh"]["token_endpoint"] = f"{tokens}/token"
        credential = credential_create(vault.id, auth=auth, actor="test")
        session_id = session_with(url, [vault.id])
        call(session_id, "echo", {"text": "fresh"})
        assert texts(of(session_id, "agent.mcp_tool_result")[-1]) == "echo: fresh"
        call(session_id, "echo", {"text": "again"})
        assert texts(of(session_id, "agent.mcp_tool_result")[-1]) == "echo: again"
    assert len(grants) == 1, f"one refresh for every request that found the token expired: {grants}"
    assert grants[0]["form"] == {
        "grant_type": "refresh_token",
        "refresh_token": REFRESH_TOKEN,
        "scope": "tools",
    }
    assert f"Bearer {OLD_TOKEN}" not in seen, "the expired token was never sent"
    stored = Credential.objects.get(id=credential.id)
    assert stored.secret_version == credential.secret_version + 1
    assert set(stored.sealed) >= {"access_token", "refresh_token", "client_secret"}
    assert datetime.fromisoformat(stored.auth["expires_at"]) > datetime.now(UTC) + timedelta(minutes=50)
    assert NEW_TOKEN not in json.dumps(stored.sealed) and ROTATED_REFRESH not in json.dumps(stored.sealed)
    [row] = audited(action="refresh", credential_id=credential.id)
    assert row.allowed and "refresh token rotated" in row.detail and row.session_id == session_id
    no_secret_in_the_log(session_id)


def test_a_token_revoked_before_its_expiry_is_refreshed_on_the_401_and_the_request_sent_again(egress: Egress):
    grants: list[dict[str, Any]] = []
    with mcp_server({NEW_TOKEN}) as (url, seen), serving(token_endpoint(grants), host=DOOR_HOST) as tokens:
        vault = vault_create(display_name="oauth")
        auth = oauth_credential(vault.id, url, expires_in=None)
        auth["refresh"]["token_endpoint"] = f"{tokens}/token"
        credential_create(vault.id, auth=auth, actor="test")
        session_id = session_with(url, [vault.id])
        call(session_id, "echo", {"text": "after a 401"})
    assert texts(of(session_id, "agent.mcp_tool_result")[-1]) == "echo: after a 401"
    assert seen[0] == f"Bearer {OLD_TOKEN}" and f"Bearer {NEW_TOKEN}" in seen[1:]
    assert len(grants) == 1
    assert not [e for e in of(session_id, "session.error")]
    no_secret_in_the_log(session_id)


def test_a_refresh_endpoint_that_fails_is_an_authentication_error_audited_without_a_secret(egress: Egress):
    grants: list[dict[str, Any]] = []
    with (
        mcp_server({NEW_TOKEN}) as (url, _),
        serving(token_endpoint(grants, fail=True), host=DOOR_HOST) as tokens,
    ):
        vault = vault_create(display_name="oauth")
        auth = oauth_credential(vault.id, url, expires_in=timedelta(seconds=20))
        auth["refresh"]["token_endpoint"] = f"{tokens}/token"
        credential = credential_create(vault.id, auth=auth, actor="test")
        session_id = session_with(url, [vault.id])
        call(session_id, "echo", {"text": "x"})
    errors = [e.payload["error"] for e in of(session_id, "session.error")]
    assert errors and {e["type"] for e in errors} == {"mcp_authentication_failed_error"}, errors
    [row] = audited(action="refresh", credential_id=credential.id)
    assert not row.allowed and "HTTP 400" in row.detail, row.detail
    assert len(grants) == 1, "a failed refresh is not tried again at once, whatever asks"
    for row in CredentialUse.objects.filter(credential_id=credential.id):
        assert not any(secret in row.detail for secret in SECRETS)
    assert Credential.objects.get(id=credential.id).secret_version == credential.secret_version
    assert not any(secret in egress.log.read_text() for secret in SECRETS), "no token in the proxy's log"
    no_secret_in_the_log(session_id)


def proxied_get(door_url: str, authorization: str | None, target: str) -> int:
    handler = urllib.request.ProxyHandler({"http": door_url})
    opener = urllib.request.build_opener(handler)
    request = urllib.request.Request(target)
    if authorization is not None:
        request.add_header("Proxy-Authorization", authorization)
    try:
        with opener.open(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_the_door_takes_only_a_valid_session_identity(egress: Egress):
    with mcp_server({TOKEN}) as (url, _):
        session_id = session_with(url, [])
        right = base64.b64encode(f"session:{session_id}:{egress.harness_token}".encode()).decode()
        wrong = base64.b64encode(f"session:{session_id}:not-the-token".encode()).decode()
        unknown = base64.b64encode(f"session:sesn_nope:{egress.harness_token}".encode()).decode()
        sandbox = base64.b64encode(b"sbx_123:anything").decode()
        assert proxied_get(egress.door_url, f"Basic {right}", url) not in (403, 407)
        for identity in (None, f"Basic {wrong}", f"Basic {unknown}", f"Basic {sandbox}"):
            assert proxied_get(egress.door_url, identity, url) == 407, identity
    door = Door("regular@127.0.0.1:1", "t", "10.213.0.0/24", None, None, None)  # type: ignore[arg-type]
    assert door.from_sandboxes("10.213.0.7") and not door.from_sandboxes("127.0.0.1")


def validate(api: anthropic.Anthropic, vault_id: str, credential_id: str) -> Any:
    return api.beta.vaults.credentials.mcp_oauth_validate(credential_id, vault_id=vault_id)


@pytest.fixture
def web_with_the_proxy(egress: Egress, transactional_db: Any, redis_url: str) -> Iterator[str]:
    """The real web server (Daphne), told where the proxy's control endpoint is."""
    from bench.common.processes import daphne

    env = child_env(
        EGRESS_CONTROL_URL=egress.control_url,
        EGRESS_CONTROL_TOKEN="control-token",
        EGRESS_PLAIN_HOSTS=DOOR_HOST,
    )
    with daphne(env, ROOT / ".pytest-daphne.log", append_log=True, timeout=90) as url:
        yield url


def test_mcp_oauth_validate_probes_the_server_through_the_proxy_and_refreshes_a_revoked_token(
    web_with_the_proxy: str, api_key: str
):
    api = anthropic.Anthropic(api_key=api_key, base_url=web_with_the_proxy, max_retries=0, timeout=60)
    grants: list[dict[str, Any]] = []
    with (
        mcp_server({TOKEN, NEW_TOKEN}) as (url, _),
        serving(token_endpoint(grants), host=DOOR_HOST) as tokens,
    ):
        vault = vault_create(display_name="validate")
        good = credential_create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": url, "token": TOKEN}, actor="test"
        )
        result = validate(api, vault.id, good.id)
        assert isinstance(result, BetaManagedAgentsCredentialValidation)
        assert (result.status, result.has_refresh_token) == ("valid", False)
        assert result.mcp_probe and result.mcp_probe.http_response
        assert result.mcp_probe.http_response.status_code == 200

        other = vault_create(display_name="validate-2")
        bad = credential_create(
            other.id, auth={"type": "static_bearer", "mcp_server_url": url, "token": "wrong"}, actor="test"
        )
        result = validate(api, other.id, bad.id)
        assert result.status == "invalid" and result.refresh and result.refresh.status == "no_refresh_token"

        third = vault_create(display_name="validate-3")
        auth = oauth_credential(third.id, url, expires_in=None)
        auth["refresh"]["token_endpoint"] = f"{tokens}/token"
        revoked = credential_create(third.id, auth=auth, actor="test")
        result = validate(api, third.id, revoked.id)
        assert (result.status, result.has_refresh_token) == ("valid", True)
        assert result.refresh and result.refresh.status == "succeeded"
        shown = result.model_dump_json()
        assert not any(secret in shown for secret in SECRETS), "no token in the validation"
        assert Credential.objects.get(id=revoked.id).secret_version == revoked.secret_version + 1
    # The server is gone: unknown, not invalid.
    result = validate(api, vault.id, good.id)
    assert result.status == "unknown"
    rows = list(CredentialUse.objects.filter(action="validate", credential_id=good.id).order_by("at"))
    assert [row.allowed for row in rows] == [True, False]
