"""Django admin for history policies and prompt reports, the prompt preview page, and what
dispatch adds to a task's page.

Operators tune each task type's history caps here. A policy form is validated by the prompt
builder's own pydantic policy (`builder_policy`), so the admin refuses exactly what the builder
would, with its reason next to the field, and every save goes through `save_policy` (version
bump, who changed it). The default row cannot be deleted: it is what task types without a row
of their own fall back to.

The prompt preview page (`preview/` under the policy admin, `backend.dispatch.admin_preview`)
shows the exact prompt the next dispatch of a task would send under a saved row or under edited
values not yet saved, and follows the operator's edits as they type.

A task's page belongs to `backend.tasks.admin`; dispatch re-registers Task with a subclass of
that admin which adds the prompt reports inline and the "Preview next prompt" button, so the
dependency points from dispatch to tasks.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.artifacts.admin_inlines import ArtifactInline
from backend.dispatch.admin_inlines import PromptReportInline, report_policy_label
from backend.dispatch.admin_preview import PolicyValuesForm, PromptPreviewAdminMixin
from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.dispatch.policies import (
    POLICY_FIELDS,
    resolve_policy,
    row_effective_values,
    save_policy,
)
from backend.dispatch.replay import replay_prompt
from backend.tasks.admin import SubtaskInline, TaskAdmin
from backend.tasks.models import Task, task_type_validator
from backend.tasks.selectors import visible_tasks


def sets_and_inherits(overrides: Collection[str]) -> str:
    """Which caps a row sets and which it inherits, in a line short enough for a list column."""
    sets = [name for name in POLICY_FIELDS if name in overrides]
    inherited = len(POLICY_FIELDS) - len(sets)
    if not sets:
        return f"sets: nothing · inherits: all {inherited}"
    if not inherited:
        return f"sets: all {len(sets)} · inherits: nothing"
    return f"sets: {', '.join(sets)} · inherits: the other {inherited}"


class HistoryPolicyForm(PolicyValuesForm):
    """A row's caps: the ones it sets (ticked, or edited) and, shown for reference, the rest.

    An untouched, unticked field stays inherited; its box shows the value it inherits now.
    """

    set_here = forms.MultipleChoiceField(
        choices=[(name, name) for name in POLICY_FIELDS],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Set by this row",
        help_text=(
            "Ticked fields use this row's value; the others are inherited (the default row, "
            "then the EXECUTOR_HISTORY_* environment, then Baton's built-in default). Editing "
            "a field's value ticks it."
        ),
    )

    class Meta(PolicyValuesForm.Meta):
        fields = ["task_type", *POLICY_FIELDS]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        row = self.instance
        default_row = None if row.is_default else HistoryPolicy.objects.filter(task_type="").first()
        effective, _ = row_effective_values(row=row, default_row=default_row)
        self.fields["set_here"].initial = list(row.overrides)
        for name in POLICY_FIELDS:
            if name not in row.overrides:
                self.initial[name] = effective[name]

    def clean_task_type(self) -> str:
        task_type: str = self.cleaned_data["task_type"].strip()
        if task_type:
            task_type_validator(task_type)
        return task_type

    def fields_set(self) -> list[str]:
        """What the row sets after this save: the ticked fields and every edited one."""
        chosen = set(self.cleaned_data.get("set_here") or ()) | set(self.changed_data)
        return [name for name in POLICY_FIELDS if name in chosen]


@admin.register(HistoryPolicy)
class HistoryPolicyAdmin(PromptPreviewAdminMixin, admin.ModelAdmin[HistoryPolicy]):
    form = HistoryPolicyForm
    list_display = [
        "task_type_label",
        "sets_and_inherits_label",
        "enabled",
        "max_messages",
        "max_chars",
        "per_message_max_chars",
        "max_tokens",
        "version",
        "updated_by",
        "updated_at",
    ]
    list_display_links = ["task_type_label"]
    list_select_related = ["updated_by"]
    readonly_fields = ["version", "updated_by", "updated_at", "effective_values_table"]
    fieldsets = [
        (None, {"fields": ["task_type", "enabled"]}),
        (
            "History selection",
            {
                "fields": [
                    "max_messages",
                    "max_chars",
                    "per_message_max_chars",
                    "keep_first_user_message",
                ],
                "description": (
                    "Applied in this order: select the newest turns up to max messages, cut "
                    "each at per message max chars, then drop the oldest until the history "
                    "fits max chars (and the prompt fits max tokens)."
                ),
            },
        ),
        (
            "Tokens",
            {
                "fields": ["max_tokens", "max_tokens_fraction", "token_encoding"],
                "description": (
                    "With the bot's model in the model table, the prompt may take the smaller "
                    "of max tokens and max tokens fraction of the model's window (after its "
                    "output and the executor's own system prompt and tools), counted in the "
                    "model's tokens; the token encoding counts prompts for other bots."
                ),
            },
        ),
        (
            "Current message, previous result and pipeline steps",
            {
                "fields": [
                    "current_message_max_chars",
                    "previous_result_max_chars",
                    "context_passing",
                ]
            },
        ),
        (
            "Native sessions",
            {
                "fields": ["resume_native_sessions", "resume_max_context_fraction"],
                "description": (
                    "Codex CLI and Claude Code keep their own session on the worker; resuming "
                    "it with only the unseen turns saves the model from reading every earlier "
                    "turn again."
                ),
            },
        ),
        (
            "Summaries of omitted history",
            {
                "fields": [
                    "summaries_enabled",
                    "summary_bot",
                    "summary_threshold_turns",
                    "summary_max_chars",
                ],
                "description": (
                    "When prompts leave turns out, a summary job on the chosen bot writes a "
                    "rolling summary; later prompts show it after the omission notice. A "
                    "dispatch never waits for it."
                ),
            },
        ),
        (
            "Inheritance",
            {
                "fields": ["set_here", "effective_values_table"],
                "description": (
                    "A row sets only the ticked fields. The table shows what dispatch uses for "
                    "this task type and where each value comes from."
                ),
            },
        ),
        ("Change record", {"fields": ["version", "updated_by", "updated_at"]}),
    ]

    @admin.display(description="Task type", ordering="task_type")
    def task_type_label(self, row: HistoryPolicy) -> str:
        return row.task_type or "default"

    @admin.display(description="Sets · inherits")
    def sets_and_inherits_label(self, row: HistoryPolicy) -> str:
        """The caps this row sets; the rest come from the default row, the environment or
        Baton's built-in defaults (the row's page says which)."""
        inherited = [name for name in POLICY_FIELDS if name not in row.overrides]
        return format_html(
            '<span title="{}">{}</span>',
            f"inherits: {', '.join(inherited)}" if inherited else "inherits nothing",
            sets_and_inherits(row.overrides),
        )

    def get_readonly_fields(
        self, request: HttpRequest, obj: HistoryPolicy | None = None
    ) -> list[str]:
        # Renaming a row would silently move its caps to another task type (or remove the
        # default); add a row for the new type instead.
        if obj is not None:
            return ["task_type", *self.readonly_fields]
        return list(self.readonly_fields)

    def has_delete_permission(self, request: HttpRequest, obj: HistoryPolicy | None = None) -> bool:
        if obj is not None and obj.is_default:
            return False
        return super().has_delete_permission(request, obj)

    @admin.display(description="Effective values")
    def effective_values_table(self, row: HistoryPolicy) -> str:
        """Each value dispatch uses for this row's task type, and where it comes from."""
        if row.pk is None:
            return "-"
        resolved = resolve_policy(task_type=row.task_type)
        return format_html(
            "<table><thead><tr><th>field</th><th>value</th><th>from</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (name, getattr(resolved.policy, name), resolved.sources[name])
                    for name in POLICY_FIELDS
                ),
            ),
        )

    def save_model(
        self,
        request: HttpRequest,
        obj: HistoryPolicy,
        form: forms.ModelForm[HistoryPolicy],
        change: bool,
    ) -> None:
        if change and not form.has_changed():
            return  # nothing changed: no new version
        if not isinstance(form, HistoryPolicyForm):
            raise TypeError("the history policy admin saves through HistoryPolicyForm")
        if not isinstance(request.user, User):  # the admin site lets in staff accounts only
            raise PermissionDenied
        setting = form.fields_set()
        save_policy(
            row=obj,
            changed_by=request.user,
            values={name: form.cleaned_data[name] for name in setting},
            inherit=[name for name in POLICY_FIELDS if name not in setting],
        )


@admin.register(PromptReport)
class PromptReportAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[PromptReport]):
    """What each dispatch built, read-only: counts, sizes and flags. The report keeps no prompt
    text; its page replays the prompt from the turns and says whether it is the one sent.

    A report shows its task's conversation (the replay is the user's text), so it follows the
    task's permission as the API does: the report's own view permission opens only the reports
    of tasks the operator may read."""

    allow_delete = True

    list_display = [
        "id",
        "task",
        "subtask",
        "attempt",
        "kind",
        "sent",
        "resume_reason",
        "retry_reason",
        "policy_label",
        "messages_included",
        "messages_omitted",
        "truncated_count",
        "tokens",
        "build_ms",
        "created_at",
    ]
    list_filter = [
        "kind",
        "sent",
        "resume_reason",
        "retry_reason",
        "policy_source",
        "history_enabled",
    ]
    list_select_related = ["task", "subtask", "policy"]
    search_fields = ["=task__id", "=subtask__id", "worker_id"]
    date_hierarchy = "created_at"

    def get_queryset(self, request: HttpRequest) -> QuerySet[PromptReport]:
        if not isinstance(request.user, User):  # the admin site lets in staff accounts only
            raise PermissionDenied
        reports = super().get_queryset(request)
        return reports.filter(task__in=visible_tasks(user=request.user))

    @admin.display(description="Policy", ordering="policy_version")
    def policy_label(self, report: PromptReport) -> str:
        return report_policy_label(report)

    def get_readonly_fields(
        self, request: HttpRequest, obj: PromptReport | None = None
    ) -> list[str]:
        return ["replay", *(field.name for field in self.opts.fields)]

    @admin.display(description="Replay")
    def replay(self, report: PromptReport) -> str:
        replay = replay_prompt(report=report)
        if replay.matches:
            verdict = format_html("<strong>sha256 matches</strong> ({})", replay.sha256)
        elif not replay.text:
            verdict = format_html("<strong>cannot replay</strong>: {}", replay.problem)
        else:
            verdict = format_html(
                "<strong>sha256 differs</strong>: recorded {}, rebuilt {}. {}",
                report.prompt_sha256,
                replay.sha256,
                replay.problem,
            )
        if not replay.text:
            return verdict
        return format_html(
            '{}<details><summary>Rebuilt prompt ({} chars)</summary><pre class="prompt">{}</pre>'
            "</details>",
            verdict,
            len(replay.text),
            replay.text,
        )


class DispatchTaskAdmin(TaskAdmin):
    """A task's page with its prompt reports and a link to the prompt preview of its next
    dispatch (the button comes from `admin/dispatch/task_change_form.html`)."""

    inlines = [SubtaskInline, PromptReportInline, ArtifactInline]
    change_form_template = "admin/dispatch/task_change_form.html"


admin.site.unregister(Task)
admin.site.register(Task, DispatchTaskAdmin)
