"""A claim takes at most one turn of a task, and none while a turn of it runs.

A task runs one turn at a time (`subtask_one_running_turn_per_task`). Should a task ever hold
a pending turn beside a running one, or two pending turns in line, the claim leaves the later
one where it is, on PostgreSQL and on SQLite: one task's state never fails a batch that
claims other tasks' turns, nor turns a dispatch into a 500.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backend.dispatch.claims import claim_turns, claimable_exists, next_ready_in_seconds
from backend.prompting import Role
from backend.tasks.models import Subtask, SubtaskStatus, Task
from backend.tasks.services import PipelineStep, create_task, record_result, send_message

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def _task(user, title: str) -> Task:
    return create_task(
        owner=user,
        title=title,
        task_type="code",
        message=f"{title}: fix the build.",
        pipeline=[PipelineStep(executor="codex")],
    )


def _pending(task: Task) -> list[Subtask]:
    return list(
        task.subtasks.filter(role=Role.ASSISTANT, status=SubtaskStatus.PENDING).order_by(
            "message_id"
        )
    )


def _two_rounds(user, title: str, *, first: str) -> tuple[Task, Subtask, Subtask]:
    """A task whose first round's answer is `first` (RUNNING or PENDING) while its second
    round's answer is PENDING too, both in line: a state Baton must never reach, set by hand."""
    task = _task(user, title)
    [answer] = _pending(task)
    record_result(subtask=answer, status=SubtaskStatus.COMPLETED, result={"value": "done"})
    [later] = [
        turn
        for turn in send_message(task=task, message="and then").turns
        if turn.role == Role.ASSISTANT
    ]
    Subtask.objects.filter(pk=answer.pk).update(status=first, result=None)
    answer.refresh_from_db()
    later.refresh_from_db()
    return task, answer, later


def _age(turn: Subtask, seconds: int) -> None:
    Subtask.objects.filter(pk=turn.pk).update(
        pending_since=timezone.now() - timedelta(seconds=seconds)
    )


def test_a_task_running_a_turn_leaves_its_pending_turn_and_the_batch_claims_the_others(
    user, worker
):
    _, running, waiting = _two_rounds(user, "busy", first=SubtaskStatus.RUNNING)
    _age(waiting, 300)  # first in the claim's line
    [other] = _pending(_task(user, "other"))
    [third] = _pending(_task(user, "third"))

    claimed = claim_turns(worker=worker, worker_id="w1", kinds=["codex"], limit=10)

    assert sorted(turn.subtask.pk for turn in claimed) == sorted([other.pk, third.pk])
    assert Subtask.objects.get(pk=waiting.pk).status == SubtaskStatus.PENDING
    assert Subtask.objects.get(pk=running.pk).status == SubtaskStatus.RUNNING
    # Nothing else to claim, and nothing said to be ready: the waiting turn's time comes when
    # the running one ends.
    assert claim_turns(worker=worker, worker_id="w2", kinds=["codex"], limit=10) == []
    assert not claimable_exists(kinds=["codex"], worker_id="w2", now=timezone.now())
    assert next_ready_in_seconds(kinds=["codex"], worker_id="w2") is None


def test_of_two_pending_turns_of_a_task_a_batch_claims_the_first_in_line_only(user, worker):
    _, first, second = _two_rounds(user, "twice", first=SubtaskStatus.PENDING)
    _age(first, 200)
    _age(second, 100)
    [other] = _pending(_task(user, "other"))

    claimed = claim_turns(worker=worker, worker_id="w1", kinds=["codex"], limit=10)

    assert [turn.subtask.pk for turn in claimed] == [first.pk, other.pk]
    assert Subtask.objects.get(pk=second.pk).status == SubtaskStatus.PENDING
    assert claim_turns(worker=worker, worker_id="w1", kinds=["codex"], limit=10) == []


def test_a_turn_in_line_behind_one_backing_off_waits_for_it(user, worker):
    _, first, second = _two_rounds(user, "backoff", first=SubtaskStatus.PENDING)
    _age(first, 200)
    Subtask.objects.filter(pk=first.pk).update(not_before=timezone.now() + timedelta(seconds=30))

    assert claim_turns(worker=worker, worker_id="w1", kinds=["codex"], limit=10) == []
    assert 0 < next_ready_in_seconds(kinds=["codex"], worker_id="w1") <= 30
