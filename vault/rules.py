"""What a credential's `auth` may say, split into what the API shows and what is sealed (reference §8).

The `/v1` edge checks each field's type and presence against its schema (vault/api.py); these are the
rules across fields and against what is stored, shared by the API, the admin and the UI.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.utils.dateparse import parse_datetime

from kernel.errors import Invalid

MAX_ALLOWED_HOSTS = 16
# A hostname label, and a whole name: letters, digits, '-' and '_' (some internal names), dot-separated.
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
# The fields of each kind that are sealed and never shown.
SECRET_FIELDS = {
    "static_bearer": ("token",),
    "mcp_oauth": ("access_token", "refresh_token", "client_secret"),
    "environment_variable": ("secret_value",),
}
# The field a replaced secret fills (a rotation), by kind.
REPLACEABLE_SECRET = {kind: fields[0] for kind, fields in SECRET_FIELDS.items()}
DEFAULT_INJECTION = {"header": True, "body": False}


def allowed_host(entry: str, where: str) -> str:
    """A bare hostname, an IPv4 address, or `*.` and a hostname; lower-cased."""
    host = entry.strip().lower()
    bare = host[2:] if host.startswith("*.") else host
    if "/" in host or ":" in host or not bare:
        raise Invalid(
            f"'{where}' entries are bare hostnames (api.example.com), IPv4 addresses or '*.' wildcards "
            f"(*.example.com); URLs, ports, paths and IPv6 addresses are not accepted, not {entry!r}."
        )
    if _is_ipv4(bare):
        if host.startswith("*."):
            raise Invalid(f"'{where}': a wildcard takes a hostname, not an IP address: {entry!r}.")
        return host
    if not _HOSTNAME.fullmatch(bare) or len(bare) > 253:
        raise Invalid(f"'{where}' has an entry that is not a hostname: {entry!r}.")
    return host


def allowed_hosts(entries: list[str], where: str) -> list[str]:
    if len(entries) > MAX_ALLOWED_HOSTS:
        raise Invalid(f"'{where}' has {len(entries)} entries; at most {MAX_ALLOWED_HOSTS} are allowed.")
    if not entries:
        raise Invalid(
            f'\'{where}\' must name at least one host (or use networking {{"type": "unrestricted"}}).'
        )
    return list(dict.fromkeys(allowed_host(e, f"{where}[{i}]") for i, e in enumerate(entries)))


def host_matches(host: str, patterns: list[str]) -> bool:
    """`host` is one of `patterns`, or under one of its `*.` wildcards (which does not match the bare domain)."""
    host = host.lower().rstrip(".")
    return any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in patterns)


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def service_url(url: str, where: str) -> str:
    """An https:// URL (plain http:// only for the hosts in EGRESS_PLAIN_HOSTS), without credentials."""
    parts = urlsplit(url.strip())
    try:
        host, _ = parts.hostname or "", parts.port
    except ValueError:
        raise Invalid(f"'{where}' has a malformed host or port: {url!r}.") from None
    if parts.scheme not in ("https", "http") or not host:
        raise Invalid(f"'{where}' must be an https:// URL, not {url!r}.")
    if parts.username is not None or parts.password is not None:
        raise Invalid(f"'{where}' must not carry credentials in the URL; the vault holds them.")
    if parts.scheme == "http" and host not in settings.EGRESS_PLAIN_HOSTS:
        raise Invalid(
            f"'{where}' must be an https:// URL: plain http:// is allowed only for the hosts in "
            f"EGRESS_PLAIN_HOSTS ({', '.join(settings.EGRESS_PLAIN_HOSTS) or 'none'})."
        )
    return url.strip()


def mcp_url_key(url: str) -> str:
    """An MCP server URL as credentials are matched to it: scheme and host lower-cased, the default port and
    a trailing '/' dropped, the fragment ignored."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    port = parts.port
    default = {"https": 443, "http": 80}.get(parts.scheme.lower())
    netloc = host if port in (None, default) else f"{host}:{port}"
    if ":" in host:  # IPv6
        netloc = f"[{host}]" if port in (None, default) else f"[{host}]:{port}"
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), parts.query, ""))


def future_time(value: str, where: str) -> str:
    moment = parse_datetime(value) if isinstance(value, str) else None
    if moment is None or moment.tzinfo is None:
        raise Invalid(
            f"'{where}' must be an RFC 3339 time with a zone, e.g. 2027-01-01T00:00:00Z, not {value!r}."
        )
    if moment <= datetime.now(UTC):
        raise Invalid(f"'{where}' must be in the future; {value} has passed.")
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _networking(networking: dict[str, Any], where: str) -> dict[str, Any]:
    if networking["type"] == "unrestricted":
        return {"type": "unrestricted"}
    return {
        "type": "limited",
        "allowed_hosts": allowed_hosts(list(networking["allowed_hosts"]), f"{where}.allowed_hosts"),
    }


def _injection(location: dict[str, bool]) -> dict[str, bool]:
    if not (location["header"] or location["body"]):
        raise Invalid(
            "'auth.injection_location' must enable 'header' or 'body' (or both): the secret has to go somewhere."
        )
    return location


# --- Create ----------------------------------------------------------------------------------------------


def new_auth(auth: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`shown`, `secret`) of a new credential's `auth`: what the API returns, and what is sealed."""
    kind = auth["type"]
    if kind == "static_bearer":
        _nonempty(auth["token"], "auth.token")
        url = service_url(auth["mcp_server_url"], "auth.mcp_server_url")
        return {"type": kind, "mcp_server_url": url}, {"token": auth["token"]}
    if kind == "mcp_oauth":
        _nonempty(auth["access_token"], "auth.access_token")
        shown: dict[str, Any] = {
            "type": kind,
            "mcp_server_url": service_url(auth["mcp_server_url"], "auth.mcp_server_url"),
        }
        secret: dict[str, Any] = {"access_token": auth["access_token"]}
        if auth.get("expires_at") is not None:
            shown["expires_at"] = future_time(auth["expires_at"], "auth.expires_at")
        if auth.get("refresh") is not None:
            refresh = auth["refresh"]
            _nonempty(refresh["refresh_token"], "auth.refresh.refresh_token")
            method = refresh["token_endpoint_auth"]
            shown["refresh"] = {
                "client_id": refresh["client_id"],
                "token_endpoint": service_url(refresh["token_endpoint"], "auth.refresh.token_endpoint"),
                "token_endpoint_auth": {"type": method["type"]},
                **{k: refresh[k] for k in ("resource", "scope") if refresh.get(k) is not None},
            }
            secret["refresh_token"] = refresh["refresh_token"]
            if method["type"] != "none":
                _nonempty(method["client_secret"], "auth.refresh.token_endpoint_auth.client_secret")
                secret["client_secret"] = method["client_secret"]
        return shown, secret
    _nonempty(auth["secret_value"], "auth.secret_value")
    return (
        {
            "type": kind,
            "secret_name": secret_name(auth["secret_name"]),
            "networking": _networking(auth["networking"], "auth.networking"),
            "injection_location": _injection({**DEFAULT_INJECTION, **(auth.get("injection_location") or {})}),
        },
        {"secret_value": auth["secret_value"]},
    )


def secret_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,254}", name):
        raise Invalid(
            f"'auth.secret_name' must be an environment variable name (letters, digits and '_', not starting "
            f"with a digit), not {name!r}."
        )
    return name


def _nonempty(value: str, where: str) -> None:
    if not value:
        raise Invalid(f"'{where}' must not be empty.")


# --- Update ----------------------------------------------------------------------------------------------


def changed_auth(shown: dict[str, Any], auth: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`shown`, `secret changes`) after an update's `auth`, whose type must be the stored one. Fields left
    out (or null) keep their value; immutable fields cannot be sent."""
    kind = shown["type"]
    if auth["type"] != kind:
        raise Invalid(
            f"'auth.type' must stay {kind!r}: a credential's type cannot change; create a new credential instead."
        )
    shown = dict(shown)
    secret: dict[str, Any] = {}
    if kind == "static_bearer":
        if auth.get("token") is not None:
            _nonempty(auth["token"], "auth.token")
            secret["token"] = auth["token"]
    elif kind == "mcp_oauth":
        if auth.get("access_token") is not None:
            _nonempty(auth["access_token"], "auth.access_token")
            secret["access_token"] = auth["access_token"]
        if auth.get("expires_at") is not None:
            shown["expires_at"] = future_time(auth["expires_at"], "auth.expires_at")
        if auth.get("refresh") is not None:
            secret.update(_refresh_change(shown, auth["refresh"]))
    else:
        if auth.get("secret_value") is not None:
            _nonempty(auth["secret_value"], "auth.secret_value")
            secret["secret_value"] = auth["secret_value"]
        if auth.get("networking") is not None:
            shown["networking"] = _networking(auth["networking"], "auth.networking")
        if auth.get("injection_location") is not None:
            shown["injection_location"] = _injection(
                {**shown["injection_location"], **auth["injection_location"]}
            )
    return shown, secret


def _refresh_change(shown: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    refresh = shown.get("refresh")
    if refresh is None:
        raise Invalid(
            "'auth.refresh' can only change a credential made with refresh settings; this one has none, so "
            "create a new credential with 'refresh' instead."
        )
    refresh = shown["refresh"] = dict(refresh)
    secret: dict[str, Any] = {}
    if change.get("refresh_token") is not None:
        _nonempty(change["refresh_token"], "auth.refresh.refresh_token")
        secret["refresh_token"] = change["refresh_token"]
    if change.get("scope") is not None:
        if change["scope"] == "":
            refresh.pop("scope", None)
        else:
            refresh["scope"] = change["scope"]
    method = change.get("token_endpoint_auth")
    if method is not None:
        if refresh["token_endpoint_auth"]["type"] == "none":
            raise Invalid(
                "'auth.refresh.token_endpoint_auth' can only replace the client secret of a credential that "
                "uses client_secret_basic or client_secret_post; this one uses none."
            )
        if method.get("client_secret") is not None:
            _nonempty(method["client_secret"], "auth.refresh.token_endpoint_auth.client_secret")
            secret["client_secret"] = method["client_secret"]
    return secret
