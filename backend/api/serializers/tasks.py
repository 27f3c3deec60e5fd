"""How the task API shows a task, its pipeline, its queued messages and the bots."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from backend.api.serializers.turns import SubtaskOutput
from backend.tasks.models import (
    Bot,
    QueuedMessage,
    Steer,
    Task,
)
from backend.tasks.services import follow_up_strategy


class PipelineStepOutput(serializers.Serializer[dict[str, Any]]):
    bot = serializers.CharField()
    executor = serializers.CharField()
    # null: the task type's history policy decides.
    context_passing = serializers.CharField(allow_null=True)


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
        help_text=(
            "The id of the USER turn it became once sent; null while queued, except for a "
            "steer that fell back to the queue, which is a turn already."
        ),
    )
    steer_fallback = serializers.SerializerMethodField(
        help_text=(
            "Only when the follow-up was sent with strategy steer and queued instead: why "
            "(not_running: no turn of the task runs on an executor yet; not_steerable: the "
            "running executor takes no input while it runs)."
        )
    )

    class Meta:
        model = QueuedMessage
        fields = [
            "id",
            "status",
            "message",
            "sender",
            "turn",
            "created_at",
            "sent_at",
            "steer_fallback",
        ]
        read_only_fields = fields

    def get_steer_fallback(self, queued: QueuedMessage) -> str | None:
        return self.context.get("steer_fallback") or None


class SteerOutput(serializers.ModelSerializer[Steer]):
    """A follow-up given to the running agent (strategy steer)."""

    steered = serializers.SerializerMethodField(
        help_text="Always true: the message went to the running turn, not to the queue."
    )
    steer_id = serializers.IntegerField(source="pk")
    turn = serializers.IntegerField(
        source="message_id", help_text="The id of the USER turn the message is stored as."
    )
    message_id = serializers.IntegerField(source="message.message_id")
    target = serializers.IntegerField(
        source="target_id", help_text="The id of the running ASSISTANT turn it was given to."
    )
    target_message_id = serializers.IntegerField(source="target.message_id")

    class Meta:
        model = Steer
        fields = [
            "steered",
            "steer_id",
            "status",
            "turn",
            "message_id",
            "target",
            "target_message_id",
            "attempt",
            "fallback_reason",
            "created_at",
            "delivered_at",
        ]
        read_only_fields = fields

    def get_steered(self, steer: Steer) -> bool:
        return True


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
