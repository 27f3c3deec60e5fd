"""The ground every tasks service stands on: the task's lock, its message ids, and storing a round.

`lock_task` and `allocate_message_ids` serialize the writers of one task; `_create_round` stores
a USER turn with the PENDING turns that answer it (a new task's first message, a follow-up, a
queued message whose turn has come), filling in each turn's ingestion columns as
`_apply_ingestion` does for every text a turn records.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.utils import timezone

from backend.errors import NotFound
from backend.prompting import Role
from backend.tasks import task_events
from backend.tasks.ingestion import (
    IngestedText,
    ingest_text,
)
from backend.tasks.models import (
    NativeSession,
    Subtask,
    SubtaskStatus,
    Task,
    TaskStatus,
)
from backend.tasks.wakeups import announce_pending


def allocate_message_ids(*, task_id: int, count: int) -> int:
    """Reserve `count` consecutive message_ids on the task and return the first.

    Must run inside a transaction. The UPDATE takes the task row's write lock (PostgreSQL) or
    the database write lock (SQLite), so concurrent callers serialize here and each gets its own
    range; the lock is held until the caller's transaction ends, which also makes the caller's
    later checks of the task's turns consistent.
    """
    reserved = Task.objects.filter(pk=task_id).update(
        next_message_id=F("next_message_id") + count, updated_at=timezone.now()
    )
    if not reserved:
        raise NotFound(f"Task {task_id} does not exist.")
    after = Task.objects.filter(pk=task_id).values_list("next_message_id", flat=True).get()
    return int(after) - count


def lock_task(*, task_id: int) -> Task:
    """Fetch the task with its row locked until the surrounding transaction ends.

    PostgreSQL takes a row lock (SELECT ... FOR UPDATE). SQLite has no row locks, but Baton's
    SQLite connections begin every transaction IMMEDIATE, which already holds the database
    write lock, so writers are serialized there too.
    """
    task = Task.objects.select_for_update().filter(pk=task_id).first()
    if task is None:
        raise NotFound(f"Task {task_id} does not exist.")
    return task


def _create_round(*, task: Task, message: str, sender: str) -> list[Subtask]:
    """Store a USER turn and one PENDING ASSISTANT turn per pipeline step."""
    steps = task.pipeline
    first_id = allocate_message_ids(task_id=task.pk, count=1 + len(steps))
    now = timezone.now()
    user_turn = _user_turn(task=task, message=message, sender=sender, message_id=first_id, now=now)
    turns = [user_turn, *_answers(task=task, parent_message_id=first_id, now=now)]
    Subtask.objects.bulk_create(turns)
    _round_created(task=task, turns=turns, now=now)
    return turns


def _store_user_turn(
    *, task: Task, message: str, sender: str, steered_into_message_id: int
) -> Subtask:
    """Store a USER turn given to a running turn (a steer): no answers of its own, for now."""
    message_id = allocate_message_ids(task_id=task.pk, count=1)
    now = timezone.now()
    turn = _user_turn(task=task, message=message, sender=sender, message_id=message_id, now=now)
    turn.steered_into_message_id = steered_into_message_id
    turn.save(force_insert=True)
    task_events.record(
        task_id=task.pk, events=[task_events.turn_event(task_events.TURN_CREATED, turn)]
    )
    return turn


def _answer_stored_turn(*, task: Task, user_turn: Subtask) -> list[Subtask]:
    """Start the round of a USER turn stored earlier (a steer that fell back to the queue): its
    PENDING answers, after every turn before them. From now on it is a round's message."""
    first_id = allocate_message_ids(task_id=task.pk, count=len(task.pipeline))
    now = timezone.now()
    answers = _answers(
        task=task, parent_message_id=user_turn.message_id, now=now, first_id=first_id
    )
    Subtask.objects.bulk_create(answers)
    Subtask.objects.filter(pk=user_turn.pk).update(steered_into_message_id=None)
    user_turn.steered_into_message_id = None
    _round_created(task=task, turns=answers, now=now)
    return answers


def _user_turn(*, task: Task, message: str, sender: str, message_id: int, now: Any) -> Subtask:
    turn = Subtask(
        task=task,
        message_id=message_id,
        role=Role.USER,
        status=SubtaskStatus.COMPLETED,
        sender=sender,
        message=message,
        created_at=now,
        finished_at=now,
    )
    _apply_ingestion(turn, ingest_text(text=message, task=task), recorded_at=now)
    return turn


def _answers(
    *, task: Task, parent_message_id: int, now: Any, first_id: int | None = None
) -> list[Subtask]:
    """One PENDING ASSISTANT turn per pipeline step, answering `parent_message_id`, numbered
    from `first_id` (the message right after it by default)."""
    first_id = parent_message_id + 1 if first_id is None else first_id
    session_workers = dict(
        ((bot, executor), worker_id)
        for bot, executor, worker_id in NativeSession.objects.filter(task_id=task.pk).values_list(
            "bot", "executor", "worker_id"
        )
    )
    return [
        Subtask(
            task=task,
            message_id=first_id + index,
            parent_message_id=parent_message_id,
            role=Role.ASSISTANT,
            status=SubtaskStatus.PENDING,
            bot=step["bot"],
            pipeline_step=index,
            executor=step["executor"],
            context_passing=step["context_passing"] or "",
            # Only the first step is dispatchable now; each later step becomes eligible
            # when the step before it completes.
            pending_since=now if index == 0 else None,
            created_at=now,
            session_worker=session_workers.get((step["bot"], step["executor"]), ""),
        )
        for index, step in enumerate(task.pipeline)
    ]


def _round_created(*, task: Task, turns: list[Subtask], now: Any) -> None:
    task_events.record(
        task_id=task.pk,
        events=[task_events.turn_event(task_events.TURN_CREATED, turn) for turn in turns],
    )
    steps = task.pipeline
    announce_pending(executors=[steps[0]["executor"]] if steps else [])
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.PENDING, updated_at=now)
    task.status = TaskStatus.PENDING


def _ingestion_fields(ingested: IngestedText, *, recorded_at: Any) -> dict[str, Any]:
    """The turn's columns that ingestion fills in, by name."""
    return {
        "history_text": ingested.history_text,
        "history_text_tokens": ingested.history_text_tokens,
        "history_text_tokens_o200k": ingested.history_text_tokens_o200k,
        "preview_head": ingested.preview_head,
        "preview_tail": ingested.preview_tail,
        "preview_layout": ingested.preview_layout,
        "history_chars": ingested.chars,
        "history_bytes": ingested.bytes,
        "history_lines": ingested.lines,
        "history_tokens": ingested.tokens,
        "history_tokens_estimated": ingested.tokens_estimated,
        "history_replaced_chars": ingested.replaced_chars,
        "artifact": ingested.artifact,
        "history_is_preview": ingested.artifact is not None,
        "recorded_at": recorded_at,
    }


def _apply_ingestion(subtask: Subtask, ingested: IngestedText, *, recorded_at: Any) -> list[str]:
    """Set the turn's ingestion columns; return their names."""
    fields = _ingestion_fields(ingested, recorded_at=recorded_at)
    for name, value in fields.items():
        setattr(subtask, name, value)
    return list(fields)
