"""message_id allocation and follow-ups under real concurrency (threads, one connection each)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from backend.errors import Conflict
from backend.prompting import Role
from backend.tasks.factories import answered_task
from backend.tasks.models import SubtaskStatus, Task
from backend.tasks.services import (
    FollowUp,
    PipelineStep,
    allocate_message_ids,
    append_message,
    record_result,
    send_message,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shipped_bots")]

THREADS = 8


def run_in_threads(work: Callable[[int], object], count: int = THREADS) -> list[object]:
    """Run work(i) in `count` threads released together; return results or exceptions."""
    barrier = threading.Barrier(count)
    outcomes: list[object] = [None] * count

    def body(index: int) -> None:
        try:
            barrier.wait()
            outcomes[index] = work(index)
        except Exception as error:  # noqa: BLE001 - the test inspects every outcome
            outcomes[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return outcomes


def new_task(user) -> Task:
    return answered_task(
        owner=user,
        title="race",
        task_type="chat",
        message="first",
        answer="ok",
        pipeline=[PipelineStep(executor="agno")],
    )


def test_concurrent_allocations_never_share_an_id(user):
    task = new_task(user)
    start = Task.objects.get(pk=task.pk).next_message_id

    def allocate_many(_: int) -> list[int]:
        ids = []
        for _ in range(20):
            with transaction.atomic():
                first = allocate_message_ids(task_id=task.pk, count=3)
            ids.extend(range(first, first + 3))
        return ids

    outcomes = run_in_threads(allocate_many)
    assert not [o for o in outcomes if isinstance(o, Exception)]
    ids = [i for outcome in outcomes for i in outcome]
    assert len(ids) == len(set(ids)) == THREADS * 20 * 3
    assert sorted(ids) == list(range(start, start + len(ids)))


def test_concurrent_follow_ups_store_exactly_one_round(user):
    task = new_task(user)

    def follow_up(index: int) -> object:
        return append_message(task=Task.objects.get(pk=task.pk), message=f"follow-up {index}")

    outcomes = run_in_threads(follow_up)
    stored = [o for o in outcomes if isinstance(o, list)]
    refused = [o for o in outcomes if isinstance(o, Conflict)]
    assert len(stored) == 1, outcomes
    assert len(refused) == THREADS - 1, outcomes  # a clear 409, never an IntegrityError
    message_ids = list(task.subtasks.order_by("message_id").values_list("message_id", flat=True))
    assert message_ids == [1, 2, 3, 4]
    assert task.subtasks.filter(role=Role.USER).count() == 2


def test_follow_ups_on_many_tasks_at_once(user):
    tasks = [new_task(user) for _ in range(THREADS)]

    def follow_up(index: int) -> object:
        task = tasks[index]
        turns = append_message(task=task, message="next")
        record_result(subtask=turns[1], status=SubtaskStatus.COMPLETED, result={"value": "ok"})
        return append_message(task=task, message="and again")

    outcomes = run_in_threads(follow_up)
    assert all(isinstance(o, list) for o in outcomes), outcomes
    for task in tasks:
        ids = list(task.subtasks.order_by("message_id").values_list("message_id", flat=True))
        assert ids == [1, 2, 3, 4, 5, 6]


def test_concurrent_queued_follow_ups_are_all_kept_and_sent_in_the_order_they_queued(user):
    task = new_task(user)
    [running] = [
        turn for turn in append_message(task=task, message="busy") if turn.role == "ASSISTANT"
    ]

    def follow_up(index: int) -> object:
        return send_message(
            task=Task.objects.get(pk=task.pk), message=f"queued {index}", strategy="enqueue"
        )

    outcomes = run_in_threads(follow_up)
    assert all(isinstance(o, FollowUp) and o.queued is not None for o in outcomes), outcomes
    queue = list(task.queued_messages.order_by("id").values_list("message", flat=True))
    assert sorted(queue) == sorted(f"queued {index}" for index in range(THREADS))

    # Each finished round starts the next queued message, in queue order, exactly once.
    record_result(subtask=running, status=SubtaskStatus.COMPLETED, result={"value": "ok"})
    sent = []
    while True:
        pending = task.subtasks.filter(status=SubtaskStatus.PENDING).first()
        if pending is None:
            break
        sent.append(task.subtasks.get(message_id=pending.parent_message_id).message)
        record_result(subtask=pending, status=SubtaskStatus.COMPLETED, result={"value": "ok"})
    assert sent == queue
    assert task.subtasks.filter(role=Role.USER).count() == 2 + THREADS
