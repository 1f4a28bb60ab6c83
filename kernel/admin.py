from django.contrib import admin

from kernel.models import ApiKey, AuditEntry, Membership, Workspace


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "workspace", "read_only", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request):  # keys are made by createapikey or the API keys page
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "id", "created_at")
    readonly_fields = ("id", "created_at")
    inlines = [MembershipInline]


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """The audit log, read-only: nobody edits or removes what happened."""

    list_display = ("at", "workspace", "actor", "action", "target")
    list_filter = ("action", "workspace")
    search_fields = ("actor", "target")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
