"""Input and output shapes of the executor API."""

from __future__ import annotations

from rest_framework import serializers

from backend.api.serializers import StrictInput
from backend.dispatch.services import MAX_CLAIM_LIMIT
from backend.tasks.models import ExecutorKind


class DispatchInput(StrictInput):
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=ExecutorKind.choices), allow_empty=False
    )
    limit = serializers.IntegerField(min_value=1, max_value=MAX_CLAIM_LIMIT, default=1)
    worker_id = serializers.CharField(max_length=200)


class ClaimInput(StrictInput):
    worker_id = serializers.CharField(max_length=200)
    attempt = serializers.IntegerField(min_value=1)


class ProgressInput(ClaimInput):
    events = serializers.ListField(child=serializers.DictField(), default=list, max_length=1000)
    partial_text = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, allow_null=True
    )


class ResultInput(ClaimInput):
    status = serializers.ChoiceField(choices=["COMPLETED", "FAILED"])
    # Any JSON: the service says precisely what is wrong with a result that is not an object.
    result = serializers.JSONField(required=False, allow_null=True, default=None)
    error = serializers.CharField(
        required=False, allow_blank=True, default="", trim_whitespace=False
    )
    usage = serializers.JSONField(required=False, allow_null=True, default=None)
    native_session_id = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=200
    )


class ArtifactManifestEntry(serializers.Serializer):
    id = serializers.CharField()
    sha256 = serializers.CharField()
    kind = serializers.CharField()
    size_bytes = serializers.IntegerField()
    size_chars = serializers.IntegerField()
    size_lines = serializers.IntegerField()
    path = serializers.CharField()
    download_url = serializers.CharField()


class BotConfigOutput(serializers.Serializer):
    bot = serializers.CharField()
    executor = serializers.CharField()
    context_passing = serializers.CharField()
    pipeline_step = serializers.IntegerField()
    pipeline_length = serializers.IntegerField()


class DispatchedTurnOutput(serializers.Serializer):
    task_id = serializers.IntegerField()
    subtask_id = serializers.IntegerField()
    message_id = serializers.IntegerField()
    attempt = serializers.IntegerField()
    task_type = serializers.CharField()
    executor = serializers.CharField()
    bot = serializers.CharField()
    bot_config = BotConfigOutput()
    prompt = serializers.CharField()
    prompt_report = serializers.DictField()
    artifacts = ArtifactManifestEntry(many=True)
    native_session_id = serializers.CharField(allow_blank=True)
    lease_expires_at = serializers.DateTimeField()


class DispatchOutput(serializers.Serializer):
    turns = DispatchedTurnOutput(many=True)


class LeaseOutput(serializers.Serializer):
    subtask_id = serializers.IntegerField()
    status = serializers.CharField()
    attempt = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)


class ResultOutput(LeaseOutput):
    changed = serializers.BooleanField()
