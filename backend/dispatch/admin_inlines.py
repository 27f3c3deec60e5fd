"""The read-only list of prompt reports on a task's admin page (`backend.dispatch.admin` adds it).

One row per dispatch of the task's turns, newest first: which policy version built it, what it
included, omitted and cut, its size and build time. Counts only; a prompt's text is never stored
(see the preview page to see what a dispatch would send now).
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.dispatch.models import PromptReport
from backend.tasks.models import Task


def report_policy_label(report: PromptReport) -> str:
    """The policy a report was built with: "code v3", "default v1", or "settings"."""
    if report.policy_source != "row":
        return report.policy_source
    if report.policy is None:
        return f"deleted row v{report.policy_version}"
    return f"{report.policy.task_type or 'default'} v{report.policy_version}"


class PromptReportInline(ReadOnlyAdminMixin, admin.TabularInline[PromptReport, Task]):
    model = PromptReport
    fk_name = "task"
    extra = 0
    ordering = ["-created_at", "-id"]
    # Every column is shown and none is editable (a tuple suits both attributes' types).
    fields = readonly_fields = (
        "created_at",
        "subtask",
        "attempt",
        "worker_id",
        "kind",
        "sent",
        "resume_reason",
        "retry_reason",
        "policy_label",
        "history_enabled",
        "context_passing",
        "messages_included",
        "messages_omitted",
        "truncated_count",
        "chars",
        "tokens",
        "token_budget",
        "build_ms",
    )
    show_change_link = True
    verbose_name_plural = "prompt reports (one per dispatch)"

    @admin.display(description="Policy")
    def policy_label(self, report: PromptReport) -> str:
        return report_policy_label(report)

    def get_queryset(self, request: HttpRequest) -> QuerySet[PromptReport]:
        # The subtask and policy columns would otherwise cost one query per row.
        return super().get_queryset(request).select_related("subtask", "policy")
