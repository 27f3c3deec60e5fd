"""How the API shows a prompt report: the facts of one prompt a dispatch built, and the link
to it that each assistant turn carries. Counts, sizes and ids, never the prompt's text, which
Baton does not keep (`manage.py replay_prompt ID` rebuilds it from the turns)."""

from __future__ import annotations

from rest_framework import serializers

from backend.api.links import prompt_report_url
from backend.dispatch.models import PROMPT_KINDS, PromptReport
from backend.dispatch.selectors import ReportSteer
from backend.tasks.models import SteerStatus
from backend.tasks.services.steering import ATTEMPT_ENDED, WORKER_REFUSALS


class PromptReportLinkOutput(serializers.Serializer[PromptReport]):
    """One prompt a dispatch of the turn built. A dispatch that offered a resume built two,
    with the same `attempt`: the resume prompt and the full prompt."""

    id = serializers.IntegerField()
    url = serializers.SerializerMethodField(help_text="GET it for the report.")
    attempt = serializers.IntegerField(help_text="The dispatch (claim) that built it.")
    kind = serializers.ChoiceField(choices=PROMPT_KINDS)
    sent = serializers.BooleanField(
        allow_null=True, help_text="Whether the worker ran this prompt; null until it reports."
    )

    def get_url(self, report: PromptReport) -> str:
        return prompt_report_url(request=self.context["request"], report_id=report.pk)


class PromptReportSteerOutput(serializers.Serializer[ReportSteer]):
    """A follow-up sent with strategy steer to the turn while this claim ran it."""

    steer_id = serializers.IntegerField()
    message_id = serializers.IntegerField(
        help_text="The message id of the USER turn the follow-up is stored as."
    )
    # A string, not an enum, in the schema: the steer statuses already have an enum of their
    # own there (`SteerOutput`'s), and one more component with a `status` of the same choices
    # makes drf-spectacular name neither well without an ENUM_NAME_OVERRIDES entry.
    status = serializers.CharField(
        help_text="What became of it: "
        + "; ".join(f"{value}: {label.lower()}" for value, label in SteerStatus.choices)
        + ". Delivered: the turn's answer answers it too; queued: it gets its own answer."
    )
    delivered_at = serializers.DateTimeField(
        allow_null=True, help_text="When the agent received it; null unless delivered."
    )
    fallback_reason = serializers.CharField(
        help_text="Why it fell back to the queue (empty unless queued): one of "
        + ", ".join((*WORKER_REFUSALS, ATTEMPT_ENDED))
        + "."
    )


class PromptReportOutput(serializers.ModelSerializer[PromptReport]):
    """A prompt report as `GET /api/prompt-reports/{id}/` shows it."""

    task_id = serializers.IntegerField(help_text="The task.")
    subtask_id = serializers.IntegerField(
        help_text="The assistant turn the prompt was built for (its `id` in the task's turns)."
    )
    message_id = serializers.IntegerField(
        help_text="That turn's message id in its task: the turn is named by it."
    )
    kind = serializers.ChoiceField(
        choices=PROMPT_KINDS,
        help_text="`full`: the whole bounded prompt; `resume`: only what a native session "
        "had not seen. A dispatch that offered a resume built both.",
    )
    sent = serializers.BooleanField(
        allow_null=True, help_text="Whether the worker ran this prompt; null until it reports."
    )
    tokens = serializers.IntegerField(help_text="Counted with `token_encoding`.")
    token_budget = serializers.IntegerField(
        allow_null=True, help_text="The token cap the prompt was built under; null: none."
    )
    effective_max_tokens = serializers.IntegerField(
        allow_null=True, help_text="The budget in the bot's model's tokens; null: model unknown."
    )
    model_tokens = serializers.IntegerField(
        allow_null=True, help_text="The prompt's size in the model's tokens."
    )
    steers = PromptReportSteerOutput(
        many=True,
        read_only=True,
        help_text="The follow-ups sent with strategy steer to the turn while this claim (its "
        "`attempt`) ran it, oldest first; empty when none. The prompt did not hold them: the "
        "running agent was handed them (see each one's `status`).",
    )

    class Meta:
        model = PromptReport
        fields = [
            "id",
            "task_id",
            "subtask_id",
            "message_id",
            "attempt",
            "kind",
            "sent",
            "resume_reason",
            "retry_reason",
            "tokens",
            "token_encoding",
            "token_budget",
            "previous_token_budget",
            "effective_max_tokens",
            "model_tokens",
            "tokens_estimated",
            "chars",
            "bytes",
            "messages_considered",
            "messages_included",
            "messages_omitted",
            "truncated_count",
            "policy_source",
            "policy_version",
            "context_passing",
            "history_enabled",
            "prompt_sha256",
            "builder_version",
            "build_ms",
            "created_at",
            "steers",
        ]
        read_only_fields = fields
