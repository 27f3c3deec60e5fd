"""What dispatch adds to a task's admin page: beside each assistant turn of the conversation,
the prompts it was sent; and, folded, the list of every prompt report (`backend.dispatch.admin`
adds it).

A dispatch is one claim of a turn: its turn, attempt and worker (`Dispatch`). It built one
prompt, or two when it offered a resume (the resume prompt and the full one, a report each), and
both places show it as one dispatch with its prompts. Beside a turn (`sent_prompts`), each
dispatch (attempt and worker) over one line per prompt: a full prompt or a resume, whether the
worker sent it, why (`resume_reason`, `retry_reason`) and its tokens against the budget it was
built under; the rest of the report folded. The list has one entry per dispatch of the task's
turns, newest first, each with its prompts: which policy version built them, what they
included, omitted and cut, their size and build time. Counts only; a prompt's text is never
stored (see the preview page to see what a dispatch would send now, and a report's page for the
prompt it rebuilds).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.dispatch.models import PromptReport
from backend.prompting.inputs import Role
from backend.tasks.admin_conversation import UNREAD_COLUMNS, register_turn_notes
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


@dataclass(frozen=True)
class Dispatch:
    """One claim of a turn and the prompts it built, oldest first (a report each)."""

    subtask_id: int
    attempt: int
    worker_id: str
    reports: tuple[PromptReport, ...]

    @property
    def prompts(self) -> str:
        return "1 prompt" if len(self.reports) == 1 else f"{len(self.reports)} prompts"


def dispatches_of(reports: Iterable[PromptReport]) -> list[Dispatch]:
    """`reports` grouped by the dispatch that built them: its turn, attempt and worker. The
    dispatches keep the order of their first report; each one's reports are oldest first."""
    grouped: dict[tuple[int, int, str], list[PromptReport]] = {}
    for report in reports:
        grouped.setdefault((report.subtask_id, report.attempt, report.worker_id), []).append(report)
    return [
        Dispatch(
            subtask_id=subtask_id,
            attempt=attempt,
            worker_id=worker_id,
            reports=tuple(sorted(group, key=lambda report: (report.created_at, report.pk))),
        )
        for (subtask_id, attempt, worker_id), group in grouped.items()
    ]


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
        "<details><summary>prompt report {}</summary>"
        "{} chars; {} messages included, {} omitted, {} cut; policy {}; {}"
        "</details></div>",
        report.kind,
        _sent_label(report),
        _tokens_against_budget(report),
        format_html(" · why: {}", _why(report)) if _why(report) else "",
        format_html('<a href="{}">{}</a>', url, report.pk),
        report.chars,
        report.messages_included,
        report.messages_omitted,
        report.truncated_count,
        report_policy_label(report),
        report.created_at.strftime("%Y-%m-%d %H:%M:%S"),
    )


def _dispatch_note(dispatch: Dispatch) -> SafeString:
    return format_html(
        '<div class="dispatch"><div class="dispatch-line">attempt {} · worker {} · {}</div>'
        "{}</div>",
        dispatch.attempt,
        dispatch.worker_id,
        dispatch.prompts,
        format_html_join("", "{}", ((_sent_prompt_note(report),) for report in dispatch.reports)),
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
            format_html_join(
                "", "{}", ((_dispatch_note(dispatch),) for dispatch in dispatches_of(sent))
            ),
        )
        for subtask_id, sent in reports.items()
    }


register_turn_notes(sent_prompts)


class PromptReportInline(ReadOnlyAdminMixin, admin.TabularInline[PromptReport, Task]):
    """The task's dispatches, newest first, each with the prompts it built
    (`admin/dispatch/task/prompt_reports.html`, grouped by `dispatches_of`)."""

    model = PromptReport
    fk_name = "task"
    extra = 0
    ordering = ["-created_at", "-id"]
    # The template shows each report, and the formset edits nothing: its forms have no fields.
    fields = readonly_fields = ("attempt",)
    template = "admin/dispatch/task/prompt_reports.html"
    verbose_name = "prompt report"
    verbose_name_plural = "dispatches and their prompts"
    classes = ["collapse"]  # the conversation shows each turn's prompts beside it

    def get_queryset(self, request: HttpRequest) -> QuerySet[PromptReport]:
        # The turn's name and the policy would otherwise cost one query per row; the report's
        # snapshots, for replay, are never shown here.
        return (
            super()
            .get_queryset(request)
            .select_related("subtask", "policy")
            .defer("policy_snapshot", "input_snapshot", *(f"subtask__{c}" for c in _TURN_TEXTS))
        )


# The turn columns the list never reads: it names the turn, and shows none of its texts (not
# even those the conversation shows).
_TURN_TEXTS = (*UNREAD_COLUMNS, "error", "history_text", "preview_head", "preview_tail")


def dispatch_entry(dispatch: Dispatch) -> SafeString:
    """One dispatch in the task's list: a line naming it, then a row per prompt it built."""
    turn = dispatch.reports[0].subtask
    head = format_html(
        '<tr class="dispatch"><td colspan="9"><strong>{}</strong> · attempt {} · worker {} · {}'
        " · {}</td></tr>",
        turn.name,
        dispatch.attempt,
        dispatch.worker_id,
        dispatch.prompts,
        dispatch.reports[0].created_at.strftime("%Y-%m-%d %H:%M:%S"),
    )
    prompts = format_html_join(
        "",
        '<tr class="prompt kind-{}"><td><a href="{}">prompt report {}</a></td><td>{}</td>'
        "<td>{}</td><td>{}</td><td>{}</td><td>{} included, {} omitted, {} cut</td>"
        "<td>{}</td><td>{}</td><td>{} ms</td></tr>",
        (
            (
                report.kind,
                reverse("admin:dispatch_promptreport_change", args=[report.pk]),
                report.pk,
                _sent_label(report),
                _why(report) or "-",
                report_policy_label(report),
                "history on" if report.history_enabled else "history off",
                report.messages_included,
                report.messages_omitted,
                report.truncated_count,
                report.chars,
                _tokens_against_budget(report),
                f"{report.build_ms:.1f}",
            )
            for report in dispatch.reports
        ),
    )
    return format_html("{}{}", head, prompts)
