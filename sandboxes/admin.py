from django.contrib import admin

from sandboxes.models import Environment


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "scope", "created_at", "archived_at", "deleted_at")
