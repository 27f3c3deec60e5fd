"""Tasks: one conversation each, with its status, pipeline, follow-up strategy and event log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from backend.tasks.follow_up_strategies import FollowUpStrategy

if TYPE_CHECKING:
    from backend.tasks.models.queued_messages import QueuedMessage
    from backend.tasks.models.turns import Subtask


TASK_TYPE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"

task_type_validator = RegexValidator(
    TASK_TYPE_PATTERN,
    "task_type must be 1-64 characters of lowercase letters, digits, '-' or '_', "
    "starting with a letter or digit (for example 'code' or 'chat').",
)


class TaskStatus(models.TextChoices):
    """The state of the task's latest round of turns."""

    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"


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


class TaskEvent(models.Model):
    """One entry of a task's event log (`backend.tasks.task_events`): numbered per task in
    commit order, so a client resuming after `seq` misses nothing and gets nothing twice. A
    turn's `turn.progress` entries are deleted once its attempt ends."""

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
        indexes = [
            # A turn's progress events, deleted when its attempt ends (`task_events`): only
            # those rows, so the index stays as small as the progress of the running turns.
            models.Index(
                fields=["subtask_id"],
                condition=Q(type="turn.progress"),
                name="task_event_progress_turn",
            ),
        ]

    def __str__(self) -> str:
        return f"event {self.seq} of task {self.task_id}: {self.type}"
