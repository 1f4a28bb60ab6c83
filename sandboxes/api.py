"""/v1/environments."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from sandboxes.environments import (
    environment_archive,
    environment_create,
    environment_delete,
    environment_json,
    environment_update,
    get_environment,
)
from sandboxes.models import Environment
from workbench.api.endpoint import endpoint
from workbench.api.pagination import keyset_page
from workbench.api.validation import query_bool, query_int


def environments_create(request: HttpRequest) -> dict[str, Any]:
    return environment_json(environment_create(request.json))  # type: ignore[attr-defined]


def environments_list(request: HttpRequest) -> dict[str, Any]:
    limit = query_int(request.GET, "limit", default=20, minimum=1, maximum=100)
    environments = Environment.objects.filter(deleted_at__isnull=True)
    if not query_bool(request.GET, "include_archived"):
        environments = environments.filter(archived_at__isnull=True)
    page = keyset_page(environments, request.GET, order="desc", limit=limit)
    return {"data": [environment_json(e) for e in page["rows"]], "next_page": page["next_page"]}


def environments_retrieve(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(get_environment(environment_id))


def environments_update(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(environment_update(environment_id, request.json))  # type: ignore[attr-defined]


def environments_delete(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_delete(environment_id)


def environments_archive(request: HttpRequest, environment_id: str) -> dict[str, Any]:
    return environment_json(environment_archive(environment_id))


collection = endpoint(GET=environments_list, POST=environments_create)
item = endpoint(GET=environments_retrieve, POST=environments_update, DELETE=environments_delete)
archive = endpoint(POST=environments_archive)
