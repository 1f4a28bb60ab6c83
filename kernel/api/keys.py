"""/v1/api_keys (Workbench's own): a workspace's API keys, as the keys page and `createapikey` make them.

Only an API key reaches these routes (an environment key or a sessions token is refused at the edge), and only
its own workspace's keys: a full key acts as the workspace's admin, a read-only one may list them. The raw key is
in the create answer only.
"""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from kernel.api.edge import caller
from kernel.api.pagination import keyset_page
from kernel.api.schemas import ERRORS, Body, Empty, Page, Timestamp
from kernel.keys import api_key_create, api_key_revoke
from kernel.models import ApiKey as ApiKeyRow

router = Router(tags=["api keys"])


class ApiKeyCreate(Body):
    name: str = Field(..., min_length=1, max_length=200, description="What it is for, e.g. 'ci'.")
    read_only: bool = Field(False, description="Refused every write (403).")


class ApiKey(Schema):
    id: str
    type: Literal["api_key"]
    name: str
    prefix: str
    read_only: bool
    workspace_id: str
    created_at: Timestamp
    last_used_at: Timestamp | None
    revoked_at: Timestamp | None


class ApiKeyCreated(ApiKey):
    key: str = Field(..., description="The key itself: shown in this answer only.")


class ApiKeyList(Schema):
    data: list[ApiKey]
    next_page: str | None


class ApiKeysQuery(Page):
    limit: int = Field(20, ge=1, le=100)


def _time(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def api_key_json(key: ApiKeyRow) -> dict[str, Any]:
    return {
        "id": str(key.pk),
        "type": "api_key",
        "name": key.name,
        "prefix": key.prefix,
        "read_only": key.read_only,
        "workspace_id": key.workspace_id,
        "created_at": _time(key.created_at),
        "last_used_at": _time(key.last_used_at),
        "revoked_at": _time(key.revoked_at),
    }


@router.post("/api_keys", response={200: ApiKeyCreated, **ERRORS})
def api_keys_create(request: HttpRequest, body: ApiKeyCreate) -> dict[str, Any]:
    here = caller(request)
    key, raw = api_key_create(
        name=body.name, read_only=body.read_only, workspace_id=here.workspace_id, actor=here.actor
    )
    return {**api_key_json(key), "key": raw}


@router.get("/api_keys", response={200: ApiKeyList, **ERRORS})
def api_keys_list(request: HttpRequest, query: Query[ApiKeysQuery]) -> dict[str, Any]:
    keys = ApiKeyRow.objects.filter(workspace_id=caller(request).workspace_id)
    page = keyset_page(keys, query.page, order="desc", limit=query.limit)
    return {"data": [api_key_json(k) for k in page["rows"]], "next_page": page["next_page"]}


@router.post("/api_keys/{api_key_id}/revoke", response={200: ApiKey, **ERRORS})
def api_keys_revoke(request: HttpRequest, api_key_id: str, body: Empty | None = None) -> dict[str, Any]:
    """Revoke a key of the workspace (itself too): its next request is refused."""
    here = caller(request)
    return api_key_json(api_key_revoke(int(api_key_id), workspace_id=here.workspace_id, actor=here.actor))
