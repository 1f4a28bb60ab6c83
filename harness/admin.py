from django.contrib import admin

from harness.models import Agent, AgentVersion


class AgentVersionInline(admin.TabularInline):
    model = AgentVersion
    extra = 0
    readonly_fields = ("version", "config", "created_at")
    can_delete = False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("id", "version", "created_at", "archived_at")
    inlines = [AgentVersionInline]
