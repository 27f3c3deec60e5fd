"""Input and output serializers for the task API.

Input serializers check shape and types and reject unknown fields (a misspelt field is an error,
not a silently ignored one); the domain rules live in the services.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.settings import api_settings

from backend.api.errors import RequestBodyNotAnObject
from backend.api.links import artifact_download_url, turn_text_url
from backend.api.pagination import TaskPagination, TurnPageQuery, TurnPagination
from backend.artifacts.models import Artifact
from backend.dispatch.stops import DEFAULT_STOP_WAIT_SECONDS, MAX_STOP_WAIT_SECONDS
from backend.errors import InvalidInput
from backend.prompting.inputs import validate_name
from backend.tasks.models import (
    CONTEXT_PASSING_CHOICES,
    TASK_TYPE_PATTERN,
    Bot,
    ExecutorKind,
    FollowUpStrategy,
    QueuedMessage,
    Subtask,
    Task,
    TaskStatus,
)
from backend.tasks.selectors import (
    SPILLED_ERROR,
    SPILLED_MESSAGE,
    SPILLED_RESULT,
    SPILLED_VALUE,
    spilled_place,
)
from backend.tasks.services import check_pipeline_length, follow_up_strategy


def _label_name(value: str) -> None:
    try:
        validate_name(value)
    except ValueError as error:
        raise serializers.ValidationError(f"Name {error}.") from None


def label_name_field(**kwargs: Any) -> serializers.CharField:
    """A sender or bot name: it appears inside prompt role labels such as `User[alice]:`."""
    return serializers.CharField(max_length=64, validators=[_label_name], **kwargs)


# Per thread, the fields of each input serializer class used as a whole body (see
# `StrictInput.get_fields`).
_reused_fields = threading.local()


class StrictInput(serializers.Serializer[Any]):
    """An input serializer that refuses fields it does not declare.

    Used as a whole request body (not nested), it refuses a body that is not a JSON object
    before looking at any field (`RequestBodyNotAnObject`).
    """

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        """As a whole body, the fields this thread made for the class the first time, bound
        to this instance again (`fields` binds them), instead of a deep copy of every declared
        field per request: that copy was most of a request's validation (every executor
        call's body is validated here). Reusable because no input serializer changes its
        fields, nor do fields keep anything of a validation but their binding (the nested
        serializers among them included, each made once with its parent); per thread, so no
        two requests share them at once. Nested, as DRF does."""
        if self.parent is not None:
            return super().get_fields()
        by_class: dict[type, tuple[dict[str, Any], dict[str, str | None]]]
        by_class = _reused_fields.__dict__.setdefault("by_class", {})
        if type(self) not in by_class:
            fields = super().get_fields()
            # Each field's `source` as declared: binding sets it, and refuses to bind a field
            # whose source already names it.
            by_class[type(self)] = fields, {name: field.source for name, field in fields.items()}
        fields, sources = by_class[type(self)]
        for name, field in fields.items():
            field.source = sources[name]
        return fields

    def run_validation(self, data: Any = empty) -> Any:
        if self.parent is None and not isinstance(data, Mapping):
            raise RequestBodyNotAnObject()
        return super().run_validation(data)

    # A JSON body's values must already have their field's type: "5" is not an integer, 5 is
    # not a string and "yes" is not a boolean (DRF would coerce them silently).
    strict_types = True

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
            if self.strict_types:
                wrong = {
                    name: [problem]
                    for name, value in data.items()
                    if (problem := _wrong_json_type(self.fields[name], value)) is not None
                }
                if wrong:
                    raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


def _wrong_json_type(field: serializers.Field[Any, Any, Any, Any], value: Any) -> str | None:
    """What is wrong with `value`'s JSON type for `field`, if anything (null is the field's
    own business: allow_null)."""
    if value is None:
        return None
    if isinstance(field, serializers.BooleanField) and not isinstance(value, bool):
        return "Must be true or false."
    if isinstance(field, serializers.IntegerField) and (
        not isinstance(value, int) or isinstance(value, bool)
    ):
        return "Must be an integer."
    if isinstance(field, serializers.FloatField) and (
        not isinstance(value, int | float) or isinstance(value, bool)
    ):
        return "Must be a number."
    if isinstance(field, serializers.CharField | serializers.ChoiceField) and not isinstance(
        value, str
    ):
        return "Must be a string."
    return None


class StrictQuery(StrictInput):
    """Query parameters: undeclared ones are refused, except DRF's own `?format=` override.

    The browsable API links every page to `?format=json` and `?format=api`; the renderer reads
    that parameter, so it is not a filter and must not be refused as one. Query values are
    strings by nature, so their types are the fields' to parse.
    """

    strict_types = False

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != api_settings.URL_FORMAT_OVERRIDE}
        return super().to_internal_value(data)


class PipelineInput(serializers.ListSerializer[Any]):
    """A task's pipeline: at most BATON_MAX_PIPELINE_STEPS steps, counted before any is read."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, list):
            try:
                check_pipeline_length(steps=len(data))
            except InvalidInput as error:
                raise serializers.ValidationError(
                    {api_settings.NON_FIELD_ERRORS_KEY: [error.message]}, code="max_length"
                ) from None
        return super().to_internal_value(data)


class PipelineStepInput(StrictInput):
    """A registered bot (GET /api/bots/), or an executor for its default bot, or both."""

    bot = label_name_field(required=False)
    executor = serializers.ChoiceField(choices=ExecutorKind.choices, required=False)
    # Omitted: the task type's history policy decides (its context_passing) at dispatch.
    context_passing = serializers.ChoiceField(
        choices=CONTEXT_PASSING_CHOICES, required=False, allow_null=True, default=None
    )

    class Meta:
        # `many=True` (a task's pipeline) makes a `PipelineInput`.
        list_serializer_class = PipelineInput


class TaskCreateInput(StrictInput):
    title = serializers.CharField(max_length=200)
    task_type = serializers.RegexField(
        TASK_TYPE_PATTERN,
        max_length=64,
        error_messages={
            "invalid": "Use 1-64 lowercase letters, digits, '-' or '_', starting with a letter "
            "or digit (for example 'code' or 'chat')."
        },
    )
    message = serializers.CharField(trim_whitespace=False)
    executor = serializers.ChoiceField(choices=ExecutorKind.choices, required=False)
    bot = label_name_field(required=False)
    sender = label_name_field(required=False, default="")
    is_group_chat = serializers.BooleanField(required=False, default=False)
    follow_up_strategy = serializers.ChoiceField(
        choices=FollowUpStrategy.choices,
        required=False,
        default="",
        help_text="What a follow-up sent while a turn runs does, unless it says itself. "
        "Omitted: BATON_FOLLOW_UP_STRATEGY (enqueue unless the operator set it).",
    )
    pipeline = PipelineStepInput(
        many=True,
        required=False,
        allow_empty=False,
        help_text="At most BATON_MAX_PIPELINE_STEPS steps (16 unless the operator set it).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        has_agent = "executor" in attrs or "bot" in attrs
        has_pipeline = "pipeline" in attrs
        if "executor" in attrs and has_pipeline:
            raise serializers.ValidationError(
                {"executor": ["Give either executor (one agent) or pipeline (several), not both."]}
            )
        if not has_agent and not has_pipeline:
            raise serializers.ValidationError(
                {"executor": ["Name a bot or an executor, or give a pipeline."]}
            )
        if has_pipeline and "bot" in attrs:
            raise serializers.ValidationError(
                {"bot": ["Name the bots inside pipeline steps when a pipeline is given."]}
            )
        return attrs


class MessageInput(StrictInput):
    message = serializers.CharField(trim_whitespace=False)
    sender = label_name_field(required=False, default="")
    strategy = serializers.ChoiceField(
        choices=FollowUpStrategy.choices,
        required=False,
        help_text="What this follow-up does if a turn of the task is pending or running: "
        "reject (409), enqueue (202, sent when the turns before it finish), interrupt (the "
        "running turn stops and keeps what it wrote) or rollback (the running turn stops and "
        "leaves the history). Omitted: the task's follow_up_strategy.",
    )


class CancelQuery(StrictQuery):
    wait = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Answer once the workers running the stopped turns have confirmed that their "
        "executors' processes are gone (200), or when `timeout` passes first (202).",
    )
    timeout = serializers.FloatField(
        required=False,
        default=DEFAULT_STOP_WAIT_SECONDS,
        min_value=0,
        max_value=MAX_STOP_WAIT_SECONDS,
        help_text=f"Seconds a cancel with wait=true waits at most (default "
        f"{DEFAULT_STOP_WAIT_SECONDS:g}, at most {MAX_STOP_WAIT_SECONDS:g}).",
    )


class TurnListQuery(StrictQuery):
    """A page of a task's turns (`pagination.TurnPagination`): the same rules as every list (a
    bad page or page size is a 400 naming it; a numbered page past the end is a 404), and
    `after`, where the `next` links continue."""

    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(
        min_value=1,
        max_value=TurnPagination.max_page_size,
        required=False,
        default=TurnPagination.page_size,
    )
    after = serializers.IntegerField(
        min_value=0,
        required=False,
        help_text="Start just after the turn with this message_id (the `next` links use it).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "page" in attrs and "after" in attrs:
            raise serializers.ValidationError({"after": ["Give either page or after, not both."]})
        return attrs

    def page_query(self) -> TurnPageQuery:
        return TurnPageQuery(**self.validated_data)


class TaskListFilters(StrictQuery):
    status = serializers.ChoiceField(choices=TaskStatus.choices, required=False)
    task_type = serializers.CharField(max_length=64, required=False)
    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(
        min_value=1, max_value=TaskPagination.max_page_size, required=False
    )


class PipelineStepOutput(serializers.Serializer[dict[str, Any]]):
    bot = serializers.CharField()
    executor = serializers.CharField()
    # null: the task type's history policy decides.
    context_passing = serializers.CharField(allow_null=True)


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


class UsageFields(StrictInput):
    """Token usage of one turn (never cumulative over a native session), and cost when known."""

    input_tokens = serializers.IntegerField(
        min_value=0, required=False, help_text="Every input token, cached ones included."
    )
    cached_input_tokens = serializers.IntegerField(
        min_value=0, required=False, help_text="Of input_tokens: read from a prompt cache."
    )
    cache_write_input_tokens = serializers.IntegerField(
        min_value=0, required=False, help_text="Of input_tokens: written to a prompt cache."
    )
    output_tokens = serializers.IntegerField(
        min_value=0, required=False, help_text="Every output token, reasoning included."
    )
    reasoning_tokens = serializers.IntegerField(
        min_value=0, required=False, help_text="Of output_tokens: spent on reasoning."
    )
    cost_usd = serializers.FloatField(
        min_value=0, required=False, allow_null=True, help_text="Cost in US dollars, when known."
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
    """One turn. Read from `selectors.task_turns` rows (their `shown_*` columns).

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
    executor = serializers.ChoiceField(choices=ExecutorKind.choices, allow_blank=True)

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
            "not_before",
            "created_at",
            "started_at",
            "finished_at",
            "stop_confirmed_at",
        ]
        read_only_fields = fields


# The query parameters of a list paged by `TaskPagination` whose view reads no other.
PAGE_PARAMETERS = [
    OpenApiParameter(
        "page", OpenApiTypes.INT, description="The page, from 1; one past the last is a 404."
    ),
    OpenApiParameter(
        "page_size",
        OpenApiTypes.INT,
        description=f"Rows per page (default {TaskPagination.page_size}, at most "
        f"{TaskPagination.max_page_size}).",
    ),
]


def page_of(output: type[serializers.Serializer[Any]]) -> serializers.Serializer[Any]:
    """The schema of a page of `output` rows, as `TaskPagination` answers a list."""
    return inline_serializer(
        name=f"Paginated{output.__name__}List",
        fields={
            "count": serializers.IntegerField(help_text="The rows of all pages together."),
            "next": serializers.URLField(allow_null=True, help_text="The next page, if any."),
            "previous": serializers.URLField(allow_null=True, help_text="The page before, if any."),
            "results": output(many=True),
        },
    )


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


class BotOutput(serializers.ModelSerializer[Bot]):
    class Meta:
        model = Bot
        fields = [
            "name",
            "executor",
            "model",
            "instructions",
            "permission_mode",
            "max_turns",
            "timeout_seconds",
            "context_window",
            "is_default",
            "updated_at",
        ]
        read_only_fields = fields


class QueuedMessageOutput(serializers.ModelSerializer[QueuedMessage]):
    turn = serializers.IntegerField(
        source="subtask_id",
        allow_null=True,
        help_text="The id of the USER turn it became once sent; null while queued.",
    )

    class Meta:
        model = QueuedMessage
        fields = ["id", "status", "message", "sender", "turn", "created_at", "sent_at"]
        read_only_fields = fields


class TaskOutput(serializers.ModelSerializer[Task]):
    owner = serializers.CharField(source="owner.get_username")
    pipeline = PipelineStepOutput(many=True)
    follow_up_strategy = serializers.SerializerMethodField(
        help_text="What a follow-up sent while a turn runs does when it names no strategy."
    )

    def get_follow_up_strategy(self, task: Task) -> str:
        return follow_up_strategy(task=task)

    class Meta:
        model = Task
        fields = [
            "id",
            "title",
            "task_type",
            "status",
            "is_group_chat",
            "pipeline",
            "follow_up_strategy",
            "owner",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class TaskWithTurnsOutput(TaskOutput):
    """A task with the turns and the queued messages the view attached as
    `task.turns_for_output` and `task.queued_for_output`."""

    turns = SubtaskOutput(many=True, source="turns_for_output")
    queued_messages = QueuedMessageOutput(
        many=True,
        source="queued_for_output",
        help_text="Follow-ups waiting for the running turn, in the order they will be sent.",
    )

    class Meta(TaskOutput.Meta):
        fields = [*TaskOutput.Meta.fields, "turns", "queued_messages"]
        read_only_fields = fields
