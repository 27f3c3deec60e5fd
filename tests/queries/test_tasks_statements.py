"""The statements of `backend/queries/tasks.sql` against real PostgreSQL, each with the ORM
path SQLite runs as its oracle: on the same rows (the one run rolled back before the other),
both leave the same events, numbers and task statuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from backend.prompting import Role
from backend.tasks import task_events
from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskEvent, TaskStatus
from backend.tasks.services import PipelineStep, cancel_turn, create_task, send_message

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db,
    pytest.mark.usefixtures("pipeline_bots"),
]


class _RolledBack(Exception):
    """Leaves the block that ran a path, undoing what it wrote."""


def _outcome(run: Callable[[], None], task_ids: list[int]) -> dict[int, Any]:
    """What `run` leaves of the tasks (their status, next number and events), undone after."""
    seen: dict[int, Any] = {}
    try:
        with transaction.atomic():
            run()
            for task_id in task_ids:
                seen[task_id] = (
                    Task.objects.values_list("status", "next_event_seq").get(pk=task_id),
                    list(
                        TaskEvent.objects.filter(task_id=task_id)
                        .order_by("seq")
                        .values_list("seq", "type", "subtask_id", "data")
                    ),
                )
            raise _RolledBack
    except _RolledBack:
        pass
    return seen


def _running_turns(user) -> list[Subtask]:
    """A new task's assistant turns as a claim leaves them: RUNNING."""
    task = create_task(
        owner=user,
        title="t",
        task_type="code",
        message="Fix the build.",
        pipeline=[PipelineStep(executor="codex")],
    )
    turns = list(task.subtasks.filter(role=Role.ASSISTANT).order_by("message_id"))
    Subtask.objects.filter(pk__in=[turn.pk for turn in turns]).update(
        status=SubtaskStatus.RUNNING, attempts=1
    )
    for turn in turns:
        turn.refresh_from_db()
    return turns


def test_record_events_numbers_the_events_as_the_orm_does(user):
    [turn] = _running_turns(user)
    events = [
        task_events.turn_event(task_events.TURN_PROGRESS, turn),
        task_events.Event(type=task_events.MESSAGE_QUEUED, data={"text": "ünïcode \u2028"}),
        task_events.turn_event(task_events.TURN_REQUEUED, turn),
    ]

    def statement() -> None:
        task_events._record_events_statement(task_id=turn.task_id, events=events)

    def orm() -> None:
        task_events._record_with_orm(task_id=turn.task_id, events=events)

    by_statement = _outcome(statement, [turn.task_id])
    assert by_statement == _outcome(orm, [turn.task_id])
    (_, next_seq), written = by_statement[turn.task_id]
    assert [seq for seq, *_ in written] == list(range(1, next_seq))
    assert [row[1:3] for row in written[-3:]] == [
        (task_events.TURN_PROGRESS, turn.pk),
        (task_events.MESSAGE_QUEUED, None),
        (task_events.TURN_REQUEUED, turn.pk),
    ]


def test_record_events_on_a_missing_task_writes_nothing():
    with pytest.raises(Task.DoesNotExist):
        task_events._record_events_statement(
            task_id=0, events=[task_events.Event(type=task_events.MESSAGE_QUEUED)]
        )
    assert not TaskEvent.objects.filter(task_id=0).exists()


def test_record_claims_numbers_only_the_turns_still_running_as_the_orm_does(user):
    """Four tasks in one claim: two with their turn still running, one whose turn stopped
    before its event, one cancelled with its turn still running (numbered, its status kept)."""
    [first] = _running_turns(user)
    [stopped] = _running_turns(user)
    cancel_turn(task=stopped.task, subtask_id=stopped.pk)
    [in_cancelled] = _running_turns(user)
    Task.objects.filter(pk=in_cancelled.task_id).update(status=TaskStatus.CANCELLED)
    [alone] = _running_turns(user)
    turns = [alone, first, stopped, in_cancelled]
    by_task = {}
    for turn in sorted(turns, key=lambda turn: (turn.task_id, turn.message_id)):
        by_task.setdefault(turn.task_id, []).append(turn)
    task_ids = sorted(by_task)

    by_statement = _outcome(lambda: task_events._record_claims_statement(by_task), task_ids)
    assert by_statement == _outcome(lambda: task_events._record_claims_with_orm(by_task), task_ids)
    statuses = {task_id: status for task_id, ((status, _), _) in by_statement.items()}
    assert statuses[first.task_id] == statuses[alone.task_id] == TaskStatus.RUNNING
    assert statuses[in_cancelled.task_id] == TaskStatus.CANCELLED
    claimed = [
        subtask_id
        for task_id in task_ids
        for _, type_, subtask_id, _ in by_statement[task_id][1]
        if type_ == task_events.TURN_CLAIMED
    ]
    assert sorted(claimed) == sorted([first.pk, in_cancelled.pk, alone.pk])
    for (_, next_seq), written in by_statement.values():
        assert [seq for seq, *_ in written] == list(range(1, next_seq))


def _latest_round(task: Task) -> tuple[set[str], bool]:
    from backend.tasks.services import status

    by_statement = status._latest_round_statuses(task=task)
    rows = status._latest_round_rows_by_orm(task=task)
    by_orm = {state for state, marker in rows if not marker}, any(marker for _, marker in rows)
    assert by_statement == by_orm
    return by_statement


def test_latest_round_statuses_reads_what_the_orm_reads(user):
    task = create_task(
        owner=user,
        title="t",
        task_type="code",
        message="Fix the build.",
        pipeline=[PipelineStep(executor="codex"), PipelineStep(executor="claude_code")],
    )
    assert _latest_round(task) == ({SubtaskStatus.PENDING}, False)
    first, second = task.subtasks.filter(role=Role.ASSISTANT).order_by("message_id")
    Subtask.objects.filter(pk=first.pk).update(status=SubtaskStatus.COMPLETED)
    assert _latest_round(task) == ({SubtaskStatus.COMPLETED, SubtaskStatus.PENDING}, False)
    Subtask.objects.filter(pk=second.pk).update(status=SubtaskStatus.RUNNING)
    # A message sent while a turn runs waits in the queue (the default strategy, enqueue).
    send_message(task=task, message="Also the docs.")
    assert _latest_round(task) == ({SubtaskStatus.COMPLETED, SubtaskStatus.RUNNING}, True)


def test_the_latest_round_is_the_one_started_last_not_the_newest_user_message(user):
    """A steer that fell back to the queue keeps the message id it was sent with; its round,
    started after an interrupting message's round, is the task's latest all the same."""
    from backend.tasks.services import refresh_task_status
    from backend.tasks.services.rounds import lock_task
    from backend.tasks.services.steering import settle_steers

    task = create_task(
        owner=user,
        title="t",
        task_type="code",
        message="Fix the build.",
        pipeline=[PipelineStep(executor="codex")],
    )
    [answer] = task.subtasks.filter(role=Role.ASSISTANT)
    Subtask.objects.filter(pk=answer.pk).update(
        status=SubtaskStatus.RUNNING, lease_owner="w1", attempts=1
    )
    steer = send_message(task=task, message="steered", strategy="steer").steer
    assert steer is not None and steer.message.message_id == 3
    with transaction.atomic():
        locked = lock_task(task_id=task.pk)
        settle_steers(
            task=locked, target=Subtask.objects.get(pk=answer.pk), results={steer.pk: "finished"}
        )
    Subtask.objects.filter(pk=answer.pk).update(status=SubtaskStatus.COMPLETED)
    interrupting = send_message(task=task, message="interrupting").turns
    assert [turn.message_id for turn in interrupting] == [4, 5]
    Subtask.objects.filter(pk=interrupting[1].pk).update(status=SubtaskStatus.RUNNING)
    send_message(task=task, message="queued")  # waits in the queue (enqueue)
    assert _latest_round(task) == ({SubtaskStatus.RUNNING}, True)

    Subtask.objects.filter(pk=interrupting[1].pk).update(status=SubtaskStatus.COMPLETED)
    with transaction.atomic():
        assert refresh_task_status(task=lock_task(task_id=task.pk)) == TaskStatus.PENDING
    # The steer's round (message 3, answered by message 6) started; the queued message waits.
    assert task.subtasks.get(message_id=6).parent_message_id == 3
    assert _latest_round(task) == ({SubtaskStatus.PENDING}, True)
