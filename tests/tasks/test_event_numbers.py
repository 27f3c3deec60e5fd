"""A task's event numbers run 1..N without a hole, whatever stops a turn between its claim's
commit and its `turn.claimed` event (`task_events.record_claims`): a client following the
stream can tell a lost event from none by the numbers alone."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from backend.prompting import Role
from backend.tasks import task_events
from backend.tasks.models import FollowUpStrategy, Subtask, SubtaskStatus, Task, TaskEvent
from backend.tasks.services import PipelineStep, cancel_task, cancel_turn, create_task, send_message
from tests.tasks.test_concurrency import wait_for_a_lock_wait

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def _claimed(user) -> list[Subtask]:
    """A new task's assistant turns as a claim that just committed leaves them: RUNNING, with
    their `turn.claimed` events not yet recorded."""
    task = create_task(
        owner=user,
        title="t",
        task_type="code",
        message="Fix the build.",
        pipeline=[PipelineStep(executor="codex")],
        follow_up_strategy=FollowUpStrategy.INTERRUPT,
    )
    turns = list(task.subtasks.filter(role=Role.ASSISTANT).order_by("message_id"))
    Subtask.objects.filter(pk__in=[turn.pk for turn in turns]).update(
        status=SubtaskStatus.RUNNING, attempts=1
    )
    for turn in turns:
        turn.refresh_from_db()
    return turns


def _numbers(task_id: int) -> list[int]:
    return list(
        TaskEvent.objects.filter(task_id=task_id).order_by("seq").values_list("seq", flat=True)
    )


def assert_contiguous(task_id: int) -> list[str]:
    """The task's numbers are 1..N and its counter says N+1 is next; returns the types."""
    numbers = _numbers(task_id)
    assert numbers == list(range(1, len(numbers) + 1))
    assert Task.objects.get(pk=task_id).next_event_seq == len(numbers) + 1
    return list(
        TaskEvent.objects.filter(task_id=task_id).order_by("seq").values_list("type", flat=True)
    )


def _interrupt(turn: Subtask) -> None:
    send_message(task=turn.task, message="Stop; do this instead.", strategy="interrupt")


def _roll_back(turn: Subtask) -> None:
    send_message(task=turn.task, message="Forget that.", strategy="rollback")


def _cancel_turn(turn: Subtask) -> None:
    cancel_turn(task=turn.task, subtask_id=turn.pk)


def _cancel_task(turn: Subtask) -> None:
    cancel_task(task=turn.task)


@pytest.mark.parametrize(
    "stop", [_interrupt, _roll_back, _cancel_turn, _cancel_task], ids=lambda f: f.__name__[1:]
)
def test_a_turn_stopped_before_its_claimed_event_leaves_no_hole(user, stop):
    [turn] = _claimed(user)
    stop(turn)  # between the claim's commit and its event
    task_events.record_claims(turns=[turn])
    types = assert_contiguous(turn.task_id)
    assert task_events.TURN_CLAIMED not in types


def test_a_later_event_follows_the_stop_event_directly(user):
    [turn] = _claimed(user)
    _cancel_turn(turn)
    stopped_at = _numbers(turn.task_id)[-1]
    task_events.record_claims(turns=[turn])
    send_message(task=turn.task, message="Next.")
    created = TaskEvent.objects.filter(task_id=turn.task_id, seq__gt=stopped_at).order_by("seq")
    assert [event.seq for event in created][0] == stopped_at + 1
    assert_contiguous(turn.task_id)


def test_only_the_turns_still_running_take_numbers_across_tasks(user):
    """One claim, three tasks: the stopped turn's task reserves nothing, the others exactly
    their events."""
    [stopped], [running], [other] = _claimed(user), _claimed(user), _claimed(user)
    _cancel_turn(stopped)
    task_events.record_claims(turns=[stopped, running, other])
    for turn in (stopped, running, other):
        assert_contiguous(turn.task_id)
    claimed = TaskEvent.objects.filter(type=task_events.TURN_CLAIMED).order_by("task_id", "seq")
    assert [event.subtask_id for event in claimed] == [running.pk, other.pk]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")  # a transactional test before it flushed them
def test_a_turn_cancelled_while_the_claim_waits_for_its_task_takes_no_number(user):
    """The race itself, with real connections: the cancel holds the task's lock and commits
    while `record_claims` waits for it (on PostgreSQL its statement reads the turn again
    after the wait; on SQLite the writer waits for the whole database)."""
    [turn] = _claimed(user)
    holding, release = threading.Event(), threading.Event()

    def cancel() -> None:
        try:
            with transaction.atomic():
                locked = Task.objects.select_for_update().get(pk=turn.task_id)
                cancel_turn(task=locked, subtask_id=turn.pk)
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    def record() -> None:
        try:
            task_events.record_claims(turns=[turn])
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    assert holding.wait(30)
    recorder = threading.Thread(target=record)
    recorder.start()
    wait_for_a_lock_wait()
    release.set()
    canceller.join(30)
    recorder.join(30)
    assert not recorder.is_alive()
    assert task_events.TURN_CLAIMED not in assert_contiguous(turn.task_id)
