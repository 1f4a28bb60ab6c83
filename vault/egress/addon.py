"""The mitmproxy addon: who is asking, may it go there, and what to add to and take from its traffic.

The proxy has two doors (listeners). Sandboxes come through the one on their network, as `sbx_…`
identities. The platform's workers come through the workers' door (EGRESS_HARNESS_LISTEN), as the session
they work for (kernel/egress.py); `session:` identities are taken only there, and never from the sandboxes'
subnet, since the token behind them speaks for every session. At that door the proxy adds the MCP
credential of the session's vaults whose server URL the request is for (refreshing an expired `mcp_oauth`
token first, and once more after a 401), or a repository's token to git's requests, and takes every such
token out of what comes back.

At the sandboxes' door, each hook reads the sandbox's policy (cached, `state.Policies`) and applies
`policy.py`'s rules:

- `http_connect` (HTTPS, and any tunnel): the sandbox's identity from Proxy-Authorization (407 without a
  valid one), then the host against the environment's networking and the address against the private
  ranges (403 with the reason, audited). The tunnel remembers whose it is.
- `request`: the same checks for plain http (each request carries its identity); inside a tunnel, the
  request must go to the tunnel's own host (no Host-header fronting). Then placeholders become secrets
  where the credential allows the host, and git requests under a session's repository get its token.
- `responseheaders`/`response`: every secret of the session, in whatever response, goes back to the sandbox
  as its placeholder (or redacted, for a repository token).
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
import weakref
from collections.abc import MutableMapping
from dataclasses import dataclass

from mitmproxy import connection, http, tcp

from .door import Door
from .policy import (
    REDACTED,
    McpCredential,
    SandboxPolicy,
    SessionPolicy,
    StreamScrubber,
    host_refusal,
    refusal_detail,
    repository_for,
    scrub,
    substitute,
)
from .resolver import Resolver
from .state import SESSION_KEY, Auditor, Policies

logger = logging.getLogger("vault.egress")
REALM = "workbench egress"
REFUSED_HEADER = "X-Workbench-Egress"
IDENTITY_REQUIRED = (
    "Proxy authentication required: this is Workbench's egress proxy, which serves sandboxes only. A "
    "sandbox's HTTP_PROXY and HTTPS_PROXY carry its identity (sandbox id and token); this request had none "
    "that is valid (an unknown or finished sandbox, or a wrong token)."
)
SESSION_USER = "session"


DOOR_IDENTITY_REQUIRED = (
    "Proxy authentication required: this is the egress proxy's door for Workbench's workers, which speak for "
    "a session (kernel/egress.py: the user-id 'session' and '<session_id>:<EGRESS_HARNESS_TOKEN>'); this "
    "request had no valid one (a wrong token, a session that does not exist, or a sandbox's identity)."
)


@dataclass(frozen=True)
class Tunnel:
    key: str  # the policy's: a sandbox id, or state.SESSION_KEY + a session id
    host: str
    port: int


Policy = SandboxPolicy | SessionPolicy


def _basic(value: str) -> tuple[str, str] | None:
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def _reason(text: str) -> str:
    """A reason phrase (what clients that hide a CONNECT's body still show): one line of ASCII."""
    return "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in text)[:200]


class Egress:
    def __init__(
        self,
        policies: Policies,
        resolver: Resolver,
        auditor: Auditor,
        *,
        repository_plain_hosts: list[str],
        buffer_bytes: int,
        door: Door | None = None,
    ) -> None:
        self.policies = policies
        self.resolver = resolver
        self.auditor = auditor
        self.repository_plain_hosts = repository_plain_hosts
        self.buffer_bytes = buffer_bytes
        self.door = door
        self.tunnels: MutableMapping[connection.Client, Tunnel] = weakref.WeakKeyDictionary()

    # -- who, and where

    def _at_door(self, client: connection.Client) -> bool:
        return self.door is not None and client.proxy_mode.full_spec == self.door.spec

    async def _identify(self, flow: http.HTTPFlow) -> Policy | None:
        credentials = _basic(flow.request.headers.get("Proxy-Authorization", ""))
        policy: Policy | None = None
        at_door = self._at_door(flow.client_conn)
        if credentials is None:
            pass
        elif at_door:
            assert self.door is not None
            if credentials[0] == SESSION_USER and not self.door.from_sandboxes(flow.client_conn.peername[0]):
                policy = await self.policies.identify_session(credentials[1], self.door.token)
        else:
            policy = await self.policies.identify(*credentials)
        if policy is None:
            flow.response = http.Response.make(
                407,
                (DOOR_IDENTITY_REQUIRED if at_door else IDENTITY_REQUIRED) + "\n",
                {"Proxy-Authenticate": f'Basic realm="{REALM}"', "Content-Type": "text/plain; charset=utf-8"},
            )
            logger.info(
                "egress: 407 for %s (no valid %s identity)",
                flow.request.pretty_host,
                "session" if at_door else "sandbox",
            )
        return policy

    @staticmethod
    def _key(policy: Policy) -> str:
        return policy.sandbox_id if isinstance(policy, SandboxPolicy) else SESSION_KEY + policy.session_id

    async def _refusal(self, policy: Policy, host: str, port: int) -> str | None:
        return self._host_refusal(policy, host) or await self.resolver.refusal(host, port)

    @staticmethod
    def _host_refusal(policy: Policy, host: str) -> str | None:
        """The environment's networking, for a sandbox; the workers go where their agents' MCP servers and
        repositories are (the private-address rule still holds for them)."""
        if isinstance(policy, SessionPolicy):
            return None
        return host_refusal(host, policy.networking, policy.repository_hosts())

    def _refuse(self, flow: http.HTTPFlow, policy: Policy, host: str, why: str) -> None:
        body = f"Refused by Workbench's egress proxy: {why}.\n"
        flow.response = http.Response.make(
            403, body, {"Content-Type": "text/plain; charset=utf-8", REFUSED_HEADER: "refused"}
        )
        flow.response.reason = _reason(f"Forbidden: {why}")
        self.auditor.write(
            "refuse",
            allowed=False,
            detail=f"request refused: {why}",
            session_id=policy.session_id,
            sandbox_id=getattr(policy, "sandbox_id", ""),
            host=host[:300],
        )

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        policy = await self._identify(flow)
        if policy is None:
            return
        host, port = flow.request.host, flow.request.port
        why = await self._refusal(policy, host, port)
        if why is not None:
            self._refuse(flow, policy, host, why)
            return
        self.tunnels[flow.client_conn] = Tunnel(self._key(policy), host.lower(), port)

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method == "CONNECT":
            return
        tunnel = self.tunnels.get(flow.client_conn)
        host, port = flow.request.host.lower(), flow.request.port
        if tunnel is None:
            policy = await self._identify(flow)
            if policy is None:
                return
            flow.request.headers.pop("Proxy-Authorization", None)
            why = await self._refusal(policy, host, port)
        else:
            policy = await self.policies.of(tunnel.key)
            if policy is None:
                flow.response = http.Response.make(407, IDENTITY_REQUIRED + "\n", {})
                return
            why = None
            if (host, port) != (tunnel.host, tunnel.port):
                why = (
                    f"this tunnel was opened to {tunnel.host}:{tunnel.port}, and a request in it may not go to "
                    f"{host}:{port}"
                )
            why = why or self._host_refusal(policy, host)
        if why is None:
            why = self._host_header_refusal(flow, host)
        if why is not None:
            self._refuse(flow, policy, host, why)
            return
        flow.metadata["egress_policy"] = policy
        if isinstance(policy, SessionPolicy):
            await self._inject_for_session(flow, policy, host)
        else:
            self._inject(flow, policy, host)

    @staticmethod
    def _host_header_refusal(flow: http.HTTPFlow, host: str) -> str | None:
        named = flow.request.host_header
        if not named:
            return None
        name = named.rsplit(":", 1)[0] if not named.endswith("]") else named
        if name.strip("[]").lower().rstrip(".") != host:
            return f"the request's Host header names {name}, but it goes to {host}"
        return None

    # -- what it adds

    def _inject(self, flow: http.HTTPFlow, policy: SandboxPolicy, host: str) -> None:
        injected: dict[str, str] = {}
        refused: dict[str, str] = {}
        if policy.credentials:
            fields = []
            for name, value in flow.request.headers.fields:
                done = substitute(value, policy.credentials, host, where="header")
                fields.append((name, done.value))
                for cid in done.injected:
                    injected.setdefault(cid, f"header {name.decode('latin-1')}")
                for cid in done.refused:
                    refused.setdefault(cid, "header")
            flow.request.headers.fields = tuple(fields)
            body = flow.request.get_content(strict=False)
            if body:
                done = substitute(body, policy.credentials, host, where="body")
                if done.injected:
                    flow.request.content = done.value
                for cid in done.injected:
                    injected.setdefault(cid, "body")
                for cid in done.refused:
                    refused.setdefault(cid, "body")
        by_id = {c.id: c for c in policy.credentials}
        for cid, where in injected.items():
            credential = by_id[cid]
            self._audit_use(
                policy, host, credential.id, credential.vault_id, f"{credential.secret_name} in {where}"
            )
        for cid, where in refused.items():
            if cid in injected:
                continue
            credential = by_id[cid]
            self.auditor.write(
                "refuse",
                allowed=False,
                detail=refusal_detail(credential, host, where),
                credential_id=credential.id,
                vault_id=credential.vault_id,
                session_id=policy.session_id,
                sandbox_id=policy.sandbox_id,
                host=host[:300],
            )
        self._add_repository_token(flow, policy, host)

    def _add_repository_token(self, flow: http.HTTPFlow, policy: Policy, host: str) -> None:
        repository = repository_for(
            flow.request.url, policy.repositories, plain_hosts=self.repository_plain_hosts
        )
        if repository is not None:
            flow.request.headers["Authorization"] = repository.authorization()
            self.auditor.write(
                "inject",
                allowed=True,
                detail=f"repository token of {repository.url} added to git's {flow.request.method} "
                f"{flow.request.path.split('?')[0][:200]}",
                session_id=policy.session_id,
                sandbox_id=getattr(policy, "sandbox_id", ""),
                host=host[:300],
            )

    # -- what the workers' door adds

    async def _inject_for_session(self, flow: http.HTTPFlow, policy: SessionPolicy, host: str) -> None:
        flow.request.headers.pop("Proxy-Authorization", None)
        credential = policy.credential_for(flow.request.url)
        if credential is None:
            self._add_repository_token(flow, policy, host)
            return
        assert self.door is not None
        token = credential.token
        if credential.refreshable and credential.expired(time.time(), self.door.refresh_margin):
            refreshed = await self.door.refresh(policy, credential)
            token = refreshed.token or token
        flow.request.headers["Authorization"] = f"Bearer {token}"
        flow.metadata["egress_mcp"] = credential
        self.auditor.write(
            "inject",
            allowed=True,
            detail=f"{credential.kind} credential added to the harness's MCP {flow.request.method} "
            f"{flow.request.path.split('?')[0][:200]}",
            credential_id=credential.id,
            vault_id=credential.vault_id,
            session_id=policy.session_id,
            host=host[:300],
        )

    async def _retry_after_refresh(self, flow: http.HTTPFlow) -> None:
        """A 401 to a request that carried a refreshable token: refresh it, and send the request once more
        (a server may revoke a token before the expiry it was given with)."""
        credential: McpCredential | None = flow.metadata.get("egress_mcp")
        policy = flow.metadata.get("egress_policy")
        assert flow.response is not None and self.door is not None
        if credential is None or not credential.refreshable or flow.metadata.get("egress_retried"):
            return
        if flow.response.status_code != 401 or flow.request.method != "POST":
            return
        flow.metadata["egress_retried"] = True
        refreshed = await self.door.refresh(policy, credential)
        if not refreshed.token or refreshed.token == credential.token:
            return
        headers = {
            k: v
            for k, v in flow.request.headers.items(multi=True)
            if k.lower() not in ("host", "content-length", "connection", "proxy-authorization")
        }
        headers["Authorization"] = f"Bearer {refreshed.token}"
        answer = await self.door.resend(
            flow.request.method, flow.request.url, headers, flow.request.content or b""
        )
        if answer is None:
            return
        flow.response = http.Response.make(
            answer.status,
            answer.body,
            [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in answer.headers
                if k.lower() not in ("transfer-encoding", "content-length")
            ],
        )
        # The refreshed token is among what must not come back.
        flow.metadata["egress_secrets"] = sorted(
            [*flow.metadata.get("egress_secrets", []), (refreshed.token.encode(), REDACTED.encode())],
            key=lambda pair: -len(pair[0]),
        )

    def _audit_use(
        self, policy: SandboxPolicy, host: str, credential_id: str, vault_id: str, what: str
    ) -> None:
        self.auditor.write(
            "inject",
            allowed=True,
            detail=f"substituted {what}",
            credential_id=credential_id,
            vault_id=vault_id,
            session_id=policy.session_id,
            sandbox_id=policy.sandbox_id,
            host=host[:300],
        )

    # -- what it takes back

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        policy: SandboxPolicy | None = flow.metadata.get("egress_policy")
        secrets = policy.secrets() if policy else []
        flow.metadata["egress_secrets"] = secrets
        if secrets:
            flow.response.headers.fields = tuple(
                (name, scrub(value, secrets)) for name, value in flow.response.headers.fields
            )
        length = flow.response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) <= self.buffer_bytes:
            return  # buffered whole; `response` scrubs the decoded body
        if flow.response.status_code == 401 and flow.metadata.get("egress_mcp") is not None:
            return  # buffered: `response` may refresh the token and send the request again
        if not secrets:
            flow.response.stream = True
            return
        encoding = flow.response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # A compressed stream cannot be scrubbed chunk by chunk.
            logger.warning(
                "egress: refused a %s-encoded response of unknown or large size from %s for a session holding "
                "secrets",
                encoding,
                flow.request.pretty_host,
            )
            flow.kill()
            return
        flow.response.stream = StreamScrubber(secrets)

    async def response(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        if flow.response.stream:
            return
        if flow.metadata.get("egress_mcp") is not None:
            await self._retry_after_refresh(flow)
        secrets = flow.metadata.get("egress_secrets") or []
        if not secrets:
            return
        flow.response.headers.fields = tuple(
            (name, scrub(value, secrets)) for name, value in flow.response.headers.fields
        )
        try:
            body = flow.response.get_content()
        except ValueError:  # an encoding mitmproxy cannot decode: scrub what came
            flow.response.raw_content = scrub(flow.response.raw_content or b"", secrets)
            return
        if body:
            clean = scrub(body, secrets)
            if clean != body:
                flow.response.content = clean

    # -- what other protocols carry back (WebSocket messages, raw TCP in a tunnel)

    async def _secrets_of(self, client: connection.Client) -> list[tuple[bytes, bytes]]:
        tunnel = self.tunnels.get(client)
        policy = await self.policies.of(tunnel.key) if tunnel else None
        return policy.secrets() if policy else []

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        assert flow.websocket is not None
        message = flow.websocket.messages[-1]
        policy: SandboxPolicy | None = flow.metadata.get("egress_policy")
        secrets = policy.secrets() if policy else await self._secrets_of(flow.client_conn)
        if not message.from_client and secrets:
            message.content = scrub(message.content, secrets)

    async def tcp_message(self, flow: tcp.TCPFlow) -> None:
        message = flow.messages[-1]
        if message.from_client:
            return
        secrets = await self._secrets_of(flow.client_conn)
        if secrets:
            # A secret split across two TCP messages is not found: raw TCP is passed, not parsed.
            message.content = scrub(message.content, secrets)
