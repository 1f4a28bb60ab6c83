"""The mitmproxy addon: who is asking, may it go there, and what to add to and take from its traffic.

Each hook reads the sandbox's policy (cached, `state.Policies`) and applies `policy.py`'s rules:

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
import weakref
from collections.abc import MutableMapping
from dataclasses import dataclass

from mitmproxy import connection, http, tcp

from .policy import (
    SandboxPolicy,
    StreamScrubber,
    host_refusal,
    refusal_detail,
    repository_for,
    scrub,
    substitute,
)
from .resolver import Resolver
from .state import Auditor, Policies

logger = logging.getLogger("vault.egress")
REALM = "workbench egress"
REFUSED_HEADER = "X-Workbench-Egress"
IDENTITY_REQUIRED = (
    "Proxy authentication required: this is Workbench's egress proxy, which serves sandboxes only. A "
    "sandbox's HTTP_PROXY and HTTPS_PROXY carry its identity (sandbox id and token); this request had none "
    "that is valid (an unknown or finished sandbox, or a wrong token)."
)


@dataclass(frozen=True)
class Tunnel:
    sandbox_id: str
    host: str
    port: int


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
    ) -> None:
        self.policies = policies
        self.resolver = resolver
        self.auditor = auditor
        self.repository_plain_hosts = repository_plain_hosts
        self.buffer_bytes = buffer_bytes
        self.tunnels: MutableMapping[connection.Client, Tunnel] = weakref.WeakKeyDictionary()

    # -- who, and where

    async def _identify(self, flow: http.HTTPFlow) -> SandboxPolicy | None:
        credentials = _basic(flow.request.headers.get("Proxy-Authorization", ""))
        policy = await self.policies.identify(*credentials) if credentials else None
        if policy is None:
            flow.response = http.Response.make(
                407,
                IDENTITY_REQUIRED + "\n",
                {"Proxy-Authenticate": f'Basic realm="{REALM}"', "Content-Type": "text/plain; charset=utf-8"},
            )
            logger.info("egress: 407 for %s (no valid sandbox identity)", flow.request.pretty_host)
        return policy

    async def _refusal(self, policy: SandboxPolicy, host: str, port: int) -> str | None:
        return host_refusal(
            host, policy.networking, policy.repository_hosts()
        ) or await self.resolver.refusal(host, port)

    def _refuse(self, flow: http.HTTPFlow, policy: SandboxPolicy, host: str, why: str) -> None:
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
            sandbox_id=policy.sandbox_id,
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
        self.tunnels[flow.client_conn] = Tunnel(policy.sandbox_id, host.lower(), port)

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
            policy = await self.policies.get(tunnel.sandbox_id)
            if policy is None:
                flow.response = http.Response.make(407, IDENTITY_REQUIRED + "\n", {})
                return
            why = None
            if (host, port) != (tunnel.host, tunnel.port):
                why = (
                    f"this tunnel was opened to {tunnel.host}:{tunnel.port}, and a request in it may not go to "
                    f"{host}:{port}"
                )
            why = why or host_refusal(host, policy.networking, policy.repository_hosts())
        if why is None:
            why = self._host_header_refusal(flow, host)
        if why is not None:
            self._refuse(flow, policy, host, why)
            return
        flow.metadata["egress_policy"] = policy
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
                sandbox_id=policy.sandbox_id,
                host=host[:300],
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

    def response(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        if flow.response.stream:
            return
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
        policy = await self.policies.get(tunnel.sandbox_id) if tunnel else None
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
