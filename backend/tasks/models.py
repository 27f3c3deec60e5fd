"""Tasks, their turns and the bots that answer them.

A `Task` is one conversation between a product's users and one or more agent bots. Each turn is a
`Subtask`: a USER message, or an ASSISTANT turn that an executor worker will run. A summary job
is a `Subtask` too (kind `summary`): an ASSISTANT row the dispatch queue claims, leases and
fences like a turn, but which is no part of the conversation — it answers no message, holds no
task's status, never blocks a follow-up and is never shown as a turn. Turns are
numbered by `message_id`, unique within the task and allocated from the task row's counter so
concurrent writers never collide (see `services.allocate_message_ids`). A `Bot` is a registered
agent: which executor runs it and with which model, instructions, permissions and limits. A
`LanguageModel` row is the model table: what a model's context window, maximum output and
tokenizer are, so a bot's model decides how much prompt it gets (backend/dispatch/budgets.py).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from backend.prompting.inputs import Role, validate_name
from backend.prompting.policy import ContextPassing
from backend.prompting.tokenizers import Tokenizer
from backend.tasks.fields import LosslessJSONField

DATED_SNAPSHOT = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")
"""A model name's dated snapshot suffix (`-20250929`, `-2025-04-14`)."""

TASK_TYPE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"

task_type_validator = RegexValidator(
    TASK_TYPE_PATTERN,
    "task_type must be 1-64 characters of lowercase letters, digits, '-' or '_', "
    "starting with a letter or digit (for example 'code' or 'chat').",
)


class ExecutorKind(models.TextChoices):
    CODEX = "codex", "OpenAI Codex CLI"
    CLAUDE_CODE = "claude_code", "Claude Code"
    AGNO = "agno", "Agno"


# What a pipeline step sees (`backend.prompting.ContextPassing`), labelled for the admin.
CONTEXT_PASSING_CHOICES = [
    (ContextPassing.NONE.value, "Current message only"),
    (ContextPassing.ORIGINAL_USER.value, "History and the user's message"),
    (ContextPassing.PREVIOUS_BOT.value, "History and the previous step's result"),
    (ContextPassing.ORIGINAL_AND_PREVIOUS.value, "History, user's message and previous result"),
]


class TaskStatus(models.TextChoices):
    """The state of the task's latest round of turns."""

    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"


# Who speaks in a turn (`backend.prompting.Role`), labelled for the admin.
ROLE_CHOICES = [(Role.USER.value, "User"), (Role.ASSISTANT.value, "Assistant")]


class SubtaskStatus(models.TextChoices):
    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    # Stopped by a newer message (the `interrupt` follow-up strategy): unlike a cancelled
    # turn it stays in the history, with what it had written by then.
    INTERRUPTED = "INTERRUPTED", "Interrupted"


ACTIVE_SUBTASK_STATUSES = (SubtaskStatus.PENDING, SubtaskStatus.RUNNING)
# A turn stopped by the product: its worker is told to stop the executor (409 `cancelled`).
STOPPED_SUBTASK_STATUSES = (SubtaskStatus.CANCELLED, SubtaskStatus.INTERRUPTED)


class FollowUpStrategy(models.TextChoices):
    """What a follow-up does when it arrives while a turn of its task is pending or running."""

    REJECT = "reject", "Refuse it (HTTP 409)"
    ENQUEUE = "enqueue", "Queue it; it is sent when the turns before it have finished"
    INTERRUPT = "interrupt", "Stop the running turn, keep what it wrote, send it now"
    ROLLBACK = "rollback", "Stop the running turn, drop it from the history, send it now"


class QueuedMessageStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    SENT = "sent", "Sent"
    CANCELLED = "cancelled", "Cancelled"


class SubtaskKind(models.TextChoices):
    """A turn of the conversation, or a job that summarizes some of its turns."""

    TURN = "turn", "Turn"
    SUMMARY = "summary", "Summary job"


# The rows that are the task's conversation (summary jobs are not).
TURNS = Q(kind=SubtaskKind.TURN)


INSTRUCTIONS_MAX_CHARS = 32_000


class PermissionMode(models.TextChoices):
    """What a bot's executor may do in its workspace."""

    FULL_ACCESS = "full_access", "Run commands and change files without asking"
    READ_ONLY = "read_only", "Read files only; no commands, no changes"


def validate_bot_name(value: str) -> None:
    """Bot names appear inside prompt role labels (`Assistant[reviewer]:`)."""
    try:
        validate_name(value)
    except ValueError as error:
        raise ValidationError(f"Bot name {error}.") from None


class Bot(models.Model):
    """A registered agent. Pipeline steps name bots; dispatch sends the bot's settings."""

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[validate_bot_name],
        help_text="Shown in prompts as Assistant[name] when a task has several bots.",
    )
    executor = models.CharField(max_length=32, choices=ExecutorKind.choices)
    model = models.CharField(
        max_length=200, blank=True, help_text="Model name the executor asks for; empty: its own."
    )
    # Executors take instructions as one command-line argument, which Linux caps at 128 KiB.
    instructions = models.TextField(
        blank=True,
        validators=[MaxLengthValidator(INSTRUCTIONS_MAX_CHARS)],
        help_text=f"The bot's system prompt (at most {INSTRUCTIONS_MAX_CHARS:,} characters).",
    )
    permission_mode = models.CharField(
        max_length=32, choices=PermissionMode.choices, default=PermissionMode.FULL_ACCESS
    )
    max_turns = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Model round trips the executor may take for one turn. Empty: no limit.",
    )
    timeout_seconds = models.PositiveIntegerField(
        default=1800,
        validators=[MinValueValidator(1)],
        help_text="A turn running longer is stopped and fails with error code timeout.",
    )
    context_window = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "The model's context window in tokens. Empty: the model table's figure for the "
            "bot's model."
        ),
    )
    # Learned from the executor's usage reports: the smallest (input tokens - the prompt's
    # tokens) seen for a turn run with a full prompt — what the executor's own system prompt
    # and tools take. Null until a turn reports usage (budgets.DEFAULT_OVERHEAD_TOKENS apply).
    overhead_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "Tokens the executor's own system prompt and tools take, learned from its usage "
            "reports (the smallest seen). Empty: a conservative default for the executor."
        ),
    )
    # Learned from the same reports (budgets.learn_token_ratio): the model's tokens per 1000
    # tokens Baton counts for its prompts, from a fit over the bot's recent full-prompt turns,
    # bounded on the safe side (prompting.tokenizers.fit_ratio). Null: the shipped factor.
    token_ratio_per_mille = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "The model's tokens per 1000 tokens Baton counts, learned from usage reports of "
            "full prompts (never below a safe floor nor above the shipped estimate). Empty: "
            "the shipped estimate."
        ),
    )
    # Nullable without a default, like the field above: SQLite adds such a column in place,
    # keeping the table's configuration-version triggers (dispatch migration 0013).
    token_ratio_samples = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Full-prompt turns the token ratio was last fitted on. Empty: never fitted.",
    )
    is_default = models.BooleanField(
        default=False,
        help_text="The bot a task gets when it names only an executor (one per executor).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["executor"], condition=Q(is_default=True), name="bot_one_default_per_kind"
            ),
            models.CheckConstraint(
                condition=Q(executor__in=ExecutorKind.values), name="bot_executor_valid"
            ),
            models.CheckConstraint(
                condition=Q(permission_mode__in=PermissionMode.values),
                name="bot_permission_mode_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.executor})"


class LanguageModel(models.Model):
    """One row of the model table: a model's window, maximum output and tokenizer.

    The project ships rows for the models the executors run (tasks migration 0013, figures
    from the providers' model documentation); the admin edits and extends them. A bot's model
    name finds its row exactly, or with a dated snapshot suffix removed
    (`claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`, `gpt-4.1-2025-04-14` → `gpt-4.1`).
    """

    name = models.CharField(
        max_length=200, unique=True, help_text="The model name a bot asks for (its API id)."
    )
    provider = models.CharField(max_length=32, blank=True)
    context_window = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Tokens of input and output together, as the provider advertises it.",
    )
    max_output_tokens = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="The most tokens one response may have."
    )
    max_input_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=(
            "The usable input when it is below the window less the output (a provider's input "
            "cap, or where an executor or the pricing makes more unusable). Empty: no such cap."
        ),
    )
    tokenizer = models.CharField(
        max_length=32,
        choices=[(tokenizer.value, tokenizer.value) for tokenizer in Tokenizer],
        help_text=(
            "o200k_base and cl100k_base are counted exactly; claude_3 (Claude 3 to Opus 4.6) "
            "and claude_4_7 (Opus 4.7 on) are counted with a calibrated safe-side estimate."
        ),
    )
    notes = models.TextField(blank=True, help_text="Where the figures come from, and caveats.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(tokenizer__in=[tokenizer.value for tokenizer in Tokenizer]),
                name="languagemodel_tokenizer_valid",
            ),
            models.CheckConstraint(
                condition=Q(max_output_tokens__lt=F("context_window")),
                name="languagemodel_output_within_window",
            ),
            models.CheckConstraint(
                condition=Q(max_input_tokens__isnull=True)
                | Q(max_input_tokens__lte=F("context_window") - F("max_output_tokens")),
                name="languagemodel_input_within_window",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def lookup_names(model: str) -> list[str]:
        """The names under which the table may list `model`: itself, then without a dated
        snapshot suffix."""
        undated = DATED_SNAPSHOT.sub("", model)
        return [model] if undated == model else [model, undated]


class Task(models.Model):
    # Indexed by `task_owner_recent` (owner, -created_at), which leads with it. A task's
    # status changes with every turn, and a change of an indexed column writes an entry to
    # every index of the table: so no index covers what another one already does, and the
    # links most tasks leave empty are indexed only where set.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tasks", db_index=False
    )
    title = models.CharField(max_length=200)
    task_type = models.CharField(max_length=64, validators=[task_type_validator])
    is_group_chat = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    # What a follow-up that arrives while a turn runs does, unless it names a strategy itself;
    # empty: BATON_FOLLOW_UP_STRATEGY.
    follow_up_strategy = models.CharField(
        max_length=16, choices=FollowUpStrategy.choices, blank=True, default=""
    )
    # Ordered bot steps: [{"bot": ..., "executor": ..., "context_passing": ...}, ...]; a
    # single-agent task is a pipeline of one step.
    pipeline = models.JSONField(default=list)
    # The next message_id to hand out; advanced atomically by services.allocate_message_ids.
    next_message_id = models.PositiveIntegerField(default=1)
    # The next number of the task's event log (backend.tasks.task_events).
    next_event_seq = models.PositiveBigIntegerField(default=1)
    # The latest transcript of the whole conversation a dispatched prompt's omission notice
    # pointed to (backend.tasks.transcripts): readable by the worker holding the task's turn.
    transcript = models.ForeignKey(
        "artifacts.Artifact",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="transcript_of",
        db_index=False,  # a partial index, see Meta
    )
    # The index of the turn files (one file per earlier turn) that came with that transcript
    # (backend.prompting.turn_files): readable, and kept, like the transcript.
    turn_index = models.ForeignKey(
        "artifacts.Artifact",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="turn_index_of",
        db_index=False,  # a partial index, see Meta
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The latest finished summary of the task's earlier turns (a completed summary job):
    # prompts that omit turns show it after their omission notice (backend.dispatch.summaries).
    summary = models.ForeignKey(
        "tasks.Subtask",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,  # a partial index, see Meta
    )
    # Not a column: the turns a task API response shows with the task, attached by the view
    # before serializing (see `TaskWithTurnsOutput`), and its queued messages likewise.
    turns_for_output: list[Subtask]
    queued_for_output: list[QueuedMessage]

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="task_owner_recent"),
            models.Index(fields=["status", "task_type"], name="task_status_type"),
            # An artifact's or a summary's deletion finds the tasks that name it.
            models.Index(
                fields=["transcript"],
                condition=Q(transcript__isnull=False),
                name="task_transcript",
            ),
            models.Index(
                fields=["turn_index"],
                condition=Q(turn_index__isnull=False),
                name="task_turn_index",
            ),
            models.Index(
                fields=["summary"], condition=Q(summary__isnull=False), name="task_summary"
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=TaskStatus.values), name="task_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(follow_up_strategy__in=["", *FollowUpStrategy.values]),
                name="task_follow_up_strategy_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    @property
    def is_multi_bot(self) -> bool:
        return len({step["bot"] for step in self.pipeline}) > 1


class Subtask(models.Model):
    # No index of its own: `subtask_message_id_unique` (task, message_id) leads with it, and
    # every index is written again by each claim and result (a change of status is never a
    # heap-only update, since partial indexes name it).
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="subtasks", db_index=False
    )
    kind = models.CharField(max_length=16, choices=SubtaskKind.choices, default=SubtaskKind.TURN)
    message_id = models.PositiveIntegerField()
    # For ASSISTANT turns: the USER message_id they answer.
    parent_message_id = models.PositiveIntegerField(null=True, blank=True)
    role = models.CharField(max_length=16, choices=ROLE_CHOICES)
    status = models.CharField(max_length=16, choices=SubtaskStatus.choices)
    sender = models.CharField(max_length=150, blank=True)
    bot = models.CharField(max_length=100, blank=True)
    pipeline_step = models.PositiveSmallIntegerField(null=True, blank=True)
    executor = models.CharField(max_length=32, choices=ExecutorKind.choices, blank=True)
    context_passing = models.CharField(max_length=32, choices=CONTEXT_PASSING_CHOICES, blank=True)
    # USER turns: the message text, stored exactly as sent.
    message = models.TextField(blank=True)
    # ASSISTANT turns: the executor's result as sent ({"value": "..."} carries the answer text).
    result = LosslessJSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Why the turn failed, or why its last attempt did (a requeued turn keeps it until it
    # finishes): context_overflow, rate_limited, upstream_error, timeout, cancelled, ...
    error_code = models.CharField(max_length=32, blank=True)
    # Token usage of this turn (never cumulative over a native session): see UsageInput.
    usage = LosslessJSONField(null=True, blank=True)
    native_session_id = models.CharField(max_length=200, blank=True)
    # When the turn became eligible for dispatch. Later pipeline steps stay PENDING with no
    # pending_since until the step before them completes.
    pending_since = models.DateTimeField(null=True, blank=True)
    # The executor worker holding (or, once finished, last holding) the claim: its account and
    # the worker_id it gave; `attempts` counts claims, so (claimed_by, lease_owner, attempts)
    # names one claim.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="claimed_subtasks",
    )
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # Claims a worker gave back unfinished on shutdown; they do not use up attempts.
    releases = models.PositiveIntegerField(default=0)
    # A turn requeued after a retryable failure waits until then (backoff).
    not_before = models.DateTimeField(null=True, blank=True)
    # After the model refused a prompt as too long (backend/dispatch/overflow.py): the most
    # tokens this turn's prompt may take, applied with the policy's cap (the lower wins), and
    # one entry per attempt whose prompt overflowed: {"attempt", "tokens", "max_tokens"}, what
    # its prompt took and the budget it was built under (null: no cap), with "resumed" and
    # "session_tokens" when it was a resumed native session's (retried fresh, not halved).
    # Requeues after an overflow do not use up attempts; BATON_CONTEXT_OVERFLOW_RETRIES bounds
    # the halvings.
    token_cap = models.PositiveIntegerField(null=True, blank=True)
    context_overflows = models.JSONField(default=list, blank=True)
    # The worker holding this bot's native session when the turn was created: it is offered
    # the turn first, for BATON_SESSION_AFFINITY_SECONDS, so it can resume the session.
    session_worker = models.CharField(max_length=200, blank=True)
    # Streamed progress from the executor: the latest events (bounded) and the partial answer.
    progress_events = LosslessJSONField(null=True, blank=True)
    partial_text = models.TextField(blank=True)
    progress_updated_at = models.DateTimeField(null=True, blank=True)

    # Measured once at ingestion (backend.tasks.ingestion.ingest_text), when the message or
    # result is recorded. Prompt building reads only these bounded fields, never `prompt` or
    # `result` themselves (docs/architecture.md, principle 1).
    # The text the history shows: the whole text, or for spilled text the rendered preview.
    history_text = models.TextField(blank=True)
    history_text_tokens = models.PositiveIntegerField(null=True, blank=True)
    # The same text's tokens under o200k_base (OpenAI's models): a prompt for a bot whose model
    # reads o200k_base reuses it as the cl100k_base count above is reused for the others. Null
    # on turns recorded before models' budgets: the builder then counts their text.
    history_text_tokens_o200k = models.PositiveIntegerField(null=True, blank=True)
    # For spilled text: the kept head and tail of the original.
    preview_head = models.TextField(blank=True)
    preview_tail = models.TextField(blank=True)
    # For a kind-aware preview, the parts kept between them and the elisions
    # (backend.prompting.truncate.Preview.layout); {} for a head + tail preview.
    preview_layout = models.JSONField(default=dict, blank=True)
    # Size of the whole text.
    history_chars = models.BigIntegerField(null=True, blank=True)
    history_bytes = models.BigIntegerField(null=True, blank=True)
    history_lines = models.BigIntegerField(null=True, blank=True)
    history_tokens = models.BigIntegerField(null=True, blank=True)
    # True when history_tokens counts the preview exactly and estimates the spilled middle.
    history_tokens_estimated = models.BooleanField(default=False)
    # Lone surrogates and NULs shown as U+FFFD in the history text (the result keeps them).
    history_replaced_chars = models.PositiveIntegerField(default=0)
    # The whole text as an artifact: stored at ingestion when the text spilled (history_text
    # is then its preview), or at dispatch when a prompt cut the text and pointed to it.
    artifact = models.ForeignKey(
        "artifacts.Artifact",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="subtasks",
        db_index=False,  # `subtask_artifact`: only the rows that name one
    )
    # True when the text spilled: history_text is the head + tail preview of the artifact.
    history_is_preview = models.BooleanField(default=False)
    # True when `result["value"]` is kept in the artifact instead of this row: `result` then
    # holds every other key as sent, with `"value": null` in its place. Long results stay out
    # of the database row, and `selectors.turn_result` puts the value back.
    result_value_in_artifact = models.BooleanField(default=False)
    recorded_at = models.DateTimeField(null=True, blank=True)
    # Summary jobs: the messages the summary covers (a fixed range), and the summary it folds
    # in (a rolling summary: the job reads that one and the turns after it, not all of them).
    summary_first_message_id = models.PositiveIntegerField(null=True, blank=True)
    summary_last_message_id = models.PositiveIntegerField(null=True, blank=True)
    summary_previous = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,  # `subtask_summary_previous`: only the rows that name one
    )
    # Not columns: what `selectors.task_turns` reads in place of `message`, `error`, `result`
    # and the spilled `history_text` (empty where the column holds a text that spilled).
    shown_message: str
    shown_error: str
    shown_result: Any
    shown_preview: str

    # Set by the service that stores a round, from the same clock reading as the user turn's
    # `finished_at`, so a user turn never reads as finished before it was created.
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A turn stopped while it ran (cancelled, interrupted, rolled back): when the worker that
    # held it confirmed that the executor's processes are gone. Null while they may still run.
    stop_confirmed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["task_id", "message_id"]
        constraints = [
            # Also the index behind "a task's turns by message_id".
            models.UniqueConstraint(
                fields=["task", "message_id"], name="subtask_message_id_unique"
            ),
            models.CheckConstraint(
                condition=Q(role__in=[role.value for role in Role]), name="subtask_role_valid"
            ),
            models.CheckConstraint(
                condition=Q(status__in=SubtaskStatus.values), name="subtask_status_valid"
            ),
            # At most one running turn per task: a pipeline's next step waits for the previous.
            # A summary job runs beside it: a dispatch never waits for a summary.
            models.UniqueConstraint(
                fields=["task"],
                condition=Q(status="RUNNING", kind="turn"),
                name="subtask_one_running_turn_per_task",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=SubtaskKind.values), name="subtask_kind_valid"
            ),
            # A summary job is an assistant row that answers no message and covers a range.
            models.CheckConstraint(
                condition=Q(kind="turn")
                | Q(
                    role="ASSISTANT",
                    parent_message_id__isnull=True,
                    summary_first_message_id__isnull=False,
                    summary_last_message_id__gte=F("summary_first_message_id"),
                ),
                name="subtask_summary_job_shape",
            ),
        ]
        indexes = [
            # Dispatch: the oldest eligible pending assistant turns, in the claim's order
            # (pending_since, id), so a claim reads the first few, not all of them, for one
            # executor kind or several (an index led by the kind sorts them all for several).
            models.Index(
                fields=["pending_since", "id"],
                condition=Q(status="PENDING", role="ASSISTANT", pending_since__isnull=False),
                name="subtask_dispatch_order",
            ),
            # Lease reclaim: running turns whose lease has expired.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="RUNNING"),
                name="subtask_running_lease",
            ),
            # A round's answers (the next pipeline step, the round's statuses for the task's
            # status): found by their parent message without reading the whole history.
            models.Index(fields=["task", "parent_message_id"], name="subtask_round"),
            # "Is a turn of this task pending or running?" (a follow-up, a cancel): the few
            # active rows, not every turn of a long task.
            models.Index(
                fields=["task"],
                condition=Q(status__in=["PENDING", "RUNNING"]),
                name="subtask_active_per_task",
            ),
            # "Has every turn this cancel stopped been confirmed stopped?" (a cancel that waits).
            models.Index(
                fields=["task"],
                condition=Q(
                    status__in=["CANCELLED", "INTERRUPTED"], stop_confirmed_at__isnull=True
                ),
                name="subtask_stop_unconfirmed",
            ),
            # The turns whose whole text is an artifact (an artifact's deletion, pruning) and
            # the summaries that fold in a summary: partial, so the many rows naming none
            # are in neither index and a claim or a result writes no entry to them.
            models.Index(
                fields=["artifact"],
                condition=Q(artifact__isnull=False),
                name="subtask_artifact",
            ),
            models.Index(
                fields=["summary_previous"],
                condition=Q(summary_previous__isnull=False),
                name="subtask_summary_previous",
            ),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} message {self.message_id} ({self.role} {self.status})"


class NativeSession(models.Model):
    """An executor's own session (Codex thread, Claude Code conversation) for one bot of a task.

    It lives on one worker's disk. Baton records which turns it has seen, so a later turn on
    that worker can resume it with only the turns it has not seen.
    """

    # Indexed by `native_session_per_bot`, which leads with it.
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="native_sessions", db_index=False
    )
    bot = models.CharField(max_length=100)
    executor = models.CharField(max_length=32, choices=ExecutorKind.choices)
    session_id = models.CharField(max_length=200)
    worker_id = models.CharField(max_length=200)
    # Every turn up to this message id is in the session's context (or was dropped from the
    # prompt that started it, with an omission notice).
    seen_through_message_id = models.PositiveIntegerField()
    seen_message_ids = models.JSONField(default=list)
    # Input tokens of the session's latest turn: about how full its context is.
    context_tokens = models.PositiveIntegerField(null=True, blank=True)
    turns = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["task_id", "bot"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "bot", "executor"], name="native_session_per_bot"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.executor} session of {self.bot} in task {self.task_id}"


class TranscriptPart(models.Model):
    """A sealed part of a task's transcript: a fixed number of consecutive earlier turns,
    rendered once (backend.tasks.transcripts.sealing).

    A part holds `span` consecutive turns in history: part `number` of a span holds the turns
    `number * span` to `(number + 1) * span - 1` of the history, counted from its first. Long
    parts (`TRANSCRIPT_PART_TURNS`) come first, then short ones
    (`TRANSCRIPT_SHORT_PART_TURNS`) for the turns after the last long part, until enough for
    a long one have finished. A part is sealed only when every turn in its range of message ids
    has finished: turns in history never change after that, so neither does the part. Its
    three artifacts are its piece of the transcript, its rows of the turn index and the list of
    its turn files.
    """

    # Indexed by `transcript_part_span_number`, which leads with it.
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="transcript_parts", db_index=False
    )
    span = models.PositiveIntegerField()
    number = models.PositiveIntegerField()
    first_message_id = models.PositiveIntegerField()
    last_message_id = models.PositiveIntegerField()
    # The message ids it shows, as inclusive runs [[first, last], ...] (a cancelled turn
    # between two shown ones splits a run).
    message_runs = models.JSONField()
    turns = models.PositiveIntegerField()
    # Of those, how many are the user's and the assistants': a history's totals (the omission
    # notice's counts) add these up instead of counting every turn again.
    users = models.PositiveIntegerField()
    assistants = models.PositiveIntegerField()
    # What it was rendered with: a part rendered otherwise is never used (and is replaced).
    is_group_chat = models.BooleanField()
    multi_bot = models.BooleanField()
    builder_version = models.CharField(max_length=32)
    transcript = models.ForeignKey("artifacts.Artifact", on_delete=models.PROTECT, related_name="+")
    turn_index = models.ForeignKey("artifacts.Artifact", on_delete=models.PROTECT, related_name="+")
    turn_files = models.ForeignKey("artifacts.Artifact", on_delete=models.PROTECT, related_name="+")
    # Each of the three as [id, sha256, size_bytes, size_chars, size_lines]: a dispatch reads
    # every part of its task, and this copy spares it three joins per part.
    pieces = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task_id", "-span", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "span", "number"], name="transcript_part_span_number"
            )
        ]

    def __str__(self) -> str:
        return f"part {self.number} of {self.span} turns of task {self.task_id}'s transcript"


class QueuedMessage(models.Model):
    """A follow-up that arrived while a turn of its task ran (strategy `enqueue`).

    It is not a turn yet: it gets its message_id, its USER turn and its PENDING answers when
    the turns before it have finished (`services.start_next_queued`), so the conversation
    reads in the order things happened even when a later message interrupted the queue. The
    row stays after that (`subtask` is the USER turn it became) or after it was withdrawn.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="queued_messages")
    message = models.TextField()
    sender = models.CharField(max_length=150, blank=True)
    status = models.CharField(
        max_length=16, choices=QueuedMessageStatus.choices, default=QueuedMessageStatus.QUEUED
    )
    subtask = models.OneToOneField(
        Subtask, on_delete=models.SET_NULL, null=True, blank=True, related_name="queued_as"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    sent_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Queued under the task's lock, so ids follow the order the messages arrived in.
        ordering = ["task_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=QueuedMessageStatus.values),
                name="queued_message_status_valid",
            ),
        ]
        indexes = [
            models.Index(
                fields=["task", "id"],
                condition=Q(status="queued"),
                name="queued_message_waiting",
            ),
        ]

    def __str__(self) -> str:
        return f"queued message {self.pk} of task {self.task_id} ({self.status})"


class TaskEvent(models.Model):
    """One entry of a task's event log (`backend.tasks.task_events`): numbered per task in
    commit order, so a client resuming after `seq` misses nothing and gets nothing twice."""

    # Indexed by `task_event_seq_unique`, which leads with it.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=32)
    # The turn it is about, if any (not a foreign key: the log outlives nothing it names, and
    # reading it never joins).
    subtask_id = models.BigIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["task_id", "seq"]
        constraints = [
            # Also the index a stream reads by: a task's events after a number.
            models.UniqueConstraint(fields=["task", "seq"], name="task_event_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"event {self.seq} of task {self.task_id}: {self.type}"
