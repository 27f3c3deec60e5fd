"""A task's event log: what happened to its turns, in order, for products that follow a task live.

Each event gets the next number of its task's sequence (`Task.next_event_seq`), taken with an
UPDATE of the task row inside the writer's transaction. That UPDATE holds the task's row lock
until the writer commits, so a task's events commit in the order of their numbers: a reader
that has seen event n has seen every event before it, and a client that resumes after n (the
SSE stream's `Last-Event-ID`) misses nothing and gets nothing twice. Every writer of a task's
turns already holds that lock (follow-ups, cancels, reports); a claim takes it after the claim
itself has committed (`record_claims`).

A task's numbers are written contiguous, 1..N: every writer reserves exactly as many numbers
as it writes rows, in the same statement or transaction. A claim reserves numbers only for the
turns still running once it holds the task's lock: a turn interrupted, rolled back or
cancelled between the claim's commit and its `turn.claimed` event takes none.

Progress does not pile up: when a turn's attempt ends, its `turn.progress` events are deleted
(`prune_progress`, from `partial_texts`) in the transaction that writes the event saying how it
ended, so the newest event of a task is never deleted and a reader that resumes after a deleted
number gets the events after it. A gap in what storage holds is progress of a turn that has
ended (its text is in the turn), never an event not written. Only events older than
PROGRESS_GRACE_SECONDS go then: a live stream reads a progress event a moment after it is
written, and the attempt may end in that moment; the younger ones go when a later attempt of
the task ends (they are at most what a turn reported in its last minute).

Events are small and bounded: ids, statuses, codes, and for progress the streamed events and
the new text cut to a few thousand characters. Whole texts go by reference (the task API).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, F, Model, Q, Value, When
from django.utils import timezone

from backend import queries
from backend.prompting import Role
from backend.queries.rows import document
from backend.tasks.ingestion import replace_unstorable_chars
from backend.tasks.models import Subtask, SubtaskKind, SubtaskStatus, Task, TaskEvent, TaskStatus
from backend.tasks.wakeups import EVENTS_CHANNEL, announce_events

# Progress: at most this many of a report's streamed events, each string in them cut to
# EVENT_TEXT_CHARS, and at most PROGRESS_TEXT_CHARS of new partial text.
PROGRESS_EVENTS_MAX = 50
EVENT_TEXT_CHARS = 1_000
PROGRESS_TEXT_CHARS = 4_000
# A progress event outlives its attempt by this long, so that a live stream reads it.
PROGRESS_GRACE_SECONDS = 60
# How many of a task's newest ended turns an attempt's end sweeps for younger progress events.
PROGRESS_SWEEP_TURNS = 20

TURN_CREATED = "turn.created"
TURN_CLAIMED = "turn.claimed"
TURN_PROGRESS = "turn.progress"
TURN_REQUEUED = "turn.requeued"
TURN_STEERED = "turn.steered"  # a steer reached the running agent
MESSAGE_QUEUED = "message.queued"
MESSAGE_WITHDRAWN = "message.withdrawn"
# A turn that finished, by its final status.
FINISHED_EVENTS = {
    SubtaskStatus.COMPLETED: "turn.completed",
    SubtaskStatus.FAILED: "turn.failed",
    SubtaskStatus.CANCELLED: "turn.cancelled",
    SubtaskStatus.INTERRUPTED: "turn.interrupted",
}


@dataclass(frozen=True)
class Event:
    type: str
    subtask_id: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


def turn_data(turn: Subtask) -> dict[str, Any]:
    """What an event says of a turn: where it stands, never its text."""
    data: dict[str, Any] = {
        "subtask_id": turn.pk,
        "message_id": turn.message_id,
        "role": turn.role,
        "status": turn.status,
    }
    if turn.role == "ASSISTANT":
        data["bot"] = turn.bot
        data["attempt"] = turn.attempts
    if turn.error_code:
        data["error_code"] = turn.error_code
    return data


def turn_event(type_: str, turn: Subtask) -> Event:
    return Event(type=type_, subtask_id=turn.pk, data=turn_data(turn))


def finished_event(turn: Subtask) -> Event:
    return turn_event(FINISHED_EVENTS[SubtaskStatus(turn.status)], turn)


def record(*, task_id: int, events: Sequence[Event]) -> None:
    """Append `events` to the task's log, numbered in order, in the transaction that made the
    change they describe (the caller's), so there is no event without its change and no change
    without its event. No events, no query."""
    if not events:
        return
    if connection.vendor == "postgresql":
        _record_events_statement(task_id=task_id, events=events)
    else:
        _record_with_orm(task_id=task_id, events=events)


def _record_events_statement(*, task_id: int, events: Sequence[Event]) -> None:
    """PostgreSQL: `record` as the one statement `record_events` (`backend/queries/tasks.sql`)."""
    rows = queries.fetch(
        "record_events",
        {
            "task_id": task_id,
            "types": [event.type for event in events],
            "subtask_ids": [event.subtask_id for event in events],
            "data": [json.dumps(event.data) for event in events],
            "now": timezone.now(),
            "channel": EVENTS_CHANNEL,
        },
    )
    if not rows:
        raise Task.DoesNotExist(f"Task {task_id} does not exist.")


def _record_with_orm(*, task_id: int, events: Sequence[Event]) -> None:
    """`record` with the ORM: SQLite's path, and the oracle of `record_events`."""
    # Joins the caller's transaction; alone, the numbers and the rows still commit together.
    with transaction.atomic(savepoint=False):
        firsts = _reserve_numbers(counts={task_id: len(events)})
        if task_id not in firsts:
            raise Task.DoesNotExist(f"Task {task_id} does not exist.")
        TaskEvent.objects.bulk_create(
            TaskEvent(
                task_id=task_id,
                seq=firsts[task_id] + offset,
                type=event.type,
                subtask_id=event.subtask_id,
                data=event.data,
            )
            for offset, event in enumerate(events)
        )
        announce_events(task_id=task_id)


def _reserve_numbers(*, counts: dict[int, int], start: bool = False) -> dict[int, int]:
    """Reserve `counts[task_id]` numbers of each task's sequence, its row locked until the
    caller commits, and return the first of each (a task that does not exist has none). With
    `start`, each task that was not cancelled is RUNNING, by the same UPDATE."""
    firsts = dict(
        Task.objects.select_for_update()
        .filter(pk__in=counts)
        .order_by("pk")
        .values_list("pk", "next_event_seq")
    )
    if not firsts:
        return {}
    changes: dict[str, Any] = {
        "next_event_seq": F("next_event_seq")
        + Case(*(When(pk=task_id, then=Value(counts[task_id])) for task_id in firsts))
    }
    if start:
        cancelled = Q(status=TaskStatus.CANCELLED)
        changes["status"] = Case(
            When(cancelled, then=F("status")), default=Value(TaskStatus.RUNNING)
        )
        changes["updated_at"] = Case(
            When(cancelled, then=F("updated_at")), default=Value(timezone.now())
        )
    Task.objects.filter(pk__in=firsts).update(**changes)
    return firsts


def record_claims(*, turns: Sequence[Subtask], along: Sequence[Model] = ()) -> None:
    """`turn.claimed` for the turns a claim took, after the claim committed (a claim takes turn
    locks, and task locks after them would invert the writers' order): under their tasks'
    locks, and only for turns still RUNNING then (a turn cancelled in between says so with its
    own, earlier event, and no `claimed` follows it, nor is a number reserved for one). A
    task with a turn still RUNNING is RUNNING now, unless it was cancelled. One statement on
    PostgreSQL for any number of turns; none for summary jobs, which are no turns and leave
    their task's status alone.

    `along`: new rows of one model written by the claim, such as the dispatch's prompt
    reports: they commit with the events, or neither does (inserted by the same statement on
    PostgreSQL, first in the same transaction with the ORM)."""
    by_task: dict[int, list[Subtask]] = {}
    for turn in sorted(turns, key=lambda turn: (turn.task_id, turn.message_id)):
        if turn.kind == SubtaskKind.TURN:
            by_task.setdefault(turn.task_id, []).append(turn)
    if by_task and connection.vendor == "postgresql":
        _record_claims_statement(by_task, along=along)
        return
    with transaction.atomic() if along and by_task else nullcontext():
        if along:
            type(along[0])._default_manager.bulk_create(along)
        if by_task:
            _record_claims_with_orm(by_task)


def _record_claims_statement(
    by_task: dict[int, list[Subtask]], *, along: Sequence[Model] = ()
) -> None:
    """PostgreSQL: `record_claims` as the one statement `record_claims`
    (`backend/queries/tasks.sql`)."""
    turns = [turn for claimed in by_task.values() for turn in claimed]
    queries.fetch(
        "record_claims",
        {
            "task_ids": [turn.task_id for turn in turns],
            "subtask_ids": [turn.pk for turn in turns],
            "message_ids": [turn.message_id for turn in turns],
            "data": [json.dumps(turn_data(turn)) for turn in turns],
            "along": document(along),
            "now": timezone.now(),
            "channel": EVENTS_CHANNEL,
        },
        {
            "along_table": type(along[0]) if along else TaskEvent,
            "turn_running": SubtaskStatus.RUNNING.value,
            "task_running": TaskStatus.RUNNING.value,
            "task_cancelled": TaskStatus.CANCELLED.value,
            "claimed_event": TURN_CLAIMED,
        },
    )


def _record_claims_with_orm(by_task: dict[int, list[Subtask]]) -> None:
    """`record_claims` with the ORM: SQLite's path, and the oracle of `record_claims`."""
    # Joins the transaction of the rows written along, if any.
    with transaction.atomic(savepoint=False):
        running = set(
            Subtask.objects.filter(
                pk__in=[turn.pk for claimed in by_task.values() for turn in claimed],
                status=SubtaskStatus.RUNNING,
            ).values_list("pk", flat=True)
        )
        still_running = {
            task_id: [turn for turn in claimed if turn.pk in running]
            for task_id, claimed in by_task.items()
        }
        # Exactly as many numbers as events: a task whose claimed turns all stopped meanwhile
        # reserves none (a task deleted meanwhile is not in `firsts`: it has no log left).
        firsts = _reserve_numbers(
            counts={task_id: len(claimed) for task_id, claimed in still_running.items() if claimed},
            start=True,
        )
        TaskEvent.objects.bulk_create(
            TaskEvent(
                task_id=task_id,
                seq=first + offset,
                type=TURN_CLAIMED,
                subtask_id=turn.pk,
                data=turn_data(turn),
            )
            for task_id, first in firsts.items()
            for offset, turn in enumerate(still_running[task_id])
        )
        for task_id in firsts:
            announce_events(task_id=task_id)


def progress_event(
    turn: Subtask, *, events: list[dict[str, Any]], added: str | None, reset: bool = False
) -> Event:
    """A progress report as an event: its streamed events (bounded), and the text the partial
    answer gained (`text`, bounded; `text_reset` when the answer was replaced, not extended).
    `added` None: the text did not change."""
    data = turn_data(turn)
    data["events"] = [_bounded(event) for event in events[-PROGRESS_EVENTS_MAX:]]
    if len(events) > PROGRESS_EVENTS_MAX:
        data["events_omitted"] = len(events) - PROGRESS_EVENTS_MAX
    if added is not None:
        if reset:
            data["text_reset"] = True
        data["text"] = added[:PROGRESS_TEXT_CHARS]
        if len(added) > PROGRESS_TEXT_CHARS:
            data["text_omitted_chars"] = len(added) - PROGRESS_TEXT_CHARS
        data["partial_text_chars"] = turn.partial_text_chars
    return Event(type=TURN_PROGRESS, subtask_id=turn.pk, data=data)


def prune_progress(*, turns: Sequence[Subtask]) -> None:
    """Delete the progress events of the turns whose attempts ended, and of their tasks' newest
    other ended turns, that are older than PROGRESS_GRACE_SECONDS: a running turn's progress is
    for following it live, and what it wrote is in the turn. The numbers they had stay unused:
    a stream resuming after one of them gets the events after it. Reads the partial index of
    progress events (`task_event_progress_turn`), and a few rows of each task's newest turns."""
    ended = {turn.pk for turn in turns}
    for task_id in {turn.task_id for turn in turns}:
        ended.update(
            Subtask.objects.filter(task_id=task_id, role=Role.ASSISTANT)
            .exclude(status=SubtaskStatus.RUNNING)
            .order_by("-message_id")
            .values_list("id", flat=True)[:PROGRESS_SWEEP_TURNS]
        )
    cutoff = timezone.now() - timedelta(seconds=PROGRESS_GRACE_SECONDS)
    TaskEvent.objects.filter(
        subtask_id__in=sorted(ended), type=TURN_PROGRESS, created_at__lt=cutoff
    ).delete()


def _bounded(value: Any) -> Any:
    """A streamed event as the log keeps it: strings cut, and NUL and lone surrogates in its
    keys and strings shown as U+FFFD, as in a turn's history text (PostgreSQL's jsonb refuses
    both; the turn's `progress_events` keep them)."""
    if isinstance(value, str):
        return replace_unstorable_chars(value[:EVENT_TEXT_CHARS])[0]
    if isinstance(value, dict):
        return {
            replace_unstorable_chars(str(key)[:100])[0]: _bounded(item)
            for key, item in list(value.items())[:50]
        }
    if isinstance(value, list):
        return [_bounded(item) for item in value[:50]]
    return value
