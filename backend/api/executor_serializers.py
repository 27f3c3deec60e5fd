"""Input and output shapes of the executor API.

The dispatch output needs the request in its context: its artifact manifest carries absolute
download URLs (`artifact_serializers.ArtifactManifestEntryOutput`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import serializers

from backend import executor_kinds
from backend.api.artifact_serializers import ArtifactManifestEntryOutput
from backend.api.errors import ErrorOutput, invalid_input_detail
from backend.api.links import artifact_download_urls
from backend.api.serializers import (
    ExecutorTextField,
    ResultField,
    StrictInput,
    UsageFields,
    attempt_field,
    row_id_field,
)
from backend.artifacts.selectors import ManifestPart
from backend.dispatch.claims import MAX_CLAIM_LIMIT
from backend.dispatch.reports import REPORT_STATUSES
from backend.tasks.models import SubtaskKind
from backend.tasks.services import steering

ERROR_CODE_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class DispatchInput(StrictInput):
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=executor_kinds.CHOICES), allow_empty=False
    )
    limit = serializers.IntegerField(min_value=1, max_value=MAX_CLAIM_LIMIT, default=1)
    worker_id = serializers.CharField(max_length=200)
    wait_seconds = serializers.FloatField(
        min_value=0,
        default=0,
        help_text=(
            "With nothing to claim, hold the request up to this many seconds (at most "
            "BATON_DISPATCH_MAX_WAIT_SECONDS) until a turn can be claimed; 0 answers at once."
        ),
    )

    def validate_wait_seconds(self, value: float) -> float:
        limit = settings.BATON_DISPATCH_MAX_WAIT_SECONDS
        if value > limit:
            raise serializers.ValidationError(f"Ensure this value is at most {limit:g} seconds.")
        return value


class ClaimInput(StrictInput):
    worker_id = serializers.CharField(max_length=200)
    attempt = attempt_field()


class ClaimQuery(ClaimInput):
    """The claim, named in a query string, where every value is text."""

    strict_types = False


class ProgressFields(StrictInput):
    """A running turn's progress: events, and its partial answer whole or what it gained."""

    events = serializers.ListField(child=serializers.DictField(), default=list, max_length=1000)
    partial_text = ExecutorTextField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        allow_null=True,
        help_text=(
            "The whole partial answer, replacing the stored one: after a replaced answer, or "
            "when the worker does not know what Baton holds."
        ),
    )
    partial_text_append = ExecutorTextField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text=(
            "What the partial answer gained since the last post Baton accepted; with "
            "partial_text_offset. The whole stays within BATON_MAX_MESSAGE_BYTES."
        ),
    )
    partial_text_offset = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text=(
            "The length, in code points, the stored partial text must have for the append to "
            "apply (that answer's partial_text_chars); else 409 partial_text_mismatch."
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if ("partial_text_append" in attrs) != ("partial_text_offset" in attrs):
            missing = (
                "partial_text_offset" if "partial_text_append" in attrs else "partial_text_append"
            )
            raise serializers.ValidationError(
                {missing: ["Send partial_text_append and partial_text_offset together."]}
            )
        if "partial_text_append" in attrs and attrs.get("partial_text") is not None:
            raise serializers.ValidationError(
                {"partial_text": ["Send either partial_text or partial_text_append, not both."]}
            )
        return attrs


class SteerResultInput(StrictInput):
    steer_id = row_id_field()
    delivered = serializers.BooleanField(help_text="Whether the running agent received it.")
    refusal = serializers.ChoiceField(
        choices=steering.WORKER_REFUSALS,
        required=False,
        allow_null=True,
        default=None,
        help_text="Why not, when not delivered; the steer then falls back to the queue.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs["delivered"] and attrs["refusal"] is None:
            raise serializers.ValidationError({"refusal": ["Say why it was not delivered."]})
        if attrs["delivered"] and attrs["refusal"] is not None:
            raise serializers.ValidationError({"refusal": ["A delivered steer has none."]})
        return attrs


def steer_results_field() -> SteerResultInput:
    return SteerResultInput(
        many=True,
        required=False,
        default=list,
        help_text=(
            "What became of the steers the claim was handed: each one's id, and whether the "
            "agent received it. Sent again until a heartbeat or the report is answered; "
            "a result Baton already holds changes nothing."
        ),
    )


def steer_results(entries: list[dict[str, Any]]) -> dict[int, str | None]:
    """A claim's steer results as `steering.settle_steers` takes them."""
    return {
        entry["steer_id"]: None if entry["delivered"] else entry["refusal"] for entry in entries
    }


class ClaimRef(StrictInput):
    subtask_id = row_id_field()
    attempt = attempt_field()
    steers = steer_results_field()
    progress = ProgressFields(
        required=False,
        help_text=(
            "The turn's progress since the last heartbeat, as a progress post would carry it; "
            "its outcome comes back in the answer's `progress` (code `invalid`, naming the "
            "field, when it is not valid: the other claims' progress is stored all the same)."
        ),
    )

    def to_internal_value(self, data: Any) -> Any:
        """The claim, with its progress validated on its own: progress that is not valid is
        refused in this claim's part of the answer (`progress_refused`, naming the field),
        and neither fails the heartbeat nor keeps the other claims' progress from being
        stored."""
        if not isinstance(data, Mapping) or "progress" not in data:
            return super().to_internal_value(data)
        progress = data["progress"]
        attrs = super().to_internal_value(
            {name: value for name, value in data.items() if name != "progress"}
        )
        try:
            attrs["progress"] = self.fields["progress"].run_validation(progress)
        except serializers.ValidationError as error:
            attrs["progress_refused"] = invalid_input_detail(error.detail, prefix="progress")
        return attrs


class HeartbeatInput(StrictInput):
    worker_id = serializers.CharField(max_length=200)
    # DRF passes max_length on to the ListSerializer that many=True builds; the stubs do not
    # list it yet.
    turns = ClaimRef(many=True, max_length=MAX_CLAIM_LIMIT)  # type: ignore[call-arg]

    def validate_turns(self, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        claims = [(turn["subtask_id"], turn["attempt"]) for turn in turns]
        if len(set(claims)) != len(claims):
            raise serializers.ValidationError("Name each claim (subtask_id, attempt) once.")
        return turns


class ProgressInput(ClaimInput, ProgressFields):
    pass


class ResultInput(ClaimInput):
    steers = steer_results_field()
    status = serializers.ChoiceField(
        choices=REPORT_STATUSES,
        help_text=(
            "COMPLETED or FAILED finish the turn; RETRY (a transient failure) requeues it "
            "after a backoff until BATON_MAX_ATTEMPTS; RELEASE gives it back unfinished."
        ),
    )
    # Any JSON: the service says precisely what is wrong with a result that is not an object.
    result = ResultField(required=False, allow_null=True, default=None)
    # What the executor said when it failed (its stderr): stored as a partial answer is.
    error = ExecutorTextField(required=False, allow_blank=True, default="", trim_whitespace=False)
    error_code = serializers.RegexField(
        ERROR_CODE_PATTERN,
        required=False,
        allow_blank=True,
        default="",
        help_text=(
            "Why the run did not complete: context_overflow, rate_limited, upstream_error, "
            "network_error, auth_error, max_turns, timeout, artifact_error, executor_error, "
            "shutdown, ..."
        ),
        error_messages={"invalid": "Use a lowercase code such as upstream_error."},
    )
    usage = UsageFields(required=False, allow_null=True, default=None)
    native_session_id = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=200
    )
    session_resumed = serializers.BooleanField(
        required=False,
        default=False,
        help_text=(
            "True when the executor resumed the offered native session with resume_prompt; "
            "false when it ran the full prompt (in a fresh session)."
        ),
    )
    value_upload = serializers.RegexField(
        SHA256_PATTERN,
        required=False,
        allow_blank=True,
        default="",
        help_text=(
            "The sha256 a value upload (PUT .../result/value/) answered: the result's value is "
            "that text, and result.value is null or absent. COMPLETED only."
        ),
        error_messages={"invalid": "Use the sha256 the value upload answered (64 hex digits)."},
    )


class ValueUploadOutput(serializers.Serializer[dict[str, Any]]):
    value_upload = serializers.CharField(
        help_text="The value's sha256: name it as value_upload in the result report."
    )
    artifact_id = serializers.CharField()
    size_chars = serializers.IntegerField()
    size_bytes = serializers.IntegerField()
    size_lines = serializers.IntegerField()


class BotConfigOutput(serializers.Serializer[dict[str, Any]]):
    bot = serializers.CharField()
    executor = serializers.CharField()
    model = serializers.CharField(allow_blank=True)
    instructions = serializers.CharField(allow_blank=True)
    permission_mode = serializers.CharField()
    max_turns = serializers.IntegerField(allow_null=True)
    timeout_seconds = serializers.IntegerField()
    context_window = serializers.IntegerField(
        allow_null=True,
        help_text="The bot's context window, else the model table's for its model (null: unknown).",
    )
    context_passing = serializers.CharField()
    pipeline_step = serializers.IntegerField()
    pipeline_length = serializers.IntegerField()


class NativeSessionOutput(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    worker_id = serializers.CharField()
    seen_through_message_id = serializers.IntegerField()


class SummaryRangeOutput(serializers.Serializer[dict[str, Any]]):
    first_message_id = serializers.IntegerField()
    last_message_id = serializers.IntegerField()


class ManifestPartOutput(serializers.Serializer[ManifestPart]):
    id = serializers.CharField()
    sha256 = serializers.CharField()
    size_bytes = serializers.IntegerField()
    download_url = serializers.SerializerMethodField(help_text="GET it for its bytes.")

    def get_download_url(self, part: ManifestPart) -> str:
        return artifact_download_urls(request=self.context["request"])(part.id)


class ManifestEntryOutput(ArtifactManifestEntryOutput):
    parts = ManifestPartOutput(
        many=True,
        allow_null=True,
        help_text=(
            "A composite file (manifest_version 2): the file at `path` is these parts' bytes "
            "in order, each checked against its own sha256 (`sha256` names the composite, not "
            "the file's bytes). Null for a plain artifact."
        ),
    )


class DispatchedTurnOutput(serializers.Serializer[dict[str, Any]]):
    task_id = serializers.IntegerField()
    subtask_id = serializers.IntegerField()
    kind = serializers.ChoiceField(
        choices=SubtaskKind.choices,
        help_text=(
            "turn, or summary: a job that writes a rolling summary of the messages in `summary` "
            "(run and report it like a turn; its answer is the summary)."
        ),
    )
    summary = SummaryRangeOutput(allow_null=True)
    message_id = serializers.IntegerField()
    attempt = serializers.IntegerField()
    task_type = serializers.CharField()
    executor = serializers.CharField()
    bot = serializers.CharField()
    bot_config = BotConfigOutput()
    prompt = serializers.CharField()
    prompt_report = serializers.DictField()
    artifacts = ManifestEntryOutput(many=True)
    artifact_lists = ManifestPartOutput(
        many=True,
        help_text=(
            "Lists of more history files (manifest_version 2): each a JSON document "
            '`{"files": [...]}` whose entries are manifest entries without `download_url` '
            "(`artifact_url_template` gives it): one list per sealed part of a long transcript."
        ),
    )
    artifact_url_template = serializers.CharField(
        help_text="An artifact's download URL, with `{id}` in place of its id."
    )
    manifest_version = serializers.IntegerField(
        help_text=(
            "1: every file is a plain artifact. 2: `parts` and `artifact_lists` may be used. A "
            "worker that knows a lower version must not run the turn."
        )
    )
    native_session_id = serializers.CharField(allow_blank=True)
    native_session = NativeSessionOutput(allow_null=True)
    resume_prompt = serializers.CharField(
        allow_null=True,
        help_text="Only what the native session has not seen; null when no resume is offered.",
    )
    resume_prompt_report = serializers.DictField(allow_null=True)
    resume_reason = serializers.CharField(
        help_text="resume, or why not: no_session, other_worker, context_full, policy_off, ..."
    )
    lease_expires_at = serializers.DateTimeField()
    heartbeat_interval_seconds = serializers.IntegerField()


class DispatchOutput(serializers.Serializer[dict[str, Any]]):
    turns = DispatchedTurnOutput(many=True)
    next_ready_in_seconds = serializers.FloatField(
        allow_null=True,
        help_text=(
            "When no turn was claimed: seconds until a pending turn of these kinds may be "
            "claimed (0: now), null when none is pending."
        ),
    )


class LeaseStateOutput(serializers.Serializer[dict[str, Any]]):
    subtask_id = serializers.IntegerField()
    attempt = serializers.IntegerField()
    state = serializers.ChoiceField(choices=["running", "cancelled", "lease_lost", "finished"])
    lease_expires_at = serializers.DateTimeField(allow_null=True)


class ProgressOutcomeOutput(serializers.Serializer[dict[str, Any]]):
    stored = serializers.BooleanField()
    partial_text_chars = serializers.IntegerField(
        allow_null=True,
        help_text=(
            "The stored partial text's length in code points (the next append's offset), when "
            "stored and with code partial_text_mismatch; else null."
        ),
    )
    code = serializers.CharField(
        allow_null=True,
        help_text=(
            "Why it was not stored, as a progress post would have been answered: "
            "partial_text_mismatch (send the whole text), lease_lost, cancelled, not_found, "
            "too_large, invalid."
        ),
    )
    detail = serializers.CharField(allow_null=True)


class SteerOfferOutput(serializers.Serializer[dict[str, Any]]):
    steer_id = serializers.IntegerField()
    message = serializers.CharField(help_text="The follow-up, to give the running agent.")


class HeartbeatTurnOutput(LeaseStateOutput):
    progress = ProgressOutcomeOutput(
        required=False, help_text="Only for a claim whose heartbeat carried progress."
    )
    steers = SteerOfferOutput(
        many=True,
        required=False,
        help_text=(
            "Follow-ups sent with strategy steer, for the running agent, oldest first; only "
            "for a running claim that has some not yet handed over. Each is listed once: hand "
            "it to the executor then, and say what became of it (the heartbeat's or report's "
            "`steers`); one the claim never answers falls back to the queue when its attempt "
            "ends."
        ),
    )


class HeartbeatOutput(serializers.Serializer[dict[str, Any]]):
    turns = HeartbeatTurnOutput(many=True)
    heartbeat_interval_seconds = serializers.IntegerField()


class LeaseOutput(serializers.Serializer[dict[str, Any]]):
    subtask_id = serializers.IntegerField()
    status = serializers.CharField()
    attempt = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)


class ProgressOutput(LeaseOutput):
    partial_text_chars = serializers.IntegerField(
        help_text="The stored partial text's length in code points: the next append's offset."
    )


class ProgressConflictOutput(ErrorOutput):
    """A refused progress post: Baton's error body, and for `partial_text_mismatch` the
    stored partial text's length."""

    partial_text_chars = serializers.IntegerField(
        required=False,
        help_text="With code partial_text_mismatch: the stored partial text's length.",
    )


class ResultOutput(LeaseOutput):
    changed = serializers.BooleanField()
