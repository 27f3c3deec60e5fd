"""Steers: a follow-up given to the agent while it answers (strategy `steer`).

The message is stored at once as a USER turn (`message`), in order with everything else, and
this row follows its delivery to the running turn it was sent to (`target`, at `attempt`).
The worker holding that claim is offered it once, in a heartbeat's answer, and says whether
the executor took it; the target's answer then answers both. A steer that cannot get there — the
executor already made its last model call, the worker lost the claim, the attempt ended
without an answer — falls back to the queue (`QUEUED`): its USER turn gets a round of its own
when the turns before it have finished. When a newer message interrupts or rolls back that
turn instead, the new round answers it (`SUPERSEDED`): its prompt's history ends with the
steer, just before the newer message, and a round started after that message could not show
the model what came between.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from backend.tasks.models.tasks import Task
from backend.tasks.models.turns import Subtask


class SteerStatus(models.TextChoices):
    PENDING = "pending", "Waiting to be handed to the running agent"
    DELIVERED = "delivered", "Received by the running agent"
    QUEUED = "queued", "Fell back to the queue"
    # A newer message interrupted or rolled back the turn it was given to: the new round's
    # prompt shows it in its history, just before that message.
    SUPERSEDED = "superseded", "Read by the round of the message that stopped its turn"
    CANCELLED = "cancelled", "Its task was cancelled first"


class Steer(models.Model):
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="steers")
    message = models.OneToOneField(Subtask, on_delete=models.CASCADE, related_name="steer")
    target = models.ForeignKey(
        Subtask, on_delete=models.CASCADE, related_name="steers_received", db_index=False
    )
    attempt = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=SteerStatus.choices, default=SteerStatus.PENDING
    )
    # Why it fell back to the queue: what the worker said (`not_steerable`, `finished`,
    # `not_running`, `refused`) or what Baton saw (`not_running` at once, `attempt_ended`).
    fallback_reason = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # When a heartbeat's answer handed its text to the claim (`attempt`): once, so that a
    # long steer is not sent again twice a second while the executor takes it in.
    offered_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["task_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=SteerStatus.values), name="steer_status_valid"
            ),
        ]
        indexes = [
            # A claim's steers, by its turn: offered, settled and ended with the attempt.
            models.Index(fields=["target", "attempt"], name="steer_target_attempt"),
        ]

    def __str__(self) -> str:
        return f"steer {self.pk} of task {self.task_id} ({self.status})"
