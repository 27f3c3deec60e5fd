"""What a task keeps of its conversation beside the turns: executor sessions and sealed
transcript parts.
"""

from __future__ import annotations

from django.db import models

from backend import executor_kinds
from backend.tasks.models.tasks import Task


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
    executor = models.CharField(max_length=32, choices=executor_kinds.CHOICES)
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
