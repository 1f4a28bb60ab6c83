from django.contrib import admin

from kernel.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request):  # keys are made by createapikey or the API keys page
        return False
