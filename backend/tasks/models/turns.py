"""A task's turns and summary jobs: the `Subtask` rows the dispatch queue claims."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from backend import executor_kinds
from backend.prompting.inputs import Role
from backend.prompting.policy import ContextPassing
from backend.tasks.fields import LosslessJSONField
from backend.tasks.models.tasks import Task

# What a pipeline step sees (`backend.prompting.ContextPassing`), labelled for the admin.
CONTEXT_PASSING_CHOICES = [
    (ContextPassing.NONE.value, "Current message only"),
    (ContextPassing.ORIGINAL_USER.value, "History and the user's message"),
    (ContextPassing.PREVIOUS_BOT.value, "History and the previous step's result"),
    (ContextPassing.ORIGINAL_AND_PREVIOUS.value, "History, user's message and previous result"),
]


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


class SubtaskKind(models.TextChoices):
    """A turn of the conversation, or a job that summarizes some of its turns."""

    TURN = "turn", "Turn"
    SUMMARY = "summary", "Summary job"


# The rows that are the task's conversation (summary jobs are not).
TURNS = Q(kind=SubtaskKind.TURN)


def message_name(message_id: int | None) -> str:
    """How Baton names a turn to the people who read it: by its message id in its task, the
    API's `message_id`, as the task's conversation numbers it ("message 7"). The subtask id
    (the API's turn `id`) is shown only where a path or a command takes it ("subtask 35")."""
    return f"message {message_id}"


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
    executor = models.CharField(max_length=32, choices=executor_kinds.CHOICES, blank=True)
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
    # While a turn runs, its partial answer is `partial_text` followed by the `ProgressPiece`
    # rows of its attempt, in offset order (`backend.tasks.partial_texts`): an append inserts a
    # row instead of rewriting this column, which PostgreSQL would copy whole. The pieces are
    # folded into `partial_text` once, when the attempt ends. `partial_text_chars` and
    # `partial_text_bytes` measure the whole partial answer (code points, UTF-8 bytes).
    progress_events = LosslessJSONField(null=True, blank=True)
    partial_text = models.TextField(blank=True)
    partial_text_chars = models.PositiveIntegerField(default=0)
    partial_text_bytes = models.PositiveIntegerField(default=0)
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
    # A USER turn sent with strategy `steer` (`Steer`): the message_id of the running turn it
    # was given to. Such a turn starts no round of its own unless it falls back to the
    # queue, which clears it when its round starts (numbered after every turn before them,
    # its answers make that round the task's latest, older as its message is).
    steered_into_message_id = models.PositiveIntegerField(null=True, blank=True)
    # An ASSISTANT turn: how many steers its current attempt was given that are not settled
    # yet (waiting to be handed over, or received and not yet answered). Read with the lease
    # (`leases.LEASE_COLUMNS`), so a heartbeat looks for steers only when there are some.
    steers_open = models.PositiveSmallIntegerField(default=0)

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
        return f"{self.name_in_task} ({self.role} {self.status})"

    @property
    def name(self) -> str:
        """The turn's name on its task's pages: "message 7" (`message_name`)."""
        return message_name(self.message_id)

    @property
    def name_in_task(self) -> str:
        """The turn's name anywhere else: "task 3 message 7"."""
        return f"task {self.task_id} {self.name}"
