"""`mcp_oauth_validate`: the web server cannot open a credential, so it asks the egress proxy, which probes
the MCP server with it (and refreshes on a 401), audits the use, and answers the validation object."""

from __future__ import annotations

from typing import Any

import httpx
from django.conf import settings

from kernel.errors import Invalid, Unavailable
from vault.models import Credential

TIMEOUT_SECONDS = 30.0


def credential_validate(credential: Credential, *, actor: str) -> dict[str, Any]:
    if credential.kind == Credential.Kind.ENVIRONMENT_VARIABLE:
        raise Invalid(
            f"Credential {credential.id} is an environment_variable credential; only MCP credentials "
            "(mcp_oauth, static_bearer) can be validated against their server."
        )
    if not settings.EGRESS_CONTROL_URL:
        raise Unavailable(
            "Validating a credential needs the egress proxy, the only process that can open it, and "
            "EGRESS_CONTROL_URL is not set; start the proxy (make run starts it) and set it."
        )
    try:
        answer = httpx.post(
            f"{settings.EGRESS_CONTROL_URL.rstrip('/')}/validate",
            json={"vault_id": credential.vault_id, "credential_id": credential.id, "actor": actor},
            headers={"Authorization": f"Bearer {settings.EGRESS_CONTROL_TOKEN}"},
            timeout=TIMEOUT_SECONDS,
        )
    except httpx.HTTPError as error:
        raise Unavailable(
            f"The egress proxy at {settings.EGRESS_CONTROL_URL} did not answer ({type(error).__name__}); "
            "validation needs it running. Retry when it is up."
        ) from None
    if answer.status_code != 200:
        raise Unavailable(f"The egress proxy could not validate the credential (HTTP {answer.status_code}).")
    result: dict[str, Any] = answer.json()
    return result
