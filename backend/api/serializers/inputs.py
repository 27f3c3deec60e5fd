"""What the product sends the task API: new tasks, follow-ups, cancels and list queries."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.settings import api_settings

from backend import executor_kinds
from backend.api.pagination import TaskPagination, TurnPageQuery, TurnPagination
from backend.api.serializers.strict import MAX_ROW_ID, StrictInput, StrictQuery, TextField
from backend.dispatch.stops import DEFAULT_STOP_WAIT_SECONDS, MAX_STOP_WAIT_SECONDS
from backend.errors import InvalidInput
from backend.prompting.inputs import validate_name
from backend.tasks.models import (
    CONTEXT_PASSING_CHOICES,
    TASK_TYPE_PATTERN,
    FollowUpStrategy,
    TaskStatus,
)
from backend.tasks.services import check_pipeline_length
from settings.environment import BatonEnvironment

# The help texts name no strategy by hand: the schema lists the choices, with what each does,
# from `FollowUpStrategy` itself.
_DEFAULT_STRATEGY = BatonEnvironment.model_fields["follow_up_strategy"].default


def _label_name(value: str) -> None:
    try:
        validate_name(value)
    except ValueError as error:
        raise serializers.ValidationError(f"Name {error}.") from None


def label_name_field(**kwargs: Any) -> serializers.CharField:
    """A sender or bot name: it appears inside prompt role labels such as `User[alice]:`."""
    return serializers.CharField(max_length=64, validators=[_label_name], **kwargs)


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
    executor = serializers.ChoiceField(choices=executor_kinds.CHOICES, required=False)
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
    message = TextField(trim_whitespace=False)
    executor = serializers.ChoiceField(choices=executor_kinds.CHOICES, required=False)
    bot = label_name_field(required=False)
    sender = label_name_field(required=False, default="")
    is_group_chat = serializers.BooleanField(required=False, default=False)
    follow_up_strategy = serializers.ChoiceField(
        choices=FollowUpStrategy.choices,
        required=False,
        default="",
        help_text="What a follow-up sent while a turn runs does, unless it says itself. "
        f"Omitted: BATON_FOLLOW_UP_STRATEGY ({_DEFAULT_STRATEGY} unless the operator set it).",
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
    message = TextField(trim_whitespace=False)
    sender = label_name_field(required=False, default="")
    strategy = serializers.ChoiceField(
        choices=FollowUpStrategy.choices,
        required=False,
        help_text="What this follow-up does if a turn of the task is pending or running. "
        "Omitted: the task's follow_up_strategy.",
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

    # A page's first row must be a row number the database can hold (a 400, not a 500).
    page = serializers.IntegerField(
        min_value=1, max_value=MAX_ROW_ID // TurnPagination.max_page_size, required=False
    )
    page_size = serializers.IntegerField(
        min_value=1,
        max_value=TurnPagination.max_page_size,
        required=False,
        default=TurnPagination.page_size,
    )
    after = serializers.IntegerField(
        min_value=0,
        max_value=MAX_ROW_ID,
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
