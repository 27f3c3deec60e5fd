"""How the task API shows a task, its pipeline, its queued messages and the bots."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from backend.api.serializers.turns import SubtaskOutput
from backend.tasks.models import (
    Bot,
    QueuedMessage,
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
