import json

from django.contrib import admin

from sessions.models import Event, Session


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "agent", "environment", "next_seq", "lease_epoch", "updated_at")
    list_filter = ("status",)
    search_fields = ("id", "title")
    # Resources are shown without their repository tokens, which are write-only.
    exclude = ("resources",)
    readonly_fields = ["shown_resources" if f.name == "resources" else f.name for f in Session._meta.fields]

    @admin.display(description="resources")
    def shown_resources(self, obj: Session) -> str:
        return json.dumps(obj.shown_resources(), indent=2)


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """Read-only: the log is append-only."""

    list_display = ("session", "seq", "type", "processed_at", "lease_epoch")
    list_filter = ("type",)
    search_fields = ("session__id", "uid")

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False
