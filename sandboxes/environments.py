"""Environments: the templates sandboxes are provisioned from (§5.1)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from sandboxes.models import Environment
from workbench.api.errors import InvalidRequest, NotFound
from workbench.api.validation import expect, metadata, no_unknown_fields, patch_metadata, text

PACKAGE_MANAGERS = ("apt", "cargo", "gem", "go", "npm", "pip")


def _networking(value: Any) -> dict[str, Any]:
    expect(value, dict, "'config.networking'")
    kind = value.get("type")
    if kind == "unrestricted":
        no_unknown_fields(value, ("type",), "config.networking")
        return {"type": "unrestricted"}
    if kind == "limited":
        no_unknown_fields(value, ("type", "allowed_hosts", "allow_mcp_servers", "allow_package_managers"),
                          "config.networking")
        hosts = expect(value.get("allowed_hosts", []), list, "'config.networking.allowed_hosts'")
        for host in hosts:
            expect(host, str, "'config.networking.allowed_hosts[]'")
        return {
            "type": "limited",
            "allowed_hosts": hosts,
            "allow_mcp_servers": expect(value.get("allow_mcp_servers", False), bool, "'allow_mcp_servers'"),
            "allow_package_managers": expect(value.get("allow_package_managers", False), bool,
                                             "'allow_package_managers'"),
        }
    raise InvalidRequest(f"'config.networking.type' must be 'unrestricted' or 'limited', not {kind!r}.")


def _packages(value: Any) -> dict[str, Any]:
    expect(value, dict, "'config.packages'")
    no_unknown_fields(value, ("type", *PACKAGE_MANAGERS), "config.packages")
    packages: dict[str, Any] = {"type": "packages"}
    for manager in PACKAGE_MANAGERS:
        names = expect(value.get(manager, []), list, f"'config.packages.{manager}'")
        for name in names:
            expect(name, str, f"'config.packages.{manager}[]'")
        packages[manager] = names
    return packages


SANDBOX_DEFAULTS: dict[str, Any] = {"provider": None, "image": None, "cpus": 1.0, "memory_mb": 512, "pids": 256,
                                    "warm_pool": 0, "idle_ttl_seconds": 3600, "provisioning": None}


def _sandbox(value: Any) -> dict[str, Any]:
    """Workbench's extension: what a sandbox of this environment runs on and with what limits."""
    from sandboxes.providers import PROVIDERS

    expect(value, dict, "'config.sandbox'")
    no_unknown_fields(value, tuple(SANDBOX_DEFAULTS), "config.sandbox")
    sandbox = {**SANDBOX_DEFAULTS, **value}
    if sandbox["provider"] is not None and sandbox["provider"] not in PROVIDERS:
        raise InvalidRequest(f"'config.sandbox.provider' must be one of {', '.join(PROVIDERS)}, "
                             f"not {sandbox['provider']!r}.")
    expect(sandbox["image"], str, "'config.sandbox.image'", nullable=True)
    if sandbox["provisioning"] not in (None, "lazy", "eager"):
        raise InvalidRequest("'config.sandbox.provisioning' must be 'lazy' or 'eager' (coupled).")
    limits = {"cpus": (0.1, 64.0), "memory_mb": (64, 65536), "pids": (16, 32768), "warm_pool": (0, 50),
              "idle_ttl_seconds": (60, 7 * 86400)}
    for key, (low, high) in limits.items():
        number = sandbox[key]
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not low <= number <= high:
            raise InvalidRequest(f"'config.sandbox.{key}' must be a number from {low} to {high}, not {number!r}.")
        if key != "cpus" and not isinstance(number, int):
            raise InvalidRequest(f"'config.sandbox.{key}' must be a whole number.")
    return sandbox


def normalise_config(value: Any) -> dict[str, Any]:
    if value is None:
        value = {"type": "cloud"}
    expect(value, dict, "'config'")
    kind = value.get("type")
    if kind == "self_hosted":
        no_unknown_fields(value, ("type",), "config")
        return {"type": "self_hosted"}
    if kind != "cloud":
        raise InvalidRequest(f"'config.type' must be 'cloud' or 'self_hosted', not {kind!r}.")
    no_unknown_fields(value, ("type", "networking", "packages", "sandbox"), "config")
    networking = _networking(value.get("networking", {"type": "unrestricted"}))
    packages = _packages(value.get("packages", {}))
    if networking["type"] == "limited" and any(packages[m] for m in PACKAGE_MANAGERS) and not networking[
            "allow_package_managers"]:
        raise InvalidRequest("'config.packages' needs 'config.networking.allow_package_managers: true' "
                             "when networking is limited.")
    return {"type": "cloud", "networking": networking, "packages": packages,
            "sandbox": _sandbox(value.get("sandbox", {}))}


def environment_json(environment: Environment) -> dict[str, Any]:
    return {
        "id": environment.id,
        "type": "environment",
        "name": environment.name,
        "description": environment.description,
        "metadata": environment.metadata,
        "scope": environment.scope,
        "config": environment.config,
        "created_at": environment.created_at.isoformat(),
        "updated_at": environment.updated_at.isoformat(),
        "archived_at": environment.archived_at.isoformat() if environment.archived_at else None,
    }


def get_environment(environment_id: str) -> Environment:
    environment = Environment.objects.filter(id=environment_id, deleted_at__isnull=True).first()
    if environment is None:
        raise NotFound(f"No environment with id {environment_id!r}.", code="environment_not_found")
    return environment


def _scope(body: dict[str, Any]) -> Any:
    scope = body.get("scope", "organization")
    if scope not in ("organization", "account"):
        raise InvalidRequest(f"'scope' must be 'organization' or 'account', not {scope!r}.")
    return scope


def _refill_on_commit(environment: Environment) -> None:
    from sandboxes.pool import _queue_refill, pool_size

    if pool_size(environment) > 0:
        transaction.on_commit(lambda: _queue_refill(environment.id))


def environment_create(body: dict[str, Any]) -> Environment:
    no_unknown_fields(body, ("name", "config", "description", "metadata", "scope"), "environment")
    environment = Environment.objects.create(
        name=text(body, "name", required=True, min_length=1, max_length=255),
        description=text(body, "description", nullable=True, default=None),
        metadata=dict(metadata(body.get("metadata", {}))),
        scope=_scope(body),
        config=normalise_config(body.get("config")),
    )
    _refill_on_commit(environment)
    return environment


def environment_update(environment_id: str, body: dict[str, Any]) -> Environment:
    no_unknown_fields(body, ("name", "config", "description", "metadata", "scope"), "environment update")
    environment = get_environment(environment_id)
    if environment.archived_at is not None:
        raise InvalidRequest(f"Environment {environment_id} is archived and cannot be changed.",
                             code="environment_archived")
    if "config" in body:
        config = normalise_config(body["config"])
        if config["type"] != environment.config.get("type"):
            raise InvalidRequest(
                f"Environment {environment_id} is {environment.config.get('type')}; its config type cannot "
                f"change to {config['type']}. Create a new environment instead.", code="invalid_config_type_change")
        environment.config = config
    if "name" in body:
        environment.name = text(body, "name", min_length=1, max_length=255)
    if "description" in body:
        environment.description = text(body, "description", nullable=True)
    if "scope" in body:
        environment.scope = _scope(body)
    if "metadata" in body:
        environment.metadata = patch_metadata(environment.metadata, metadata(body["metadata"], patch=True))
    environment.save()
    _refill_on_commit(environment)
    return environment


def environment_archive(environment_id: str) -> Environment:
    environment = get_environment(environment_id)
    if environment.archived_at is None:
        environment.archived_at = timezone.now()
        environment.save(update_fields=["archived_at", "updated_at"])
    return environment


def environment_delete(environment_id: str) -> dict[str, str]:
    """Hidden from the API from now on; sessions that used it keep their history."""
    environment = get_environment(environment_id)
    environment.deleted_at = timezone.now()
    environment.save(update_fields=["deleted_at", "updated_at"])
    return {"id": environment.id, "type": "environment_deleted"}
