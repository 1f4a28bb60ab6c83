"""/v1/vaults and /v1/vaults/{id}/credentials (reference §3.8, §8): what `client.beta.vaults` speaks.

Secret fields are accepted and never returned: responses carry `auth` as vault/rules.py shows it.
"""

from typing import Annotated, Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import field_validator

from kernel.api.edge import caller
from kernel.api.pagination import keyset_page
from kernel.api.schemas import ERRORS, Body, Deleted, Metadata, MetadataPatch, Page, Timestamp
from vault.models import Credential as CredentialRow
from vault.models import Vault as VaultRow
from vault.services import (
    credential_archive,
    credential_create,
    credential_delete,
    credential_json,
    credential_update,
    get_credential,
    get_vault,
    vault_archive,
    vault_create,
    vault_delete,
    vault_json,
    vault_update,
)
from vault.validation import credential_validate

router = Router(tags=["vaults"])

Name = Annotated[str, Field(min_length=1, max_length=255)]
Url = Annotated[str, Field(min_length=1, max_length=2048)]
Secret = Annotated[str, Field(min_length=1, max_length=16_384, json_schema_extra={"writeOnly": True})]


def actor_of(request: HttpRequest) -> str:
    """Who the audit trail and the log say did it: the request's key (or narrower credential)."""
    return caller(request).actor


# -- request bodies: the create and update unions of `auth`


class Unrestricted(Body):
    type: Literal["unrestricted"]


class Limited(Body):
    type: Literal["limited"]
    allowed_hosts: list[str] = Field(..., max_length=16)


Networking = Annotated[Unrestricted | Limited, Field(discriminator="type")]


class Injection(Body):
    header: bool = True
    body: bool = False


class InjectionChange(Body):
    header: bool | None = None
    body: bool | None = None


class EndpointNone(Body):
    type: Literal["none"]


class EndpointBasic(Body):
    type: Literal["client_secret_basic"]
    client_secret: Secret


class EndpointPost(Body):
    type: Literal["client_secret_post"]
    client_secret: Secret


class Refresh(Body):
    client_id: Name
    refresh_token: Secret
    token_endpoint: Url
    token_endpoint_auth: Annotated[EndpointNone | EndpointBasic | EndpointPost, Field(discriminator="type")]
    resource: str | None = None
    scope: str | None = None


class StaticBearer(Body):
    type: Literal["static_bearer"]
    mcp_server_url: Url
    token: Secret


class McpOauth(Body):
    type: Literal["mcp_oauth"]
    mcp_server_url: Url
    access_token: Secret
    expires_at: str | None = None
    refresh: Refresh | None = None


class EnvironmentVariable(Body):
    type: Literal["environment_variable"]
    secret_name: Name
    secret_value: Secret
    networking: Networking
    injection_location: Injection | None = None


class EndpointSecretChange(Body):
    type: Literal["client_secret_basic", "client_secret_post"]
    client_secret: Secret | None = None


class RefreshChange(Body):
    refresh_token: Secret | None = None
    scope: str | None = None
    token_endpoint_auth: EndpointSecretChange | None = None


class StaticBearerChange(Body):
    type: Literal["static_bearer"]
    token: Secret | None = None


class McpOauthChange(Body):
    type: Literal["mcp_oauth"]
    access_token: Secret | None = None
    expires_at: str | None = None
    refresh: RefreshChange | None = None


class EnvironmentVariableChange(Body):
    type: Literal["environment_variable"]
    secret_value: Secret | None = None
    networking: Networking | None = None
    injection_location: InjectionChange | None = None


class VaultCreate(Body):
    display_name: Name
    metadata: Metadata | None = None


class VaultUpdate(Body):
    display_name: Name | None = None
    metadata: MetadataPatch | None = None

    @field_validator("display_name", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # A vault always has a name: null is refused here, not by the column's NOT NULL (a 500).
        if value is None:
            raise ValueError("may be left out, but not null")
        return value


class CredentialCreate(Body):
    auth: Annotated[McpOauth | StaticBearer | EnvironmentVariable, Field(discriminator="type")]
    display_name: Name | None = None
    metadata: Metadata | None = None


class CredentialUpdate(Body):
    auth: (
        Annotated[
            McpOauthChange | StaticBearerChange | EnvironmentVariableChange, Field(discriminator="type")
        ]
        | None
    ) = None
    display_name: Name | None = None
    metadata: MetadataPatch | None = None


class ListQuery(Page):
    limit: int = Field(20, ge=1, le=100)
    include_archived: bool = False


# -- responses


class Vault(Schema):
    id: str
    type: Literal["vault"]
    display_name: str
    metadata: dict[str, str]
    created_at: Timestamp
    updated_at: Timestamp
    archived_at: Timestamp | None


class VaultList(Schema):
    data: list[Vault]
    next_page: str | None


class Credential(Schema):
    id: str
    type: Literal["vault_credential"]
    vault_id: str
    display_name: str | None
    metadata: dict[str, str]
    auth: dict[str, Any] = Field(..., description="As created, without its secret fields.")
    created_at: Timestamp
    updated_at: Timestamp
    archived_at: Timestamp | None


class CredentialList(Schema):
    data: list[Credential]
    next_page: str | None


class Validation(Schema):
    type: Literal["vault_credential_validation"]
    credential_id: str
    vault_id: str
    status: Literal["valid", "invalid", "unknown"]
    has_refresh_token: bool
    validated_at: Timestamp
    mcp_probe: dict[str, Any] | None = None
    refresh: dict[str, Any] | None = None


def _given_auth(body: Body) -> dict[str, Any]:
    """The request's fields as the services take them: the auth union as plain data."""
    given = body.given()
    if getattr(body, "auth", None) is not None:
        given["auth"] = body.auth.model_dump(exclude_unset=True)  # type: ignore[attr-defined]
        given["auth"]["type"] = body.auth.type  # type: ignore[attr-defined]
    return given


@router.post("/vaults", response={200: Vault, **ERRORS})
def vaults_create(request: HttpRequest, body: VaultCreate) -> dict[str, Any]:
    return vault_json(vault_create(workspace_id=caller(request).workspace_id, **body.given()))


@router.get("/vaults", response={200: VaultList, **ERRORS})
def vaults_list(request: HttpRequest, query: Query[ListQuery]) -> dict[str, Any]:
    vaults = VaultRow.objects.live().filter(workspace_id=caller(request).workspace_id)
    if not query.include_archived:
        vaults = vaults.filter(archived_at__isnull=True)
    page = keyset_page(vaults, query.page, order="desc", limit=query.limit)
    return {"data": [vault_json(v) for v in page["rows"]], "next_page": page["next_page"]}


@router.get("/vaults/{vault_id}", response={200: Vault, **ERRORS})
def vaults_retrieve(request: HttpRequest, vault_id: str) -> dict[str, Any]:
    return vault_json(get_vault(vault_id))


@router.post("/vaults/{vault_id}", response={200: Vault, **ERRORS})
def vaults_update(request: HttpRequest, vault_id: str, body: VaultUpdate) -> dict[str, Any]:
    return vault_json(vault_update(vault_id, **body.given()))


@router.delete("/vaults/{vault_id}", response={200: Deleted, **ERRORS})
def vaults_delete(request: HttpRequest, vault_id: str) -> dict[str, Any]:
    return vault_delete(vault_id, actor=actor_of(request))


@router.post("/vaults/{vault_id}/archive", response={200: Vault, **ERRORS})
def vaults_archive(request: HttpRequest, vault_id: str) -> dict[str, Any]:
    return vault_json(vault_archive(vault_id, actor=actor_of(request)))


@router.post("/vaults/{vault_id}/credentials", response={200: Credential, **ERRORS}, tags=["credentials"])
def credentials_create(request: HttpRequest, vault_id: str, body: CredentialCreate) -> dict[str, Any]:
    return credential_json(credential_create(vault_id, actor=actor_of(request), **_given_auth(body)))


@router.get("/vaults/{vault_id}/credentials", response={200: CredentialList, **ERRORS}, tags=["credentials"])
def credentials_list(request: HttpRequest, vault_id: str, query: Query[ListQuery]) -> dict[str, Any]:
    get_vault(vault_id)
    credentials = CredentialRow.objects.live().filter(vault_id=vault_id)
    if not query.include_archived:
        credentials = credentials.filter(archived_at__isnull=True)
    page = keyset_page(credentials, query.page, order="desc", limit=query.limit)
    return {"data": [credential_json(c) for c in page["rows"]], "next_page": page["next_page"]}


@router.get(
    "/vaults/{vault_id}/credentials/{credential_id}",
    response={200: Credential, **ERRORS},
    tags=["credentials"],
)
def credentials_retrieve(request: HttpRequest, vault_id: str, credential_id: str) -> dict[str, Any]:
    return credential_json(get_credential(vault_id, credential_id))


@router.post(
    "/vaults/{vault_id}/credentials/{credential_id}",
    response={200: Credential, **ERRORS},
    tags=["credentials"],
)
def credentials_update(
    request: HttpRequest, vault_id: str, credential_id: str, body: CredentialUpdate
) -> dict[str, Any]:
    return credential_json(
        credential_update(vault_id, credential_id, actor=actor_of(request), **_given_auth(body))
    )


@router.delete(
    "/vaults/{vault_id}/credentials/{credential_id}", response={200: Deleted, **ERRORS}, tags=["credentials"]
)
def credentials_delete(request: HttpRequest, vault_id: str, credential_id: str) -> dict[str, Any]:
    return credential_delete(vault_id, credential_id, actor=actor_of(request))


@router.post(
    "/vaults/{vault_id}/credentials/{credential_id}/archive",
    response={200: Credential, **ERRORS},
    tags=["credentials"],
)
def credentials_archive(request: HttpRequest, vault_id: str, credential_id: str) -> dict[str, Any]:
    return credential_json(credential_archive(vault_id, credential_id, actor=actor_of(request)))


@router.post(
    "/vaults/{vault_id}/credentials/{credential_id}/mcp_oauth_validate",
    response={200: Validation, **ERRORS},
    tags=["credentials"],
)
def credentials_validate(request: HttpRequest, vault_id: str, credential_id: str) -> dict[str, Any]:
    """Probe the credential's MCP server through the egress proxy (which alone holds the secret)."""
    return credential_validate(get_credential(vault_id, credential_id), actor=actor_of(request))
