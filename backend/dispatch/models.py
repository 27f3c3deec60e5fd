"""Per-task-type history policies and the report of every prompt Baton dispatched.

A `HistoryPolicy` row holds every cap of the prompt builder's `backend.prompting.PromptPolicy`
for one task type (or, with an empty task type, the default for types without a row of their
own). The spill threshold and preview sizes are not here: they apply once, at ingestion, to
content-addressed artifacts shared across tasks, so they are service settings
(BATON_SPILL_THRESHOLD_CHARS, BATON_PREVIEW_HEAD_CHARS, BATON_PREVIEW_TAIL_CHARS). The
summary fields say whether and how omitted history is summarized (backend/dispatch/summaries.py).
Rows are validated by that same pydantic model, versioned on each change, and take effect on
the next dispatch. A `PromptReport` records what one dispatch built — counts, sizes, ids,
flags and timing, never the prompt text (docs/architecture.md, principle 7).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from backend.prompting.policy import ContextPassing
from backend.prompting.units import DEFAULT_TOKEN_ENCODING, ENCODINGS

DEFAULT_TASK_TYPE = ""

# The kinds of prompt a dispatch builds: "full", the whole bounded prompt; "resume", only what
# a live native session has not seen. A dispatch that offers a resume builds both.
PROMPT_KINDS = ["full", "resume"]

CAP_HELP = {
    "enabled": (
        "History injection on or off. Off: the prompt is the current message only (plus the "
        "previous result for pipeline steps), as before history injection."
    ),
    "max_messages": (
        "Newest history turns considered (the pinned first user message counts). Empty: no cap."
    ),
    "max_chars": "Characters the Conversation History may take in total. Empty: no cap.",
    "per_message_max_chars": (
        "Each history message longer than this is cut to head + tail with a "
        "'…N chars truncated…' marker. Must not exceed max chars. Empty: no cap."
    ),
    "max_tokens": (
        "Tokens the whole prompt may take, counted exactly with the token encoding; the oldest "
        "history is dropped until it fits. At least 1024. Empty: no cap."
    ),
    "max_tokens_fraction": (
        "Share of the bot's model's context window the prompt may take, after the model's "
        "output and the executor's own system prompt and tools (above 0, at most 1); the "
        "prompt gets the smaller of this and max tokens. Empty: max tokens alone."
    ),
    "token_encoding": (
        "tiktoken encoding used to count tokens (one Baton bundles) when the bot's "
        "model is not in the model table; a listed model is counted with its own tokenizer."
    ),
    "keep_first_user_message": (
        "Keep the task's first user message in the history (it is the last thing dropped)."
    ),
    "previous_result_max_chars": (
        "A pipeline step's Previous Result is cut to this many characters. Empty: no cap."
    ),
    "current_message_max_chars": (
        "The current message is never dropped; above this it is cut head + tail (its full "
        "text stays stored). Empty: no cap."
    ),
    "context_passing": (
        "Default for pipeline steps that do not set their own: what a step sees besides "
        "history (none / original_user / previous_bot / original_and_previous)."
    ),
    "resume_native_sessions": (
        "When the bot's executor keeps a live session (Codex CLI, Claude Code) on the worker "
        "that claims the turn, send only the turns that session has not seen."
    ),
    "resume_max_context_fraction": (
        "A session whose last turn used more than this share of the bot's context window "
        "starts fresh with the full prompt instead."
    ),
    "summaries_enabled": (
        "Summarize omitted history: when prompts leave turns out, a summary job on the summary "
        "bot writes a rolling summary, which later prompts show after the omission notice. "
        "A dispatch never waits for it."
    ),
    "summary_bot": (
        "The registered bot that writes summaries (its executor, model and keys stay on the "
        "workers). Required when summaries are on."
    ),
    "summary_threshold_turns": (
        "A new summary job is scheduled when this many omitted turns are not covered by a "
        "summary yet; it folds the previous summary in."
    ),
    "summary_max_chars": (
        "A summary longer than this is cut head + tail in the prompt (its full text stays "
        "stored). Not counted against max chars; counted against max tokens, after the "
        "history messages. Empty: no cap."
    ),
}


class HistoryPolicy(models.Model):
    task_type = models.CharField(
        max_length=64,
        blank=True,
        unique=True,
        help_text="Task type this policy applies to; leave empty for the default policy.",
    )
    enabled = models.BooleanField(default=True, help_text=CAP_HELP["enabled"])
    max_messages = models.PositiveIntegerField(
        null=True, blank=True, default=20, help_text=CAP_HELP["max_messages"]
    )
    max_chars = models.PositiveIntegerField(
        null=True, blank=True, default=40_000, help_text=CAP_HELP["max_chars"]
    )
    per_message_max_chars = models.PositiveIntegerField(
        null=True, blank=True, default=4_000, help_text=CAP_HELP["per_message_max_chars"]
    )
    max_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text=CAP_HELP["max_tokens"]
    )
    max_tokens_fraction = models.FloatField(
        null=True, blank=True, default=0.5, help_text=CAP_HELP["max_tokens_fraction"]
    )
    token_encoding = models.CharField(
        max_length=64,
        # Only the bundled encodings: nothing is downloaded at run time.
        choices=[(name, name) for name in ENCODINGS],
        default=DEFAULT_TOKEN_ENCODING,
        help_text=CAP_HELP["token_encoding"],
    )
    keep_first_user_message = models.BooleanField(
        default=True, help_text=CAP_HELP["keep_first_user_message"]
    )
    previous_result_max_chars = models.PositiveIntegerField(
        null=True, blank=True, default=8_000, help_text=CAP_HELP["previous_result_max_chars"]
    )
    current_message_max_chars = models.PositiveIntegerField(
        null=True, blank=True, default=32_000, help_text=CAP_HELP["current_message_max_chars"]
    )
    context_passing = models.CharField(
        max_length=32,
        choices=[(mode.value, mode.value) for mode in ContextPassing],
        default=ContextPassing.ORIGINAL_AND_PREVIOUS.value,
        help_text=CAP_HELP["context_passing"],
    )
    resume_native_sessions = models.BooleanField(
        default=True, help_text=CAP_HELP["resume_native_sessions"]
    )
    resume_max_context_fraction = models.FloatField(
        default=0.8, help_text=CAP_HELP["resume_max_context_fraction"]
    )
    summaries_enabled = models.BooleanField(default=False, help_text=CAP_HELP["summaries_enabled"])
    # None (not ""): no bot chosen, as the builder's policy says it.
    summary_bot = models.CharField(
        max_length=64, null=True, blank=True, help_text=CAP_HELP["summary_bot"]
    )
    summary_threshold_turns = models.PositiveIntegerField(
        default=20, help_text=CAP_HELP["summary_threshold_turns"]
    )
    summary_max_chars = models.PositiveIntegerField(
        null=True, blank=True, default=4_000, help_text=CAP_HELP["summary_max_chars"]
    )
    # The fields this row sets. Every other field is inherited: from the default row (for a
    # task type's row), then the EXECUTOR_HISTORY_* environment, then Baton's built-in default.
    overrides = models.JSONField(
        default=list,
        blank=True,
        editable=False,
        help_text="The fields this row sets; the others are inherited.",
    )
    version = models.PositiveIntegerField(default=1, editable=False)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="+",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["task_type"]
        verbose_name = "history policy"
        verbose_name_plural = "history policies"

    def __str__(self) -> str:
        return f"{self.task_type or 'default'} policy v{self.version}"

    @property
    def is_default(self) -> bool:
        return self.task_type == DEFAULT_TASK_TYPE


class PromptReport(models.Model):
    """What one dispatch built: counts and flags, never the prompt text."""

    subtask = models.ForeignKey(
        "tasks.Subtask", on_delete=models.CASCADE, related_name="prompt_reports"
    )
    # Indexed by `promptreport_task_recent` (task, -created_at), which leads with it.
    task = models.ForeignKey(
        "tasks.Task", on_delete=models.CASCADE, related_name="prompt_reports", db_index=False
    )
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    # The worker account the claim went to: with (attempt, worker_id) it names the claim, so a
    # late report of a claim that another account has since taken over is told its lease is
    # lost, while an account that never held the turn learns nothing (backend/dispatch/leases.py).
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    policy = models.ForeignKey(
        HistoryPolicy, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # "row" (a HistoryPolicy row), or "settings" (no row: environment defaults).
    policy_source = models.CharField(max_length=16)
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    history_enabled = models.BooleanField()
    context_passing = models.CharField(max_length=32)
    messages_considered = models.PositiveIntegerField()
    messages_included = models.PositiveIntegerField()
    messages_omitted = models.PositiveIntegerField()
    omitted_user = models.PositiveIntegerField()
    omitted_assistant = models.PositiveIntegerField()
    truncated = models.JSONField(default=list)  # the history messages that were cut
    # Cuts in every section: the history's, plus the Current Message's and the Previous Result's.
    truncated_count = models.PositiveIntegerField()
    current_truncated = models.BooleanField(default=False)
    current_removed_chars = models.PositiveIntegerField(default=0)
    previous_result_truncated = models.BooleanField(default=False)
    previous_result_removed_chars = models.PositiveIntegerField(default=0)
    sections = models.JSONField(default=list)
    chars = models.PositiveIntegerField()
    bytes = models.PositiveIntegerField(default=0)  # UTF-8 size of the prompt
    tokens = models.PositiveIntegerField()
    history_tokens = models.PositiveIntegerField()
    current_tokens = models.PositiveIntegerField()
    previous_result_tokens = models.PositiveIntegerField()
    note_tokens = models.PositiveIntegerField(default=0)  # the escape note's, when present
    # The summary of omitted history the prompt showed: the messages it covers (null: none)
    # and its block's tokens (part of history_tokens).
    summary_first_message_id = models.PositiveIntegerField(null=True, blank=True)
    summary_last_message_id = models.PositiveIntegerField(null=True, blank=True)
    summary_tokens = models.PositiveIntegerField(default=0)
    token_encoding = models.CharField(max_length=64)
    # The budget from the bot's model (backend/dispatch/budgets.py): its context window (none
    # when the model is not known), the policy's share of it, the effective budget in the
    # model's tokens (the smaller of that share and max_tokens), and the prompt's size in the
    # model's tokens — exact, or a safe-side estimate when `tokens_estimated`.
    context_window = models.PositiveIntegerField(null=True, blank=True)
    max_tokens_fraction = models.FloatField(null=True, blank=True)
    output_reserve_tokens = models.PositiveIntegerField(default=0)
    overhead_tokens = models.PositiveIntegerField(default=0)
    effective_max_tokens = models.PositiveIntegerField(null=True, blank=True)
    model_tokens = models.PositiveIntegerField(null=True, blank=True)
    tokens_estimated = models.BooleanField(default=False)
    # The model's tokens per 1000 counted the budget converted with (null: no known model),
    # and whether the bot's usage taught it (else the shipped factor).
    token_ratio_per_mille = models.PositiveIntegerField(null=True, blank=True)
    token_ratio_learned = models.BooleanField(default=False)
    artifacts = models.JSONField(default=list)
    included_message_ids = models.JSONField(default=list)
    first_user_message_pinned = models.BooleanField()
    build_ms = models.FloatField()
    # "full": the whole bounded prompt; "resume": only what a live native session has not
    # seen. A dispatch that offers a resume stores both reports.
    kind = models.CharField(max_length=8, default="full")
    # Why a resume prompt was offered or not (resume, no_session, other_worker, ...).
    resume_reason = models.CharField(max_length=32, blank=True)
    # The token budget the prompt was built under: the policy's max_tokens, lowered by the
    # turn's own cap after a context overflow (null: no cap). When a context overflow requeued
    # the turn, why it was built again ("context_overflow") and the budget of the prompt that
    # overflowed (what it took), so the report shows the previous budget and the new one.
    token_budget = models.PositiveIntegerField(null=True, blank=True)
    retry_reason = models.CharField(max_length=32, blank=True)
    previous_token_budget = models.PositiveIntegerField(null=True, blank=True)
    # Which of the dispatch's prompts the worker sent (set when the result is reported).
    sent = models.BooleanField(null=True, blank=True)
    # What rebuilds the prompt byte for byte (backend/dispatch/replay.py), without its text:
    # the rendering rules' version, the policy as resolved, the build input's turn ids, counts
    # and flags, and the sha256 of the prompt sent. Empty on reports made before replay.
    builder_version = models.CharField(max_length=32, blank=True)
    policy_snapshot = models.JSONField(default=dict, blank=True)
    input_snapshot = models.JSONField(default=dict, blank=True)
    prompt_sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["task", "-created_at"], name="promptreport_task_recent")]
        constraints = [
            models.CheckConstraint(
                condition=Q(policy_source__in=["row", "settings"]),
                name="promptreport_policy_source_valid",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=PROMPT_KINDS), name="promptreport_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        # The turn's name ("task 3 message 7") would cost its row: the admin lists it beside.
        return (
            f"prompt report {self.pk} ({self.kind}, attempt {self.attempt}) of task {self.task_id}"
        )


class ConfigurationVersion(models.Model):
    """One row whose `value` changes whenever a bot, a model table entry or a history policy
    does: database triggers (migration 0013) write a value never written before on every
    insert, update, delete or truncate of those tables, whoever makes it (the admin, the API,
    a migration, SQL by hand), in the writer's transaction. A dispatch reads it in its claim
    statement and reuses what its process read of those tables under the same value
    (`backend.dispatch.configuration`). No row (a table flushed): nothing is reused."""

    value = models.BigIntegerField()

    def __str__(self) -> str:
        return f"configuration version {self.value}"
