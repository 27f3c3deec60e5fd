"""message_id allocation and follow-ups under real concurrency (threads, one connection each)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from backend.errors import Conflict
from backend.prompting import Role
from backend.tasks import task_events
from backend.tasks.factories import answered_task
from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskEvent, TaskStatus
from backend.tasks.services import (
    FollowUp,
    PipelineStep,
    allocate_message_ids,
    append_message,
    create_task,
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


def running_turn(user, title: str) -> Subtask:
    """The first answer of a new task, as a claim that just committed leaves it."""
    task = create_task(
        owner=user,
        title=title,
        task_type="chat",
        message="first",
        pipeline=[PipelineStep(executor="agno")],
    )
    turn = task.subtasks.get(role=Role.ASSISTANT)
    Subtask.objects.filter(pk=turn.pk).update(status=SubtaskStatus.RUNNING, attempts=1)
    turn.refresh_from_db()
    return turn


def claimed_events(task_id: int) -> list[tuple[int, int | None]]:
    return list(
        TaskEvent.objects.filter(task_id=task_id, type=task_events.TURN_CLAIMED)
        .order_by("seq")
        .values_list("seq", "subtask_id")
    )


def wait_for_a_lock_wait() -> None:
    """Until another connection waits for a row lock (PostgreSQL; SQLite shows no waiters,
    and a writer there waits for the whole database instead)."""
    if connection.vendor != "postgresql":
        time.sleep(0.5)
        return
    for _ in range(500):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)
    raise AssertionError("no connection ever waited for a lock")


def test_a_turn_cancelled_while_its_claim_waits_for_the_task_gets_no_claimed_event(user):
    """Nor does its task start running: the status the cancel left stays."""
    turn = running_turn(user, "cancelled meanwhile")
    other = running_turn(user, "still running")
    holding, release = threading.Event(), threading.Event()

    def cancel() -> None:
        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=turn.task_id)
                Subtask.objects.filter(pk=turn.pk).update(status=SubtaskStatus.CANCELLED)
                Task.objects.filter(pk=turn.task_id).update(status=TaskStatus.COMPLETED)
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    def record() -> None:
        try:
            task_events.record_claims(turns=[turn, other])
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    assert holding.wait(30)
    recorder = threading.Thread(target=record)
    recorder.start()
    wait_for_a_lock_wait()  # the claim's events wait for the task the cancel holds
    release.set()
    canceller.join(30)
    recorder.join(30)
    assert not recorder.is_alive()
    # The cancel committed first: its turn is not claimed as far as the log tells.
    assert claimed_events(turn.task_id) == []
    # The other task's turn is, numbered after its task's earlier events.
    earlier = TaskEvent.objects.filter(task_id=other.task_id).exclude(type=task_events.TURN_CLAIMED)
    assert claimed_events(other.task_id) == [(earlier.count() + 1, other.pk)]
    assert Task.objects.get(pk=other.task_id).next_event_seq == earlier.count() + 2
    # The claim's task runs; the cancelled turn's keeps the status the cancel gave it.
    assert Task.objects.get(pk=other.task_id).status == TaskStatus.RUNNING
    assert Task.objects.get(pk=turn.task_id).status == TaskStatus.COMPLETED
