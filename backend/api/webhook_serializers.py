"""Input and output serializers for the webhook API. The secret is output once, on create."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from backend.api.serializers import StrictInput
from backend.webhooks.models import URL_MAX_LENGTH, EventType, WebhookDelivery, WebhookEndpoint


class WebhookCreateInput(StrictInput):
    url = serializers.CharField(max_length=URL_MAX_LENGTH)
    task = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="One of your tasks; absent or null: every task of your account.",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EventType.choices),
        allow_empty=False,
        required=False,
        help_text="Default: every event (turn.completed, turn.failed, turn.cancelled).",
    )

    def validate_events(self, value: list[Any]) -> list[Any]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("Name each event once.")
        return value


class WebhookOutput(serializers.ModelSerializer[WebhookEndpoint]):
    task = serializers.IntegerField(source="task_id", allow_null=True)

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "task", "events", "active", "created_at"]
        read_only_fields = fields


class WebhookCreatedOutput(WebhookOutput):
    secret = serializers.CharField(
        help_text="Signs every delivery (Baton-Signature). Shown only in this response."
    )

    class Meta(WebhookOutput.Meta):
        fields = [*WebhookOutput.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookDeliveryOutput(serializers.ModelSerializer[WebhookDelivery]):
    task = serializers.IntegerField(source="task_id")
    subtask = serializers.IntegerField(source="subtask_id")

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "event_id",
            "event_type",
            "task",
            "subtask",
            "status",
            "attempts",
            "last_status_code",
            "last_error",
            "next_attempt_at",
            "delivered_at",
            "created_at",
        ]
        read_only_fields = fields
