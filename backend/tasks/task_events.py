"""A task's event log: what happened to its turns, in order, for products that follow a task live.

Each event gets the next number of its task's sequence (`Task.next_event_seq`), taken with an
UPDATE of the task row inside the writer's transaction. That UPDATE holds the task's row lock
until the writer commits, so a task's events commit in the order of their numbers: a reader
that has seen event n has seen every event before it, and a client that resumes after n (the
SSE stream's `Last-Event-ID`) misses nothing and gets nothing twice. Every writer of a task's
turns already holds that lock (follow-ups, cancels, reports); a claim takes it after the claim
itself has committed (`record_claims`).

A task's numbers are contiguous, 1..N: every writer reserves exactly as many numbers as it
writes rows, in the same statement or transaction, so a client that sees n+2 after n knows
event n+1 was lost on its way, never that it was not written. A claim reserves numbers only
for the turns still running once it holds the task's lock: a turn interrupted, rolled back or
cancelled between the claim's commit and its `turn.claimed` event takes none.

Events are small and bounded: ids, statuses, codes, and for progress the streamed events and
the new text cut to a few thousand characters. Whole texts go by reference (the task API).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from backend import sql
from backend.tasks.models import Subtask, SubtaskKind, SubtaskStatus, Task, TaskEvent, TaskStatus
from backend.tasks.wakeups import EVENTS_CHANNEL, announce_events

# Progress: at most this many of a report's streamed events, each string in them cut to
# EVENT_TEXT_CHARS, and at most PROGRESS_TEXT_CHARS of new partial text.
PROGRESS_EVENTS_MAX = 50
EVENT_TEXT_CHARS = 1_000
PROGRESS_TEXT_CHARS = 4_000

TURN_CREATED = "turn.created"
TURN_CLAIMED = "turn.claimed"
TURN_PROGRESS = "turn.progress"
TURN_REQUEUED = "turn.requeued"
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
        _record_in_one_statement(task_id=task_id, events=events)
        return
    # Joins the caller's transaction; alone, the numbers and the rows still commit together.
    with transaction.atomic(savepoint=False):
        first = _allocate(task_id=task_id, count=len(events))
        # Every change writes events: the statement is written out (see `backend.sql`).
        sql.insert(
            [
                TaskEvent(
                    task_id=task_id,
                    seq=first + offset,
                    type=event.type,
                    subtask_id=event.subtask_id,
                    data=event.data,
                )
                for offset, event in enumerate(events)
            ]
        )
        announce_events(task_id=task_id)


def _record_in_one_statement(*, task_id: int, events: Sequence[Event]) -> None:
    """PostgreSQL: `record` as one statement: the task's numbers reserved (its row locked until
    the caller commits, as `_allocate` does), the events inserted with them, and the task's
    streams notified when the caller commits (a notification is sent on commit)."""
    values = ", ".join("(%s::bigint, %s, %s::bigint, %s::jsonb)" for _ in events)
    params: list[Any] = [len(events), task_id]
    for offset, event in enumerate(events):
        params += [offset, event.type, event.subtask_id, json.dumps(event.data)]
    # Only table names and placeholders are formatted in.
    statement = (
        f"WITH numbered AS (UPDATE {Task._meta.db_table} "  # noqa: S608
        "SET next_event_seq = next_event_seq + %s WHERE id = %s RETURNING id, next_event_seq), "
        f"listed (position, type, subtask_id, data) AS (VALUES {values}), "
        f"written AS (INSERT INTO {TaskEvent._meta.db_table} "
        "(task_id, seq, type, subtask_id, data, created_at) "
        "SELECT numbered.id, numbered.next_event_seq - %s + listed.position, listed.type, "
        "listed.subtask_id, listed.data, %s FROM numbered CROSS JOIN listed RETURNING task_id) "
        "SELECT pg_notify(%s, CAST(task_id AS text)) FROM (SELECT DISTINCT task_id FROM written) "
        "AS announced"
    )
    params += [len(events), sql.when(timezone.now()), EVENTS_CHANNEL]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        if cursor.fetchone() is None:
            raise Task.DoesNotExist(f"Task {task_id} does not exist.")


def _allocate(*, task_id: int, count: int) -> int:
    """Reserve `count` numbers of the task's sequence (locking the task row until the caller
    commits) and return the first."""
    table = Task._meta.db_table
    with connection.cursor() as cursor:
        # Only the table's name is formatted into the SQL.
        cursor.execute(
            f"UPDATE {table} SET next_event_seq = next_event_seq + %s "  # noqa: S608
            "WHERE id = %s RETURNING next_event_seq",
            [count, task_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise Task.DoesNotExist(f"Task {task_id} does not exist.")
    return int(row[0]) - count


def record_claims(
    *, turns: Sequence[Subtask], along: tuple[str, Sequence[Any]] | None = None
) -> None:
    """`turn.claimed` for the turns a claim took, after the claim committed (a claim takes turn
    locks, and task locks after them would invert the writers' order): under their tasks'
    locks, and only for turns still RUNNING then (a turn cancelled in between says so with its
    own, earlier event, and no `claimed` follows it, nor is a number reserved for one). A
    task with a turn still RUNNING is RUNNING now, unless it was cancelled. One statement on
    PostgreSQL, four queries elsewhere, for any number of turns; none for summary jobs, which
    are no turns and leave their task's status alone.

    `along`: a statement (SQL, parameters) writing rows of the claim, such as the dispatch's
    prompt reports (`sql.insert_statement`), committed with the events: on PostgreSQL a
    data-modifying part of the same statement (a round trip and a commit fewer on every
    dispatch), elsewhere the first statement of the same transaction."""
    by_task: dict[int, list[Subtask]] = {}
    for turn in sorted(turns, key=lambda turn: (turn.task_id, turn.message_id)):
        if turn.kind == SubtaskKind.TURN:
            by_task.setdefault(turn.task_id, []).append(turn)
    if not by_task:
        if along is not None:
            with connection.cursor() as cursor:
                cursor.execute(along[0], list(along[1]))
        return
    if connection.vendor == "postgresql":
        _record_claims_in_one_statement(by_task, along=along)
        return
    with transaction.atomic():
        if along is not None:
            with connection.cursor() as cursor:
                cursor.execute(along[0], list(along[1]))
        ids = [turn.pk for claimed in by_task.values() for turn in claimed]
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Subtask._meta.db_table} "  # noqa: S608
                f"WHERE id IN ({sql.placeholders(ids)}) AND status = %s",
                [*ids, SubtaskStatus.RUNNING.value],
            )
            running = {row[0] for row in cursor.fetchall()}
        still_running = {
            task_id: [turn for turn in claimed if turn.pk in running]
            for task_id, claimed in by_task.items()
        }
        # Exactly as many numbers as events: a task whose claimed turns all stopped meanwhile
        # reserves none (a task deleted meanwhile is not in `firsts`: it has no log left).
        firsts = _allocate_many(
            counts={task_id: len(claimed) for task_id, claimed in still_running.items() if claimed}
        )
        if firsts:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {Task._meta.db_table} SET status = %s, updated_at = %s "  # noqa: S608
                    f"WHERE id IN ({sql.placeholders(list(firsts))}) AND status <> %s",
                    [
                        TaskStatus.RUNNING.value,
                        sql.when(timezone.now()),
                        *sorted(firsts),
                        TaskStatus.CANCELLED.value,
                    ],
                )
        sql.insert(
            [
                TaskEvent(
                    task_id=task_id,
                    seq=first + offset,
                    type=TURN_CLAIMED,
                    subtask_id=turn.pk,
                    data=turn_data(turn),
                )
                for task_id, first in firsts.items()
                for offset, turn in enumerate(still_running[task_id])
            ]
        )
        for task_id in firsts:
            announce_events(task_id=task_id)


def _record_claims_in_one_statement(
    by_task: dict[int, list[Subtask]], *, along: tuple[str, Sequence[Any]] | None
) -> None:
    """PostgreSQL: `record_claims` as one statement instead of a transaction of four and a
    notification after it (every dispatch records its claims). Its parts run in this order,
    each reading the one before: the tasks' rows locked (as `_allocate_many`'s update does),
    the turns still RUNNING read under a share lock (a turn a cancel changed while this waited
    for its task's lock is read as the cancel left it, not as the statement's snapshot saw
    it) and counted per task, exactly that many of each task's numbers reserved and, unless
    it was cancelled, its status set, its events inserted, numbered in message order, and the
    tasks' streams notified when it commits. A task none of whose claimed turns still runs
    reserves no number: its sequence stays without a hole. The status is set by the update
    that reserves the numbers: one statement cannot change a row twice."""
    turns = [turn for claimed in by_task.values() for turn in claimed]
    values = ", ".join("(%s::bigint, %s::bigint, %s::bigint, %s::jsonb)" for _ in turns)
    claimed_params: list[Any] = []
    for turn in turns:
        claimed_params += [turn.task_id, turn.pk, turn.message_id, json.dumps(turn_data(turn))]
    tasks, subtasks = Task._meta.db_table, Subtask._meta.db_table
    task_ids = sql.placeholders(list(by_task))
    # A task with a claimed turn still RUNNING starts running, unless it was cancelled.
    started = f"{tasks}.status <> {sql.literal(TaskStatus.CANCELLED.value)}"
    now = sql.when(timezone.now())
    # Only table names, constants and placeholders are formatted in.
    # A data-modifying part runs whether or not the rest reads it.
    first = f"along AS ({along[0]}), " if along is not None else ""
    statement = (
        f"WITH {first}locked AS (SELECT id FROM {tasks} WHERE id IN ({task_ids}) "  # noqa: S608
        "FOR NO KEY UPDATE), "
        f"running AS (SELECT turn.id, turn.task_id FROM {subtasks} AS turn "
        "JOIN locked ON locked.id = turn.task_id "
        f"WHERE turn.id IN ({sql.placeholders(turns)}) AND turn.status = %s FOR SHARE OF turn), "
        "counted AS (SELECT task_id, COUNT(*) AS reserved FROM running GROUP BY task_id), "
        f"numbered AS (UPDATE {tasks} SET next_event_seq = next_event_seq + counted.reserved, "
        f"status = CASE WHEN {started} THEN %s ELSE {tasks}.status END, "
        f"updated_at = CASE WHEN {started} THEN %s ELSE {tasks}.updated_at END "
        f"FROM counted WHERE {tasks}.id = counted.task_id "
        f"RETURNING {tasks}.id, {tasks}.next_event_seq, counted.reserved), "
        f"claimed (task_id, subtask_id, message_id, data) AS (VALUES {values}), "
        f"written AS (INSERT INTO {TaskEvent._meta.db_table} "
        "(task_id, seq, type, subtask_id, data, created_at) "
        "SELECT claimed.task_id, numbered.next_event_seq - numbered.reserved - 1 + ROW_NUMBER() "
        "OVER (PARTITION BY claimed.task_id ORDER BY claimed.message_id), %s, "
        "claimed.subtask_id, claimed.data, %s FROM claimed "
        "JOIN numbered ON numbered.id = claimed.task_id "
        "JOIN running ON running.id = claimed.subtask_id RETURNING task_id) "
        "SELECT pg_notify(%s, CAST(task_id AS text)) FROM (SELECT DISTINCT task_id FROM written) "
        "AS announced"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            statement,
            [
                *(along[1] if along is not None else ()),
                *by_task,
                *(turn.pk for turn in turns),
                SubtaskStatus.RUNNING.value,
                TaskStatus.RUNNING.value,
                now,
                *claimed_params,
                TURN_CLAIMED,
                now,
                EVENTS_CHANNEL,
            ],
        )


def _allocate_many(*, counts: dict[int, int]) -> dict[int, int]:
    """`_allocate` for several tasks in one statement: the first reserved number of each."""
    if not counts:
        return {}
    table = Task._meta.db_table
    added, params = sql.case_by_id(counts)
    with connection.cursor() as cursor:
        # Only the table's name and placeholders are formatted into the SQL.
        cursor.execute(
            f"UPDATE {table} SET next_event_seq = next_event_seq + {added} "  # noqa: S608
            f"WHERE id IN ({sql.placeholders(list(counts))}) RETURNING id, next_event_seq",
            [*params, *counts],
        )
        return {task_id: int(after) - counts[task_id] for task_id, after in cursor.fetchall()}


def progress_event(
    turn: Subtask, *, events: list[dict[str, Any]], text_before: str, text_after: str | None
) -> Event:
    """A progress report as an event: its streamed events (bounded), and the text the partial
    answer gained (`text`, bounded; `text_reset` when the answer was replaced, not extended)."""
    data = turn_data(turn)
    data["events"] = [_bounded(event) for event in events[-PROGRESS_EVENTS_MAX:]]
    if len(events) > PROGRESS_EVENTS_MAX:
        data["events_omitted"] = len(events) - PROGRESS_EVENTS_MAX
    if text_after is not None and text_after != text_before:
        if text_after.startswith(text_before):
            added = text_after[len(text_before) :]
        else:
            added = text_after
            data["text_reset"] = True
        data["text"] = added[:PROGRESS_TEXT_CHARS]
        if len(added) > PROGRESS_TEXT_CHARS:
            data["text_omitted_chars"] = len(added) - PROGRESS_TEXT_CHARS
        data["partial_text_chars"] = len(text_after)
    return Event(type=TURN_PROGRESS, subtask_id=turn.pk, data=data)


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return value[:EVENT_TEXT_CHARS]
    if isinstance(value, dict):
        return {str(key)[:100]: _bounded(item) for key, item in list(value.items())[:50]}
    if isinstance(value, list):
        return [_bounded(item) for item in value[:50]]
    return value
