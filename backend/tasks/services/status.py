"""A task's status, recomputed from its latest round after every change that can finish a turn.

When that round has finished and a message is queued, the queued message's round starts first
(`start_next_queued`), so a queue never waits for another request to move on.
"""

from __future__ import annotations

from django.db import connection
from django.utils import timezone

from backend import sql
from backend.prompting import Role
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    QueuedMessage,
    QueuedMessageStatus,
    Subtask,
    SubtaskStatus,
    Task,
    TaskStatus,
)
from backend.tasks.services.rounds import _create_round


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
        with connection.cursor() as cursor:
            # Every result report runs it: its SQL is written out (see `backend.sql`).
            cursor.execute(
                f"UPDATE {Task._meta.db_table} SET status = %s, updated_at = %s "  # noqa: S608
                "WHERE id = %s",
                [str(status), sql.when(task.updated_at), task.pk],
            )
    return status


def _latest_round_statuses(*, task: Task) -> tuple[set[str], bool]:
    """The statuses of the turns answering the task's latest USER message, and whether a
    message is queued, in one statement (every result report asks: its SQL is written out, see
    `backend.sql`)."""
    table, queue = Subtask._meta.db_table, QueuedMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT status, 0 FROM {table} WHERE task_id = %s "  # noqa: S608
            f"AND role = %s AND parent_message_id = (SELECT message_id FROM {table} "
            "WHERE task_id = %s AND role = %s ORDER BY message_id DESC LIMIT 1) "
            f"UNION ALL SELECT '', 1 WHERE EXISTS (SELECT 1 FROM {queue} WHERE task_id = %s "
            "AND status = %s)",
            [
                task.pk,
                Role.ASSISTANT.value,
                task.pk,
                Role.USER.value,
                task.pk,
                QueuedMessageStatus.QUEUED.value,
            ],
        )
        rows = cursor.fetchall()
    return {status for status, marker in rows if not marker}, any(marker for _, marker in rows)


def start_next_queued(*, task: Task) -> list[Subtask]:
    """Start the round of the task's oldest queued message (its message_ids are allocated
    now, after every turn before it); none when nothing is queued. The caller holds the task's
    lock and has checked that no turn of the task is active."""
    found = sql.rows_of(
        QueuedMessage,
        f"SELECT {sql.columns(QueuedMessage)} FROM {QueuedMessage._meta.db_table} "  # noqa: S608
        "WHERE task_id = %s AND status = %s ORDER BY id LIMIT 1",
        [task.pk, QueuedMessageStatus.QUEUED.value],
    )
    if not found:
        return []
    queued = found[0]
    turns = _create_round(task=task, message=queued.message, sender=queued.sender)
    queued.status = QueuedMessageStatus.SENT
    queued.subtask = turns[0]
    queued.sent_at = turns[0].created_at
    queued.save(update_fields=["status", "subtask", "sent_at"])
    return turns
