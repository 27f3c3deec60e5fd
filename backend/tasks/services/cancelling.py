"""Stopping turns: cancelling a task or one turn, and the interrupt and rollback of a follow-up.

A stopped turn that a worker may be running waits for its worker's confirmation
(`stop_confirmed_at`); the worker learns of the stop from its next heartbeat, and a late result
from it is refused.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Case, When
from django.utils import timezone

from backend.artifacts.services import (
    atomic_storing_artifacts,
)
from backend.errors import Conflict, NotFound
from backend.prompting import Role
from backend.tasks import task_events
from backend.tasks.ingestion import (
    ingest_text,
)
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    TURNS,
    QueuedMessageStatus,
    Subtask,
    SubtaskStatus,
    Task,
    TaskStatus,
)
from backend.tasks.partial_texts import end_attempts
from backend.tasks.services.rounds import _apply_ingestion, lock_task
from backend.tasks.services.status import refresh_task_status
from backend.tasks.services.steering import end_steers
from backend.tasks.turn_events import (
    announce_ended_turns,
)


def _stop_confirmed_at(turn: Subtask, *, now: Any) -> Any:
    """For a turn being stopped: None while a worker may be running it (its worker confirms
    the stop, `backend.dispatch.reports.confirm_stopped`), else `now` — nothing ran."""
    return None if turn.status == SubtaskStatus.RUNNING else now


INTERRUPTED_NOTE = "Interrupted by the next message before it finished."


def interrupted_history_text(partial_text: str) -> str:
    """What an interrupted turn shows the model: that it was stopped, and what it had written
    (its streamed partial answer) — the work it did may show in the workspace."""
    if not partial_text.strip():
        return f"{INTERRUPTED_NOTE} It had not written any text yet."
    return f"{INTERRUPTED_NOTE} What it had written by then:\n\n{partial_text}"


def _stop_turns(*, task: Task, turns: list[Subtask], interrupt: bool) -> list[Subtask]:
    """Stop a round's active turns for a follow-up that starts now. `interrupt`: a RUNNING
    turn becomes INTERRUPTED and keeps what it wrote in the history; every other one (and
    every one on a rollback) is CANCELLED. The worker holding a stopped turn is told to stop
    its executor by its next heartbeat, and a late result from it is refused."""
    now = timezone.now()
    code = "interrupted" if interrupt else "rolled_back"
    end_attempts(turns=turns)  # an interrupted turn's history shows its whole partial text
    for turn in turns:
        turn.stop_confirmed_at = _stop_confirmed_at(turn, now=now)
        if interrupt and turn.status == SubtaskStatus.RUNNING:
            turn.status = SubtaskStatus.INTERRUPTED
            turn.error = INTERRUPTED_NOTE
            text = interrupted_history_text(turn.partial_text)
            _apply_ingestion(turn, ingest_text(text=text, task=task), recorded_at=now)
        else:
            turn.status = SubtaskStatus.CANCELLED
        turn.error_code = code
        turn.lease_expires_at = None
        turn.not_before = None
        turn.finished_at = now
        turn.save()
    end_steers(turns=turns, task=task, superseded=True)
    task_events.record(task_id=task.pk, events=[task_events.finished_event(t) for t in turns])
    announce_ended_turns(task=task, turns=turns, occurred_at=now)
    return turns


def cancel_task(*, task: Task) -> Task:
    """Cancel the task, every turn still PENDING or RUNNING and every queued message.
    Cancelling twice is a no-op."""
    with transaction.atomic():
        task = lock_task(task_id=task.pk)
        if task.status == TaskStatus.CANCELLED:
            return task
        now = timezone.now()
        stopped = list(
            task.subtasks.filter(TURNS, status__in=ACTIVE_SUBTASK_STATUSES).order_by("message_id")
        )
        task.subtasks.filter(status__in=ACTIVE_SUBTASK_STATUSES).update(
            status=SubtaskStatus.CANCELLED,
            error_code="cancelled",
            lease_expires_at=None,
            not_before=None,
            finished_at=now,
            updated_at=now,
            stop_confirmed_at=Case(When(status=SubtaskStatus.RUNNING, then=None), default=now),
        )
        task.queued_messages.filter(status=QueuedMessageStatus.QUEUED).update(
            status=QueuedMessageStatus.CANCELLED, cancelled_at=now
        )
        for turn in stopped:
            turn.status, turn.error_code = SubtaskStatus.CANCELLED, "cancelled"
        end_attempts(turns=stopped)
        task.status = TaskStatus.CANCELLED  # its steers are cancelled with it
        end_steers(turns=stopped, task=task)
        task_events.record(
            task_id=task.pk, events=[task_events.finished_event(turn) for turn in stopped]
        )
        task.status = TaskStatus.CANCELLED
        task.save(update_fields=["status", "updated_at"])
        announce_ended_turns(task=task, turns=stopped, occurred_at=now)
    return task


def cancel_turn(*, task: Task, subtask_id: int) -> list[Subtask]:
    """Stop one PENDING or RUNNING assistant turn ("stop generating"); the task stays open.

    The later pipeline steps of the same round are cancelled with it (they would have had
    nothing to build on). A worker running the turn learns it from its next heartbeat or
    progress report (HTTP 409 with code `cancelled`) and stops the executor. The next queued
    message, if any, then starts its round (`refresh_task_status`). Returns the turns
    cancelled, in message order.
    """
    with atomic_storing_artifacts():
        task = lock_task(task_id=task.pk)
        subtask = (
            Subtask.objects.select_for_update()
            .filter(TURNS, pk=subtask_id, task_id=task.pk, role=Role.ASSISTANT)
            .first()
        )
        if subtask is None:
            raise NotFound(f"Task {task.pk} has no assistant turn of subtask id {subtask_id}.")
        if subtask.status not in ACTIVE_SUBTASK_STATUSES:
            raise Conflict(
                f"{subtask.name_in_task.capitalize()} is already {subtask.status}; only "
                "pending or running turns can be cancelled."
            )
        turns = list(
            Subtask.objects.select_for_update()
            .filter(
                task_id=task.pk,
                parent_message_id=subtask.parent_message_id,
                role=Role.ASSISTANT,
                status__in=ACTIVE_SUBTASK_STATUSES,
                pipeline_step__gte=subtask.pipeline_step or 0,
            )
            .order_by("message_id")
        )
        now = timezone.now()
        for turn in turns:
            turn.stop_confirmed_at = _stop_confirmed_at(turn, now=now)
            turn.status = SubtaskStatus.CANCELLED
            turn.error_code = "cancelled"
            turn.lease_expires_at = None
            turn.not_before = None
            turn.finished_at = now
        Subtask.objects.bulk_update(
            turns,
            [
                "status",
                "error_code",
                "lease_expires_at",
                "not_before",
                "finished_at",
                "stop_confirmed_at",
            ],
        )
        Subtask.objects.filter(pk__in=[turn.pk for turn in turns]).update(updated_at=now)
        end_attempts(turns=turns)
        end_steers(turns=turns, task=task)
        task_events.record(
            task_id=task.pk, events=[task_events.finished_event(turn) for turn in turns]
        )
        refresh_task_status(task=task)
        announce_ended_turns(task=task, turns=turns, occurred_at=now)
    return turns
