"""A task's status, recomputed from its latest round after every change that can finish a turn.

When that round has finished and a message is queued, the queued message's round starts first
(`start_next_queued`), so a queue never waits for another request to move on.
"""

from __future__ import annotations

from django.db import connection
from django.db.models import BooleanField, CharField, F, Subquery, Value
from django.utils import timezone

from backend import queries
from backend.prompting import Role
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    TURNS,
    QueuedMessage,
    QueuedMessageStatus,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    Task,
    TaskStatus,
)
from backend.tasks.services.rounds import _answer_stored_turn, _create_round


def refresh_task_status(*, task: Task) -> str:
    """Recompute the task's status from its latest round of turns and store it; when that
    round has finished and a message is queued, start the queued message's round first.
    Runs under the task's lock, after every change that can finish a turn."""
    if task.status == TaskStatus.CANCELLED:
        return task.status
    statuses, queued = _latest_round_statuses(task=task)
    if queued and not statuses & set(ACTIVE_SUBTASK_STATUSES) and start_next_queued(task=task):
        statuses = {SubtaskStatus.PENDING}
    if SubtaskStatus.RUNNING in statuses:
        status = TaskStatus.RUNNING
    elif SubtaskStatus.PENDING in statuses:
        status = TaskStatus.PENDING
    elif SubtaskStatus.FAILED in statuses:
        status = TaskStatus.FAILED
    else:
        status = TaskStatus.COMPLETED
    if status != task.status:
        task.status, task.updated_at = status, timezone.now()
        Task.objects.filter(pk=task.pk).update(status=status, updated_at=task.updated_at)
    return status


def _latest_round_statuses(*, task: Task) -> tuple[set[str], bool]:
    """The statuses of the turns of the task's latest round, and whether a message is queued,
    in one query (every result report asks): on PostgreSQL the named statement
    `latest_round_statuses`, elsewhere the ORM's query.

    The latest round is the one started last: the round of the task's highest-numbered
    answer, since a round's answers are numbered when it starts, after every turn before
    them. Not the round of the highest-numbered USER message: a steer that fell back to the
    queue is a turn numbered when it was sent, and its round may start after rounds of later
    messages (an `interrupt` sent meanwhile)."""
    if connection.vendor == "postgresql":
        rows = queries.fetch(
            "latest_round_statuses",
            {"task_id": task.pk},
            {
                "assistant_role": Role.ASSISTANT.value,
                "turn_kind": SubtaskKind.TURN.value,
                "queued": QueuedMessageStatus.QUEUED.value,
            },
        )
    else:
        rows = _latest_round_rows_by_orm(task=task)
    return {status for status, marker in rows if not marker}, any(marker for _, marker in rows)


def _latest_round_rows_by_orm(*, task: Task) -> list[tuple[str, bool]]:
    """`latest_round_statuses`' rows, by the ORM: SQLite's path and the statement's oracle."""
    latest = (
        Subtask.objects.filter(TURNS, task_id=task.pk, role=Role.ASSISTANT)
        .order_by("-message_id")
        .values("parent_message_id")[:1]
    )
    turns = Subtask.objects.filter(
        task_id=task.pk, role=Role.ASSISTANT, parent_message_id=Subquery(latest)
    ).values_list("status", Value(False, output_field=BooleanField()))
    # A part of a UNION has no order of its own (the models' default ordering is cleared).
    queued = QueuedMessage.objects.filter(
        task_id=task.pk, status=QueuedMessageStatus.QUEUED
    ).values_list(Value("", output_field=CharField()), Value(True, output_field=BooleanField()))
    return list(turns.order_by().union(queued.order_by(), all=True))


def start_next_queued(*, task: Task) -> list[Subtask]:
    """Start the round of the task's oldest queued message (its message_ids are allocated
    now, after every turn before it); none when nothing is queued. A steer that fell back to
    the queue is a USER turn already, older than any round a queued message will start: its
    answers start first. The caller holds the task's lock and has checked that no turn of the
    task is active."""
    queued = (
        task.queued_messages.filter(status=QueuedMessageStatus.QUEUED)
        .order_by(F("subtask_id").asc(nulls_last=True), "id")
        .first()
    )
    if queued is None:
        return []
    if queued.subtask is not None:
        turns = [queued.subtask, *_answer_stored_turn(task=task, user_turn=queued.subtask)]
    else:
        turns = _create_round(task=task, message=queued.message, sender=queued.sender)
    queued.status = QueuedMessageStatus.SENT
    queued.subtask = turns[0]
    queued.sent_at = turns[0].created_at
    queued.save(update_fields=["status", "subtask", "sent_at"])
    return turns
