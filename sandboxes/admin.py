from django.contrib import admin

from sandboxes.models import Environment, EnvironmentKey, WorkItem


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "scope", "created_at", "archived_at", "deleted_at")


@admin.register(WorkItem)
class WorkItemAdmin(admin.ModelAdmin):
    """The self-hosted work queue, to look at: its state changes through the /v1 routes and the sweep."""

    list_display = ("id", "environment", "session", "kind", "state", "worker_id", "created_at", "lost_count")
    list_filter = ("state", "kind")
    search_fields = ("id", "session__id", "worker_id")
    exclude = ("token_hash", "offered_token_hashes", "retired_token_hashes")
    readonly_fields = (
        "id",
        "environment",
        "session",
        "kind",
        "state",
        "created_at",
        "queued_at",
        "polled_at",
        "polled_by",
        "acknowledged_at",
        "started_at",
        "latest_heartbeat",
        "latest_heartbeat_at",
        "ttl_seconds",
        "lease_expires_at",
        "worker_id",
        "stop_requested_at",
        "stopped_at",
        "lost_count",
    )


@admin.register(EnvironmentKey)
class EnvironmentKeyAdmin(admin.ModelAdmin):
    """Keys are created with `manage.py environment_key create` or POST /v1/environments/{id}/keys (the key
    is shown once there); here they can be looked at and revoked (set revoked_at)."""

    list_display = ("id", "environment", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    exclude = ("key_hash",)
    readonly_fields = ("id", "environment", "prefix", "created_at", "last_used_at")

    def has_add_permission(self, request: object) -> bool:
        return False
