"""How the task API shows a turn: its texts (or where they spilled), result, usage and history.

The shapes of a turn's result and usage are shared with the executor API.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from backend import executor_kinds
from backend.api.links import artifact_download_url, turn_text_url
from backend.api.serializers.reports import PromptReportLinkOutput
from backend.api.serializers.strict import StrictInput
from backend.artifacts.models import Artifact
from backend.dispatch.selectors import LINKS_ATTRIBUTE
from backend.tasks.models import (
    Subtask,
)
from backend.tasks.selectors import (
    SPILLED_ERROR,
    SPILLED_MESSAGE,
    SPILLED_RESULT,
    SPILLED_VALUE,
    spilled_place,
)


class HistoryMeasureOutput(serializers.Serializer[Subtask]):
    """What ingestion measured of the turn's text (None until it is recorded)."""

    chars = serializers.IntegerField(source="history_chars")
    bytes = serializers.IntegerField(source="history_bytes")
    lines = serializers.IntegerField(source="history_lines")
    tokens = serializers.IntegerField(source="history_tokens")
    tokens_estimated = serializers.BooleanField(source="history_tokens_estimated")
    # Lone surrogates and NULs shown to the model as U+FFFD (the stored result keeps them).
    replaced_chars = serializers.IntegerField(source="history_replaced_chars")
    artifact = serializers.CharField(source="artifact_id", allow_null=True)


# The documented shapes of a turn's result and usage (OpenAPI), shared by the task API and the
# executor API.
RESULT_SCHEMA = {
    "type": "object",
    "description": (
        "The executor's result. `value` is the answer: a string is the text exactly as the "
        "executor returned it; any other JSON value (number, list, object) is kept as sent and "
        "its canonical JSON (sorted keys, UTF-8) stands in for the text in later prompts; "
        "without a `value`, the whole result's canonical JSON does. Other keys are kept as "
        "sent (for example `commands`, `files_changed`)."
    ),
    "properties": {"value": {"description": "The answer; any JSON value."}},
    "additionalProperties": True,
}


@extend_schema_field(RESULT_SCHEMA)
class ResultField(serializers.JSONField):
    pass


# What one turn may report: far past any model's window summed over a long agent loop, yet
# what the columns that keep a figure (a native session's context tokens) and the budget's
# arithmetic hold. A larger figure is a report gone wrong: a 400 naming the field.
MAX_USAGE_TOKENS = 10**9
MAX_USAGE_COST_USD = 10**6


def _usage_tokens(help_text: str) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=0, max_value=MAX_USAGE_TOKENS, required=False, help_text=help_text
    )


class UsageFields(StrictInput):
    """Token usage of one turn (never cumulative over a native session), and cost when known."""

    input_tokens = _usage_tokens("Every input token, cached ones included.")
    cached_input_tokens = _usage_tokens("Of input_tokens: read from a prompt cache.")
    cache_write_input_tokens = _usage_tokens("Of input_tokens: written to a prompt cache.")
    output_tokens = _usage_tokens("Every output token, reasoning included.")
    reasoning_tokens = _usage_tokens("Of output_tokens: spent on reasoning.")
    cost_usd = serializers.FloatField(
        min_value=0,
        max_value=MAX_USAGE_COST_USD,
        required=False,
        allow_null=True,
        help_text="Cost in US dollars, when known.",
    )
    model = serializers.CharField(
        max_length=200, required=False, help_text="The model that served the turn."
    )


class SpilledArtifactOutput(serializers.Serializer[Artifact]):
    id = serializers.CharField()
    sha256 = serializers.CharField()
    kind = serializers.CharField()
    download_url = serializers.SerializerMethodField(help_text="GET it for the whole text.")

    def get_download_url(self, artifact: Artifact) -> str:
        return artifact_download_url(request=self.context["request"], artifact_id=artifact.id)


class SpilledTextOutput(serializers.Serializer[Subtask]):
    """A turn's text that spilled to an artifact, shown in the text's place (see `spilled`).

    Read from the turn's row alone, never from the artifact: the preview ingestion stored,
    the whole text's sizes, and where to fetch it whole.
    """

    preview = serializers.CharField(
        source="shown_preview",
        help_text=(
            "The preview ingestion kept (what matters for the text's kind), each cut marked "
            "`…N chars truncated…`."
        ),
    )
    truncated = serializers.SerializerMethodField(help_text="Always true: this is a preview.")
    chars = serializers.IntegerField(source="history_chars", help_text="The whole text's size.")
    bytes = serializers.IntegerField(source="history_bytes", help_text="Of UTF-8.")
    lines = serializers.IntegerField(source="history_lines")
    artifact = SpilledArtifactOutput()
    url = serializers.SerializerMethodField(
        help_text="GET it for the whole text, streamed (sha256-checked, Range and ?lines=)."
    )

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_truncated(self, subtask: Subtask) -> bool:
        return True

    def get_url(self, subtask: Subtask) -> str:
        return turn_text_url(
            request=self.context["request"], task_id=subtask.task_id, subtask_id=subtask.pk
        )


# The OpenAPI shape of a SpilledTextOutput (drf-spectacular cannot put a serializer beside a
# plain string in a oneOf, so the fields are listed here).
SPILLED_TEXT_SCHEMA = {
    "type": "object",
    "description": "A text that spilled to an artifact: its preview, sizes and links.",
    "properties": {
        "preview": {
            "type": "string",
            "description": "The kept parts, each cut marked `…N chars truncated…`.",
        },
        "truncated": {"type": "boolean", "description": "Always true: this is a preview."},
        "chars": {"type": "integer"},
        "bytes": {"type": "integer"},
        "lines": {"type": "integer"},
        "artifact": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "sha256": {"type": "string"},
                "kind": {"type": "string"},
                "download_url": {"type": "string", "format": "uri"},
            },
        },
        "url": {"type": "string", "format": "uri", "description": "The whole text, streamed."},
    },
}
TEXT_OR_SPILLED_SCHEMA = {"oneOf": [{"type": "string"}, SPILLED_TEXT_SCHEMA]}


class SubtaskOutput(serializers.ModelSerializer[Subtask]):
    """One turn. Read from `selectors.task_turns` rows (their `shown_*` columns) with their
    prompt report links (`backend.dispatch.selectors.with_prompt_report_links`).

    A text that spilled is shown as a `SpilledTextOutput` where the text stood, and `spilled`
    names that place (`selectors.spilled_place`): `message`, `error`, `result.value` (the
    result as sent, its `value` the preview object) or `result` (the preview object for the
    whole result). Texts that did not spill are inline as sent.
    """

    message = serializers.SerializerMethodField()
    result = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    spilled = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()
    progress_events = serializers.JSONField(allow_null=True)
    usage = serializers.SerializerMethodField()
    # A USER turn runs no executor: "" (as every answer has always shown it).
    executor = serializers.ChoiceField(choices=executor_kinds.CHOICES, allow_blank=True)
    prompt_reports = serializers.SerializerMethodField()

    @extend_schema_field(
        PromptReportLinkOutput(
            many=True,
            help_text="An assistant turn's prompt reports, oldest first: one per dispatch, two "
            "(a resume and a full prompt, one `attempt`) for a dispatch that offered a resume. "
            "Empty for a user turn and for a turn not dispatched yet.",
        )
    )
    def get_prompt_reports(self, subtask: Subtask) -> Any:
        # Prefetched for the whole page: a turn never reads its reports on its own.
        links = getattr(subtask, LINKS_ATTRIBUTE)
        return PromptReportLinkOutput(links, many=True, context=self.context).data

    @extend_schema_field(UsageFields(allow_null=True))
    def get_usage(self, subtask: Subtask) -> dict[str, Any] | None:
        usage: dict[str, Any] | None = subtask.usage
        return usage

    @extend_schema_field(HistoryMeasureOutput(allow_null=True))
    def get_history(self, subtask: Subtask) -> dict[str, Any] | None:
        if subtask.recorded_at is None:
            return None
        # What `HistoryMeasureOutput(subtask).data` gives, built without a serializer per
        # turn (a task's view shows every turn).
        return {
            "chars": subtask.history_chars,
            "bytes": subtask.history_bytes,
            "lines": subtask.history_lines,
            "tokens": subtask.history_tokens,
            "tokens_estimated": subtask.history_tokens_estimated,
            "replaced_chars": subtask.history_replaced_chars,
            "artifact": subtask.artifact_id,
        }

    def _spilled_text(self, subtask: Subtask) -> dict[str, Any]:
        return SpilledTextOutput(subtask, context=self.context).data

    @extend_schema_field(
        {
            "type": "string",
            "nullable": True,
            "enum": [SPILLED_MESSAGE, SPILLED_ERROR, SPILLED_VALUE, SPILLED_RESULT, None],
            "description": "Where a preview object stands for a text that spilled; null: "
            "every text of the turn is inline.",
        }
    )
    def get_spilled(self, subtask: Subtask) -> str | None:
        return spilled_place(subtask)

    @extend_schema_field(TEXT_OR_SPILLED_SCHEMA)
    def get_message(self, subtask: Subtask) -> Any:
        if spilled_place(subtask) == SPILLED_MESSAGE:
            return self._spilled_text(subtask)
        return subtask.shown_message

    @extend_schema_field(TEXT_OR_SPILLED_SCHEMA)
    def get_error(self, subtask: Subtask) -> Any:
        if spilled_place(subtask) == SPILLED_ERROR:
            return self._spilled_text(subtask)
        return subtask.shown_error

    @extend_schema_field(
        {
            **RESULT_SCHEMA,
            "nullable": True,
            "description": f"{RESULT_SCHEMA['description']} When its text spilled, a preview "
            "object stands for the value or the whole result (see `spilled`).",
        }
    )
    def get_result(self, subtask: Subtask) -> dict[str, Any] | None:
        place = spilled_place(subtask)
        if place == SPILLED_RESULT:
            return self._spilled_text(subtask)
        result: dict[str, Any] | None = subtask.shown_result
        if place == SPILLED_VALUE and result is not None:
            return {
                key: self._spilled_text(subtask) if key == "value" else item
                for key, item in result.items()
            }
        return result

    class Meta:
        model = Subtask
        fields = [
            "id",
            "message_id",
            "parent_message_id",
            "role",
            "status",
            "sender",
            "bot",
            "pipeline_step",
            "executor",
            "message",
            "result",
            "error",
            "spilled",
            "error_code",
            "usage",
            "native_session_id",
            "artifact",
            "history",
            "partial_text",
            "progress_events",
            "progress_updated_at",
            "attempts",
            "prompt_reports",
            "not_before",
            "created_at",
            "started_at",
            "finished_at",
            "stop_confirmed_at",
        ]
        read_only_fields = fields


class TurnPageOutput(serializers.Serializer[dict[str, Any]]):
    """A page of a task's turns (`pagination.TurnPagination`)."""

    count = serializers.IntegerField(help_text="The task's turns, all pages together.")
    next = serializers.URLField(
        allow_null=True, help_text="The page after this one (`?after=<message_id>`), if any."
    )
    previous = serializers.URLField(
        allow_null=True, help_text="The numbered page before a numbered page, if any."
    )
    results = SubtaskOutput(many=True)
