"""Django admin for bots, tasks and their turns: bots are edited here; turns are read-only.

A task's page lists its turns and artifacts. Dispatch extends this page from its own admin
(`backend.dispatch.admin.DispatchTaskAdmin` re-registers Task with the prompt reports and the
prompt preview button), so tasks never imports dispatch.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.artifacts.admin_inlines import ArtifactInline
from backend.artifacts.storage import ArtifactIntegrityError
from backend.errors import InvalidInput
from backend.prompting.truncate import truncate_middle
from backend.prompting.units import Unit
from backend.tasks.admin_conversation import ConversationInline
from backend.tasks.models import Bot, LanguageModel, QueuedMessage, Subtask, Task
from backend.tasks.partial_texts import partial_text_of
from backend.tasks.selectors import turn_result
from backend.tasks.services import PipelineStep, resolve_pipeline

# The admin shows bounded text: a queued message or a turn's raw fields may be megabytes. A
# turn's text as the model sees it is shown as stored (`admin_conversation`), never cut again.
INLINE_TEXT_CHARS = 600
DETAIL_TEXT_CHARS = 100_000


def _bounded(text: str, limit: int) -> str:
    return truncate_middle(text, limit, Unit.CHARS)


# The task page's turns: the conversation (dispatch's task admin lists it by this name).
SubtaskInline = ConversationInline


class QueuedMessageInline(ReadOnlyAdminMixin, admin.TabularInline[QueuedMessage, Task]):
    model = QueuedMessage
    extra = 0
    ordering = ["id"]
    fields = readonly_fields = (
        "id",
        "status",
        "sender",
        "message_shown",
        "subtask",
        "created_at",
        "sent_at",
        "cancelled_at",
    )

    @admin.display(description="message")
    def message_shown(self, queued: QueuedMessage) -> str:
        return _bounded(queued.message, INLINE_TEXT_CHARS)


STEP_KEYS = frozenset({"bot", "executor", "context_passing"})


class TaskAdminForm(forms.ModelForm[Task]):
    """A task's settings; a pipeline edited here is checked and stored as `create_task` stores
    one. The status is not edited here: it follows the turns, through the services."""

    class Meta:
        model = Task
        fields = [
            "owner",
            "title",
            "task_type",
            "is_group_chat",
            "follow_up_strategy",
            "pipeline",
            "transcript",
        ]

    def clean_pipeline(self) -> Any:
        pipeline = self.cleaned_data["pipeline"]
        if "pipeline" not in self.changed_data:
            return pipeline
        if not isinstance(pipeline, list) or not all(
            isinstance(step, dict)
            and set(step) <= STEP_KEYS
            and all(value is None or isinstance(value, str) for value in step.values())
            for step in pipeline
        ):
            raise forms.ValidationError(
                "The pipeline is a list of steps, each an object with a bot, an executor or "
                "both, and optionally context_passing."
            )
        try:
            return resolve_pipeline([PipelineStep(**step) for step in pipeline])
        except InvalidInput as error:
            raise forms.ValidationError(error.message) from None


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin[Task]):
    form = TaskAdminForm
    list_display = ["id", "title", "task_type", "status", "is_group_chat", "owner", "created_at"]
    list_filter = ["status", "task_type", "is_group_chat"]
    search_fields = ["title"]
    list_select_related = ["owner"]
    readonly_fields = ["status", "next_message_id", "summary", "created_at", "updated_at"]
    # Read first: the task's facts, then its conversation (the inline); its settings folded.
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("title", "status"),
                    ("task_type", "is_group_chat", "follow_up_strategy"),
                    ("owner", "next_message_id"),
                    ("created_at", "updated_at"),
                    "summary",
                ]
            },
        ),
        (
            "Pipeline and transcript",
            {"fields": ["pipeline", "transcript"], "classes": ["collapse"]},
        ),
    ]
    inlines = [SubtaskInline, QueuedMessageInline, ArtifactInline]


@admin.register(Subtask)
class SubtaskAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Subtask]):
    allow_delete = True
    list_display = [
        "id",
        "task",
        "message_id",
        "kind",
        "role",
        "status",
        "bot",
        "executor",
        "created_at",
    ]
    list_filter = ["status", "kind", "role", "executor"]
    search_fields = ["task__title"]
    list_select_related = ["task"]
    ordering = ["-created_at"]
    # Read first: who, what state, and the text as the model sees it; the raw fields folded.
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("task", "message_id", "parent_message_id", "kind"),
                    ("role", "sender", "bot", "executor"),
                    ("status", "error_code", "attempts", "releases"),
                    "error",
                    ("created_at", "started_at", "finished_at"),
                ]
            },
        ),
        (
            "Text as the model sees it",
            {"fields": ["text_sizes", "history_text_shown"]},
        ),
        (
            "Message and result as sent",
            {"fields": ["message_text", "result_as_sent"], "classes": ["collapse"]},
        ),
        (
            "Claim, lease and session",
            {
                "fields": [
                    ("claimed_by", "lease_owner", "lease_expires_at"),
                    ("pending_since", "not_before", "stop_confirmed_at"),
                    ("pipeline_step", "context_passing"),
                    ("native_session_id", "session_worker"),
                    ("token_cap", "context_overflows"),
                ],
                "classes": ["collapse"],
            },
        ),
        (
            "Usage and progress",
            {
                "fields": ["usage_json", "partial_text_shown", "progress_updated_at"],
                "classes": ["collapse"],
            },
        ),
        (
            "Ingestion",
            {
                "fields": [
                    ("history_text_tokens", "history_text_tokens_o200k"),
                    ("history_tokens_estimated", "history_replaced_chars"),
                    ("history_is_preview", "result_value_in_artifact", "recorded_at"),
                ],
                "classes": ["collapse"],
            },
        ),
        (
            "Summary job",
            {
                "fields": [
                    ("summary_first_message_id", "summary_last_message_id", "summary_previous")
                ],
                "classes": ["collapse"],
            },
        ),
    ]
    readonly_fields = [
        "message_text",
        "result_as_sent",
        "usage_json",
        "text_sizes",
        "history_text_shown",
        "partial_text_shown",
    ]

    @admin.display(description="size")
    def text_sizes(self, subtask: Subtask) -> str:
        """The whole text's size and, for a spilled text, the preview's, with the whole text."""
        if subtask.history_chars is None:
            return "no text yet"
        whole = format_html(
            "{} chars, {} lines, {} bytes, {}{} tokens",
            subtask.history_chars,
            subtask.history_lines,
            subtask.history_bytes,
            "~" if subtask.history_tokens_estimated else "",
            subtask.history_tokens,
        )
        if subtask.history_is_preview:
            whole = format_html("{}; the preview below: {} chars", whole, len(subtask.history_text))
        if subtask.artifact_id is None:
            return whole
        url = reverse("artifact-content", kwargs={"artifact_id": subtask.artifact_id})
        return format_html('{} · <a href="{}" class="whole-text">whole text</a>', whole, url)

    @admin.display(description="message")
    def message_text(self, subtask: Subtask) -> str:
        return _bounded(subtask.message, DETAIL_TEXT_CHARS)

    @admin.display(description="result (as sent)")
    def result_as_sent(self, subtask: Subtask) -> str:
        try:
            result = turn_result(subtask=subtask)
        except ArtifactIntegrityError as error:
            # The rest of the page stays readable; the artifact's id and fault are named.
            return f"(damaged) {error}"
        if result is None:
            return "-"
        return _bounded(json.dumps(result, ensure_ascii=False, indent=2), DETAIL_TEXT_CHARS)

    @admin.display(description="partial text")
    def partial_text_shown(self, subtask: Subtask) -> str:
        # A running turn's text goes on in pieces (`partial_texts`); written by workers only.
        return _bounded(partial_text_of(subtask), DETAIL_TEXT_CHARS)

    @admin.display(description="usage")
    def usage_json(self, subtask: Subtask) -> str:
        return "-" if subtask.usage is None else json.dumps(subtask.usage, indent=2)

    @admin.display(description="text")
    def history_text_shown(self, subtask: Subtask) -> str:
        # Bounded at ingestion: the whole text, or the stored preview of a spilled one. As a
        # block of its own, so its lines keep their indentation (a traceback's frames).
        if not subtask.history_text:
            return "-"
        return format_html(
            '<pre class="turn-text" style="white-space: pre-wrap; overflow-wrap: anywhere; '
            'margin: 0">{}</pre>',
            subtask.history_text,
        )


@admin.register(Bot)
class BotAdmin(admin.ModelAdmin[Bot]):
    """Operators register the bots pipeline steps name; changes apply to the next dispatch."""

    list_display = [
        "name",
        "executor",
        "model",
        "permission_mode",
        "timeout_seconds",
        "max_turns",
        "is_default",
    ]
    list_filter = ["executor", "permission_mode", "is_default"]
    search_fields = ["name", "model"]
    # Learned from the executor's usage reports (backend/dispatch/budgets.py).
    readonly_fields = ["overhead_tokens", "token_ratio", "created_at", "updated_at"]
    exclude = ["token_ratio_per_mille", "token_ratio_samples"]  # shown as `token_ratio`

    @admin.display(description="token ratio")
    def token_ratio(self, bot: Bot) -> str:
        """The factor the bot's prompts are converted to its model's tokens with, when learned."""
        if bot.token_ratio_per_mille is None:
            return "the shipped estimate (not learned)"
        return (
            f"{bot.token_ratio_per_mille / 1000:.3f} model tokens per counted token, learned "
            f"from {bot.token_ratio_samples} full-prompt turns"
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Bot | None = None) -> list[str]:
        # Turns and pipelines store the bot's name: renaming would orphan them.
        return [*self.readonly_fields, "name"] if obj is not None else self.readonly_fields

    def has_delete_permission(self, request: HttpRequest, obj: Bot | None = None) -> bool:
        if obj is not None and Subtask.objects.filter(bot=obj.name).exists():
            return False  # turns name it; keep it so their history and retries still resolve
        return super().has_delete_permission(request, obj)


@admin.register(LanguageModel)
class LanguageModelAdmin(admin.ModelAdmin[LanguageModel]):
    """The model table: a bot's model decides its prompt budget; edits apply to the next
    dispatch. Add a row for a model the project does not ship."""

    list_display = [
        "name",
        "provider",
        "context_window",
        "max_output_tokens",
        "max_input_tokens",
        "tokenizer",
    ]
    list_filter = ["provider", "tokenizer"]
    search_fields = ["name"]
    readonly_fields = ["updated_at"]
