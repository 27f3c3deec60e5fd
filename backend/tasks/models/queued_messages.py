"""Follow-ups waiting for the running turn of their task (the `enqueue` strategy)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from backend.tasks.models.tasks import Task
from backend.tasks.models.turns import Subtask


class QueuedMessageStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    SENT = "sent", "Sent"
    CANCELLED = "cancelled", "Cancelled"


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
