"""What the workers' door does with an MCP credential besides adding it: refresh an `mcp_oauth` token, and
probe a server for `mcp_oauth_validate`.

Both talk to servers themselves (the token endpoint, the MCP server), so both go where the proxy's own
connections go: to the address the resolver checked (`Resolver.pin`), over TLS verified against the system's
CAs or EGRESS_UPSTREAM_CA. A refresh runs on a thread holding the credential's row lock, so two proxies, or
two requests, that find the token expired refresh it once: the second sees the new `secret_version` and
uses what the first stored. Nothing here logs or returns a secret: answers are scrubbed of the tokens
before they are shown, and audit rows say what happened in words.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.db import close_old_connections, transaction

from vault import crypto
from vault.models import Credential
from vault.services import audit

from .policy import REDACTED, scrub

logger = logging.getLogger("vault.egress")
ACTOR = "egress proxy"
TIMEOUT_SECONDS = 15.0
SHOWN_BODY_BYTES = 4096
MCP_PROTOCOL_VERSION = "2025-06-18"


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")

    def shown(self, secrets: list[str]) -> dict[str, Any]:
        """The answer as validation shows it (`http_response`): its body cut and scrubbed of `secrets`."""
        pairs = [(s.encode(), REDACTED.encode()) for s in secrets if s]
        body = scrub(self.body[: SHOWN_BODY_BYTES + 512], sorted(pairs, key=lambda p: -len(p[0])))
        return {
            "status_code": self.status,
            "content_type": self.header("Content-Type") or None,
            "body": body[:SHOWN_BODY_BYTES].decode("utf-8", "replace"),
            "body_truncated": len(self.body) > SHOWN_BODY_BYTES,
        }


class Unreachable(Exception):
    """A server that could not be reached (refused by the proxy's rules, down, TLS failed); words only."""


def _tls(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file or None)


def send(
    method: str,
    url: str,
    *,
    address: str,
    headers: dict[str, str],
    body: bytes = b"",
    ca_file: str = "",
    timeout: float = TIMEOUT_SECONDS,
) -> Answer:
    """One request to `url`, connected to `address` (the checked one), the host's name kept for TLS and Host."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        raw = socket.create_connection((address, port), timeout=timeout)
        sock: socket.socket = (
            _tls(ca_file).wrap_socket(raw, server_hostname=host) if parts.scheme == "https" else raw
        )
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
        connection.sock = sock
        connection.request(method, path, body=body or None, headers={"Host": parts.netloc, **headers})
        response = connection.getresponse()
        data = response.read(1024 * 1024)
        connection.close()
    except (OSError, http.client.HTTPException) as error:
        raise Unreachable(f"{host}:{port} did not answer ({type(error).__name__}: {error})") from None
    return Answer(response.status, list(response.getheaders()), data)


# -- refresh


@dataclass
class Refreshed:
    """What a refresh did: `status` as validation shows it (succeeded, failed, connect_error,
    no_refresh_token), the token to use now, and the token endpoint's answer when there was one."""

    status: str
    token: str = ""
    answer: Answer | None = None
    detail: str = ""
    secrets: list[str] = field(default_factory=list)


def refresh(
    credential_id: str,
    *,
    seen_version: int,
    address: str,
    keys: Any,
    ca_file: str,
    session_id: str = "",
    public: crypto.PublicKeyring | None = None,
) -> Refreshed:
    """Refresh `credential_id`'s access token (on a thread: it holds the row lock while it asks the token
    endpoint, so a refresh happens once however many find the token expired)."""
    close_old_connections()
    with transaction.atomic():
        credential = Credential.objects.select_for_update().filter(id=credential_id).first()
        if credential is None or credential.kind != Credential.Kind.MCP_OAUTH:
            return Refreshed("no_refresh_token", detail="the credential is gone")
        opened = keys.unseal(credential)
        if credential.secret_version != seen_version:  # refreshed meanwhile (another request, another proxy)
            return Refreshed("succeeded", token=opened.get("access_token", ""), detail="refreshed meanwhile")
        settings_of: dict[str, Any] = credential.auth.get("refresh") or {}
        refresh_token = opened.get("refresh_token", "")
        if not settings_of or not refresh_token:
            return Refreshed("no_refresh_token", detail="the credential has no refresh token")
        method = (settings_of.get("token_endpoint_auth") or {}).get("type", "none")
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        if method == "client_secret_basic":
            pair = f"{settings_of['client_id']}:{opened.get('client_secret', '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        else:
            form["client_id"] = settings_of["client_id"]
            if method == "client_secret_post":
                form["client_secret"] = opened.get("client_secret", "")
        for name in ("scope", "resource"):
            if settings_of.get(name):
                form[name] = settings_of[name]
        secrets = [v for v in opened.values() if v]
        endpoint = settings_of["token_endpoint"]
        where = {
            "credential_id": credential.id,
            "vault_id": credential.vault_id,
            "session_id": session_id,
            "host": (urlsplit(endpoint).hostname or "")[:300],
        }
        try:
            answer = send(
                "POST",
                endpoint,
                address=address,
                headers=headers,
                body=urlencode(form).encode(),
                ca_file=ca_file,
            )
        except Unreachable as error:
            _audit(f"token endpoint unreachable: {error}", False, where)
            return Refreshed("connect_error", detail=str(error), secrets=secrets)
        grant = _grant(answer)
        if grant is None:
            detail = f"the token endpoint answered HTTP {answer.status} without a new access_token"
            _audit(detail, False, where)
            return Refreshed("failed", answer=answer, detail=detail, secrets=secrets)
        new = {"access_token": grant["access_token"]}
        if isinstance(grant.get("refresh_token"), str) and grant["refresh_token"]:
            new["refresh_token"] = grant["refresh_token"]  # the server rotated it
        credential.seal(new, public=public)
        auth = dict(credential.auth)
        lifetime = grant.get("expires_in")
        if isinstance(lifetime, int | float) and lifetime > 0:
            until = datetime.now(UTC) + timedelta(seconds=float(lifetime))
            auth["expires_at"] = until.isoformat().replace("+00:00", "Z")
        else:
            auth.pop("expires_at", None)
        credential.auth = auth
        credential.secret_version += 1
        credential.save(update_fields=["sealed", "auth", "secret_version", "updated_at"])
        _audit(
            "access token refreshed"
            + (" (and the refresh token rotated)" if "refresh_token" in new else "")
            + (f"; expires {auth['expires_at']}" if "expires_at" in auth else ""),
            True,
            where,
        )
        return Refreshed(
            "succeeded", token=new["access_token"], answer=answer, secrets=[*secrets, *new.values()]
        )


def _audit(detail: str, allowed: bool, where: dict[str, str]) -> None:
    audit("refresh", actor=ACTOR, allowed=allowed, detail=detail, **where)


def _grant(answer: Answer) -> dict[str, Any] | None:
    if answer.status != 200:
        return None
    try:
        grant = json.loads(answer.body)
    except ValueError:
        return None
    if (
        not isinstance(grant, dict)
        or not isinstance(grant.get("access_token"), str)
        or not grant["access_token"]
    ):
        return None
    return grant


# -- validation


def probe(url: str, token: str, *, address: str, ca_file: str) -> Answer:
    """An MCP `initialize` request to the server with `token`: what the harness's first request is."""
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": MCP_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "workbench-credential-validation", "version": "1"},
        },
    }
    return send(
        "POST",
        url,
        address=address,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
        body=json.dumps(request).encode(),
        ca_file=ca_file,
    )


def validation(
    credential: Credential,
    *,
    status: str,
    probe_answer: Answer | None,
    refreshed: Refreshed | None,
    has_refresh_token: bool,
    secrets: list[str],
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "type": "vault_credential_validation",
        "credential_id": credential.id,
        "vault_id": credential.vault_id,
        "status": status,
        "has_refresh_token": has_refresh_token,
        "validated_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "mcp_probe": {"method": "initialize"},
    }
    if probe_answer is not None:
        result["mcp_probe"]["http_response"] = probe_answer.shown(secrets)
    if refreshed is not None:
        result["refresh"] = {"status": refreshed.status}
        if refreshed.answer is not None:
            result["refresh"]["http_response"] = refreshed.answer.shown([*secrets, *refreshed.secrets])
    return result
