"""Django admin for history policies and prompt reports, the prompt preview page, and what
dispatch adds to a task's page.

Operators tune each task type's history caps here. A policy form is validated by the prompt
builder's own pydantic policy (`builder_policy`), so the admin refuses exactly what the builder
would, with its reason next to the field, and every save goes through `save_policy` (version
bump, who changed it). The default row cannot be deleted: it is what task types without a row
of their own fall back to.

The preview page (`preview/` under the policy admin) shows the exact prompt the next dispatch
of a task would send under a saved row or under edited values not yet saved; it only reads
(`backend.dispatch.preview`), using GET so that nothing on it can write.

A task's page belongs to `backend.tasks.admin`; dispatch re-registers Task with a subclass of
that admin which adds the prompt reports inline and the "Preview next prompt" button, so the
dependency points from dispatch to tasks.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.artifacts.admin_inlines import ArtifactInline
from backend.dispatch.admin_inlines import PromptReportInline, report_policy_label
from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.dispatch.policies import (
    POLICY_FIELDS,
    builder_policy,
    check_summary_bot,
    resolve_policy,
    row_effective_values,
    save_policy,
)
from backend.dispatch.preview import PromptPreview, preview_prompt
from backend.dispatch.replay import replay_prompt
from backend.errors import BatonError, InvalidInput
from backend.tasks.admin import SubtaskInline, TaskAdmin
from backend.tasks.models import Task, task_type_validator

PREVIEW_URL_NAME = "dispatch_historypolicy_preview"

# The preview's policy choices besides the saved rows.
RESOLVED_CHOICE = ""
UNSAVED_CHOICE = "unsaved"


def _attach_policy_error(form: forms.BaseForm, error: InvalidInput) -> None:
    """Put a policy validation reason next to the field it names, or above the form."""
    if error.field in form.fields:
        form.add_error(error.field, error.message.removeprefix(f"{error.field}: "))
    else:
        form.add_error(None, error.message)


class PolicyValuesForm(forms.ModelForm[HistoryPolicy]):
    """The cap fields of a policy, validated together as the prompt builder validates them."""

    class Meta:
        model = HistoryPolicy
        fields = list(POLICY_FIELDS)

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        # A field that failed its own validation has already said why; combining the rest
        # would only repeat or guess.
        if not self.errors:
            try:
                check_summary_bot(
                    builder_policy({name: cleaned.get(name) for name in POLICY_FIELDS})
                )
            except InvalidInput as error:
                _attach_policy_error(self, error)
        return cleaned

    def policy_values(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in POLICY_FIELDS}


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


class PreviewForm(forms.Form):
    """Which task and which policy to preview (the cap values are a `PolicyValuesForm`)."""

    task = forms.IntegerField(
        min_value=1, label="Task id", help_text="The task whose next dispatch to preview."
    )
    policy = forms.ChoiceField(
        required=False,
        help_text=(
            "A saved policy row, the one dispatch would resolve for the task's type, or the "
            "edited values below (not saved)."
        ),
    )

    def __init__(self, *args: Any, rows: list[HistoryPolicy], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        policy = self.fields["policy"]
        assert isinstance(policy, forms.ChoiceField)
        policy.choices = [
            (RESOLVED_CHOICE, "As dispatch resolves it for the task's type"),
            *((str(row.pk), f"Saved: {row}") for row in rows),
            (UNSAVED_CHOICE, "Edited values below (unsaved)"),
        ]


@admin.register(HistoryPolicy)
class HistoryPolicyAdmin(admin.ModelAdmin[HistoryPolicy]):
    form = HistoryPolicyForm
    list_display = [
        "task_type_label",
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

    def get_urls(self) -> list[URLPattern]:
        preview = path(
            "preview/", self.admin_site.admin_view(self.preview_view), name=PREVIEW_URL_NAME
        )
        # Before the default patterns: their "<object_id>/" would take "preview/".
        return [preview, *super().get_urls()]

    def preview_view(self, request: HttpRequest) -> HttpResponse:
        """The prompt preview page: parse the form, call `preview_prompt`, render."""
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        # The page shows task content, so it needs the right to view tasks as well as policies.
        task_admin = self.admin_site.get_model_admin(Task)
        if not (self.has_view_permission(request) and task_admin.has_view_permission(request)):
            raise PermissionDenied
        rows = list(HistoryPolicy.objects.all())
        submitted = "task" in request.GET
        selector = PreviewForm(
            request.GET if submitted else None,
            rows=rows,
            initial={"policy": request.GET.get("policy", RESOLVED_CHOICE)},
        )
        choice = selector["policy"].value() or RESOLVED_CHOICE
        chosen_row = next((row for row in rows if str(row.pk) == choice), None)
        unsaved = submitted and choice == UNSAVED_CHOICE
        values_form = PolicyValuesForm(request.GET if unsaved else None)
        preview: PromptPreview | None = None
        if submitted and selector.is_valid() and (not unsaved or values_form.is_valid()):
            task = Task.objects.filter(pk=selector.cleaned_data["task"]).first()
            if task is None:
                selector.add_error("task", "No task with this id.")
            else:
                values_or_row = values_form.policy_values() if unsaved else chosen_row
                try:
                    preview = preview_prompt(task=task, values_or_row=values_or_row)
                except InvalidInput as error:
                    _attach_policy_error(values_form if unsaved else selector, error)
                except BatonError as error:
                    selector.add_error(None, error.message)
        if not unsaved:
            # Pre-fill the cap fields from the policy shown, ready to be edited.
            if preview is not None:
                values_form = PolicyValuesForm(initial=preview.values)
            elif chosen_row is not None:
                values_form = PolicyValuesForm(instance=chosen_row)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Prompt preview",
            "selector": selector,
            "values_form": values_form,
            "unsaved_choice": UNSAVED_CHOICE,
            "preview": preview,
        }
        return TemplateResponse(request, "admin/dispatch/prompt_preview.html", context)


@admin.register(PromptReport)
class PromptReportAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[PromptReport]):
    """What each dispatch built, read-only: counts, sizes and flags. The report keeps no prompt
    text; its page replays the prompt from the turns and says whether it is the one sent."""

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
