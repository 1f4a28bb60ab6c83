from django.contrib import admin

from kernel.models import ApiKey, AuditEntry, Membership, Workspace
from kernel.tenancy import audit


def _actor(request):
    return f"user {request.user.get_username()}"


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "workspace", "read_only", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request):  # keys are made by createapikey or the API keys page
        return False

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if "revoked_at" in form.changed_data:
            action = "api_key.revoked" if obj.revoked_at else "api_key.restored"
            audit(obj.workspace_id, _actor(request), action, f"{obj.name} ({obj.prefix}…)")


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "id", "created_at")
    readonly_fields = ("id", "created_at")
    inlines = [MembershipInline]

    def save_formset(self, request, form, formset, change):
        """Members added, changed or removed go to the audit log as the admin's."""
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        members = formset.save(commit=False)
        for member in formset.deleted_objects:
            audit(member.workspace_id, _actor(request), "member.removed", member.user.get_username())
            member.delete()
        for member in members:
            added = member.pk is None
            member.save()
            action = "member.added" if added else "member.role_changed"
            audit(member.workspace_id, _actor(request), action, member.user.get_username(), role=member.role)
        formset.save_m2m()
        return None


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
