"""Environments: the templates sandboxes are provisioned from (§5.1)."""

from __future__ import annotations

import math
from typing import Any, Literal, TypedDict, Unpack

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from kernel.api.validation import check_metadata, expect, no_unknown_fields, patch_metadata
from kernel.errors import Closed, Conflict, Invalid, NotFound
from kernel.models import DEFAULT_WORKSPACE_ID
from sandboxes.models import Environment
from sandboxes.pool import pool_size, queue_refill
from sandboxes.providers import PROVIDERS
from sandboxes.repositories import checked_repository

PACKAGE_MANAGERS = ("apt", "cargo", "gem", "go", "npm", "pip")


def _networking(value: Any) -> dict[str, Any]:
    expect(value, dict, "'config.networking'")
    kind = value.get("type")
    if kind == "unrestricted":
        no_unknown_fields(value, ("type",), "config.networking")
        return {"type": "unrestricted"}
    if kind == "limited":
        no_unknown_fields(
            value,
            ("type", "allowed_hosts", "allow_mcp_servers", "allow_package_managers"),
            "config.networking",
        )
        hosts = expect(value.get("allowed_hosts", []), list, "'config.networking.allowed_hosts'")
        for host in hosts:
            expect(host, str, "'config.networking.allowed_hosts[]'")
        return {
            "type": "limited",
            "allowed_hosts": hosts,
            "allow_mcp_servers": expect(value.get("allow_mcp_servers", False), bool, "'allow_mcp_servers'"),
            "allow_package_managers": expect(
                value.get("allow_package_managers", False), bool, "'allow_package_managers'"
            ),
        }
    raise Invalid(f"'config.networking.type' must be 'unrestricted' or 'limited', not {kind!r}.")


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


SANDBOX_DEFAULTS: dict[str, Any] = {
    "provider": None,
    "image": None,
    "cpus": 1.0,
    "memory_mb": 512,
    "pids": 256,
    "disk_mb": None,
    "warm_pool": 0,
    "max_sandboxes": None,
    "idle_ttl_seconds": 3600,
    "provisioning": None,
    "speculative": None,
    "pool_repository": None,
}
# Numbers where null means the installation's default (SANDBOX_DISK_MB, SANDBOX_MAX_PER_SESSION).
_NULLABLE = ("disk_mb", "max_sandboxes")


def _bounds() -> dict[str, tuple[float, float, str | None]]:
    """Each number of config.sandbox: (least, most, the setting that sets the most)."""
    return {
        "cpus": (0.1, settings.SANDBOX_MAX_CPUS, "SANDBOX_MAX_CPUS"),
        "memory_mb": (64, settings.SANDBOX_MAX_MEMORY_MB, "SANDBOX_MAX_MEMORY_MB"),
        "pids": (16, settings.SANDBOX_MAX_PIDS, "SANDBOX_MAX_PIDS"),
        "disk_mb": (64, settings.SANDBOX_MAX_DISK_MB, "SANDBOX_MAX_DISK_MB"),
        "warm_pool": (0, settings.SANDBOX_MAX_WARM_POOL, "SANDBOX_MAX_WARM_POOL"),
        "max_sandboxes": (1, settings.SANDBOX_MAX_PER_SESSION, "SANDBOX_MAX_PER_SESSION"),
        "idle_ttl_seconds": (60, 7 * 86400, None),
    }


def _shown(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _number(key: str, number: Any, low: float, high: float, setting: str | None) -> None:
    if number is None and key in _NULLABLE:
        return
    whole = key != "cpus"
    kind = (int,) if whole else (int, float)
    if (
        isinstance(number, bool)
        or not isinstance(number, kind)
        or not math.isfinite(number)
        or not (low <= number <= high)
    ):
        maximum = f" (this installation's maximum, {setting})" if setting else ""
        raise Invalid(
            f"'config.sandbox.{key}' must be {'a whole number' if whole else 'a number'} from "
            f"{_shown(low)} to {_shown(high)}{maximum}, not {number!r}."
        )


def _sandbox(value: Any) -> dict[str, Any]:
    """Workbench's extension: what a sandbox of this environment runs on and with what limits.

    Only what the body gives is held to the maxima: a default over a maximum an operator lowered is cut to
    it at provisioning (`sandboxes.hands.resources_for`), as a stored value is.
    """
    expect(value, dict, "'config.sandbox'")
    no_unknown_fields(value, tuple(SANDBOX_DEFAULTS), "config.sandbox")
    sandbox = {**SANDBOX_DEFAULTS, **value}
    if sandbox["provider"] is not None and sandbox["provider"] not in PROVIDERS:
        raise Invalid(
            f"'config.sandbox.provider' must be one of {', '.join(PROVIDERS)}, not {sandbox['provider']!r}."
        )
    expect(sandbox["image"], str, "'config.sandbox.image'", nullable=True)
    if sandbox["provisioning"] not in (None, "lazy", "eager"):
        raise Invalid("'config.sandbox.provisioning' must be 'lazy' or 'eager' (coupled).")
    if sandbox["speculative"] not in (None, "auto", "always", "never"):
        raise Invalid("'config.sandbox.speculative' must be 'auto', 'always' or 'never'.")
    for key, (low, high, setting) in _bounds().items():
        if key in value:
            _number(key, value[key], low, high, setting)
    if sandbox["pool_repository"] is not None:
        sandbox["pool_repository"] = _pool_repository(sandbox["pool_repository"])
    return sandbox


def _pool_repository(value: Any) -> dict[str, Any]:
    """The repository the warm pool's sandboxes come with checked out (sandboxes/repositories.py): a
    github_repository resource's url, mount_path and checkout. No token: the pool holds only what a session
    already fetched as itself, and a session keeps it only once it proved its own access."""
    where = "config.sandbox.pool_repository"
    expect(value, dict, f"'{where}'")
    no_unknown_fields(value, ("url", "mount_path", "checkout"), where)
    return checked_repository(value, where)


def normalise_config(value: Any) -> dict[str, Any]:
    if value is None:
        value = {"type": "cloud"}
    expect(value, dict, "'config'")
    kind = value.get("type")
    if kind == "self_hosted":
        no_unknown_fields(value, ("type",), "config")
        return {"type": "self_hosted"}
    if kind != "cloud":
        raise Invalid(f"'config.type' must be 'cloud' or 'self_hosted', not {kind!r}.")
    no_unknown_fields(value, ("type", "networking", "packages", "sandbox"), "config")
    networking = _networking(value.get("networking", {"type": "unrestricted"}))
    packages = _packages(value.get("packages", {}))
    if (
        networking["type"] == "limited"
        and any(packages[m] for m in PACKAGE_MANAGERS)
        and not networking["allow_package_managers"]
    ):
        raise Invalid(
            "'config.packages' needs 'config.networking.allow_package_managers: true' "
            "when networking is limited."
        )
    return {
        "type": "cloud",
        "networking": networking,
        "packages": packages,
        "sandbox": _sandbox(value.get("sandbox", {})),
    }


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


class EnvironmentNotFound(NotFound):
    def __init__(self, environment_id: str):
        super().__init__("environment", environment_id, code="environment_not_found")


def get_environment(environment_id: str) -> Environment:
    environment = Environment.objects.live().filter(id=environment_id).first()
    if environment is None:
        raise EnvironmentNotFound(environment_id)
    return environment


def _refill_on_commit(environment: Environment) -> None:
    if pool_size(environment) > 0:
        transaction.on_commit(lambda: queue_refill(environment.id))


class NameTaken(Conflict):
    """Environment names are unique: the hosted service answers a clash with a 409."""


def _save(environment: Environment, **options: Any) -> None:
    """Save, answering a name another live environment holds with a 409.

    The partial unique index on live names decides, not a look-up first, so two requests racing for one
    name cannot both get it. Deleted environments free their names; archived ones keep them.
    """
    try:
        with transaction.atomic():
            environment.save(**options)
    except IntegrityError:
        holder = (
            Environment.objects.live()
            .filter(workspace_id=environment.workspace_id, name=environment.name)
            .exclude(id=environment.id)
            .first()
        )
        if holder is None:
            raise
        state = "an archived environment" if holder.archived_at else "an environment"
        raise NameTaken(
            f"The name {environment.name!r} is taken by {state} ({holder.id}); environment names "
            f"are unique in a workspace. Choose another name, or delete {holder.id} to free this one.",
            code="environment_name_taken",
        ) from None


Scope = Literal["organization", "account"]


def environment_create(
    *,
    name: str,
    config: dict[str, Any] | None = None,
    description: str | None = None,
    metadata: dict[str, str] | None = None,
    scope: Scope = "organization",
    workspace_id: str = DEFAULT_WORKSPACE_ID,
) -> Environment:
    environment = Environment(
        workspace_id=workspace_id,
        name=name,
        description=description,
        metadata=dict(check_metadata(metadata or {})),
        scope=scope,
        config=normalise_config(config),
    )
    _save(environment, force_insert=True)
    _refill_on_commit(environment)
    return environment


class EnvironmentChanges(TypedDict, total=False):
    name: str
    config: dict[str, Any]
    description: str | None
    metadata: dict[str, str | None]
    scope: Scope


def environment_update(environment_id: str, **changes: Unpack[EnvironmentChanges]) -> Environment:
    """Change what was given; a config may not change its type (cloud or self-hosted)."""
    environment = get_environment(environment_id)
    if environment.archived_at is not None:
        raise Closed(
            f"Environment {environment_id} is archived and cannot be changed.", code="environment_archived"
        )
    if "config" in changes:
        config = normalise_config(changes["config"])
        if config["type"] != environment.config.get("type"):
            raise Invalid(
                f"Environment {environment_id} is {environment.config.get('type')}; its config type cannot "
                f"change to {config['type']}. Create a new environment instead.",
                code="invalid_config_type_change",
            )
        environment.config = config
    if "name" in changes:
        environment.name = changes["name"]
    if "description" in changes:
        environment.description = changes["description"]
    if "scope" in changes:
        environment.scope = changes["scope"]
    if "metadata" in changes:
        environment.metadata = patch_metadata(
            environment.metadata, check_metadata(changes["metadata"], patch=True)
        )
    _save(environment)
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
