"""What dispatch adds to a task's admin page: beside each assistant turn of the conversation,
the prompts it was sent; and, folded, the list of every prompt report (`backend.dispatch.admin`
adds it).

Beside a turn (`sent_prompts`), one line per prompt a dispatch built for it: a full prompt or a
resume, whether the worker sent it, why (`resume_reason`, `retry_reason`) and its tokens against
the budget it was built under; the rest of the report folded. The list has one row per dispatch
of the task's turns, newest first: which policy version built it, what it included, omitted and
cut, its size and build time. Counts only; a prompt's text is never stored (see the preview page
to see what a dispatch would send now, and a report's page for the prompt it rebuilds).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.dispatch.models import PromptReport
from backend.prompting.inputs import Role
from backend.tasks.admin_conversation import register_turn_notes
from backend.tasks.models import Subtask, Task

# The report fields a turn's note reads (a report row is wide: its snapshots stay unread).
NOTE_FIELDS = (
    "id",
    "subtask_id",
    "attempt",
    "worker_id",
    "kind",
    "sent",
    "resume_reason",
    "retry_reason",
    "policy_source",
    "policy_version",
    "policy__task_type",
    "messages_included",
    "messages_omitted",
    "truncated_count",
    "tokens",
    "token_budget",
    "model_tokens",
    "effective_max_tokens",
    "tokens_estimated",
    "chars",
    "created_at",
)


def report_policy_label(report: PromptReport) -> str:
    """The policy a report was built with: "code v3", "default v1", or "settings"."""
    if report.policy_source != "row":
        return report.policy_source
    if report.policy is None:
        return f"deleted row v{report.policy_version}"
    return f"{report.policy.task_type or 'default'} v{report.policy_version}"


def _sent_label(report: PromptReport) -> str:
    prompt = "resume prompt" if report.kind == "resume" else "full prompt"
    if report.sent is None:
        return f"{prompt} offered"  # the worker has not reported which prompt it ran yet
    return f"{prompt} sent" if report.sent else f"{prompt} not sent"


def _tokens_against_budget(report: PromptReport) -> str:
    """The prompt's tokens against its budget: in the model's tokens when its window is known."""
    if report.effective_max_tokens is not None and report.model_tokens is not None:
        estimated = "~" if report.tokens_estimated else ""
        return f"{estimated}{report.model_tokens} of {report.effective_max_tokens} model tokens"
    if report.token_budget is not None:
        return f"{report.tokens} of {report.token_budget} tokens"
    return f"{report.tokens} tokens (no token cap)"


def _why(report: PromptReport) -> str:
    return ", ".join(reason for reason in (report.resume_reason, report.retry_reason) if reason)


def _sent_prompt_note(report: PromptReport) -> SafeString:
    url = reverse("admin:dispatch_promptreport_change", args=[report.pk])
    return format_html(
        '<div class="sent-prompt kind-{}"><strong>{}</strong> · {}{}'
        "<details><summary>attempt {}, prompt report {}</summary>"
        "{} chars; {} messages included, {} omitted, {} cut; policy {}; worker {}; {}"
        "</details></div>",
        report.kind,
        _sent_label(report),
        _tokens_against_budget(report),
        format_html(" · why: {}", _why(report)) if _why(report) else "",
        report.attempt,
        format_html('<a href="{}">{}</a>', url, report.pk),
        report.chars,
        report.messages_included,
        report.messages_omitted,
        report.truncated_count,
        report_policy_label(report),
        report.worker_id,
        report.created_at.strftime("%Y-%m-%d %H:%M:%S"),
    )


def sent_prompts(task: Task, turns: Sequence[Subtask]) -> dict[int, SafeString]:
    """Beside each assistant turn of `task`'s conversation, the prompts it was sent (one
    query for the whole task, oldest first)."""
    assistant = {turn.pk for turn in turns if turn.role == Role.ASSISTANT}
    reports: dict[int, list[PromptReport]] = {}
    for report in (
        PromptReport.objects.filter(task_id=task.pk)
        .select_related("policy")
        .only(*NOTE_FIELDS)
        .order_by("created_at", "id")
    ):
        if report.subtask_id in assistant:
            reports.setdefault(report.subtask_id, []).append(report)
    return {
        subtask_id: format_html(
            '<div class="sent-prompts"><strong>Sent</strong>{}</div>',
            format_html_join("", "{}", ((_sent_prompt_note(report),) for report in sent)),
        )
        for subtask_id, sent in reports.items()
    }


register_turn_notes(sent_prompts)


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
    classes = ["collapse"]  # the conversation shows each turn's prompts beside it

    @admin.display(description="Policy")
    def policy_label(self, report: PromptReport) -> str:
        return report_policy_label(report)

    def get_queryset(self, request: HttpRequest) -> QuerySet[PromptReport]:
        # The subtask and policy columns would otherwise cost one query per row.
        return super().get_queryset(request).select_related("subtask", "policy")
