"""Django admin for tasks and their turns: browse, filter and search; turns are read-only.

A task's page also lists its prompt reports and artifacts, and links to the prompt preview of
its next dispatch (the button comes from `admin/dispatch/task_change_form.html`).
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from backend.artifacts.admin_inlines import ArtifactInline
from backend.dispatch.admin_inlines import PromptReportInline
from backend.tasks.models import Subtask, Task


class SubtaskInline(admin.TabularInline):
    model = Subtask
    extra = 0
    can_delete = False
    ordering = ["message_id"]
    fields = [
        "message_id",
        "parent_message_id",
        "role",
        "status",
        "sender",
        "bot",
        "executor",
        "prompt",
        "result",
        "error",
        "attempts",
        "finished_at",
    ]
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "task_type", "status", "is_group_chat", "owner", "created_at"]
    list_filter = ["status", "task_type", "is_group_chat"]
    search_fields = ["title"]
    list_select_related = ["owner"]
    readonly_fields = ["next_message_id", "created_at", "updated_at"]
    inlines = [SubtaskInline, PromptReportInline, ArtifactInline]
    change_form_template = "admin/dispatch/task_change_form.html"


@admin.register(Subtask)
class SubtaskAdmin(admin.ModelAdmin):
    list_display = ["id", "task", "message_id", "role", "status", "bot", "executor", "created_at"]
    list_filter = ["status", "role", "executor"]
    search_fields = ["task__title"]
    list_select_related = ["task"]
    ordering = ["-created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Subtask | None = None) -> bool:
        return False
