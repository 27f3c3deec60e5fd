"""Exactly-once claims: 8 workers claiming at the same time, each with its own connection."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from backend.dispatch.claims import claim_turns
from backend.tasks.models import Subtask
from backend.tasks.services import PipelineStep, create_task
from tests.conftest import make_worker
from tests.tasks.test_concurrency import THREADS, run_in_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shipped_bots")]

PENDING_TURNS = 120


@pytest.mark.parametrize("limit", [1, 7])
def test_every_turn_is_claimed_exactly_once(limit):
    owner = get_user_model().objects.create_user(username="owner")
    for number in range(PENDING_TURNS):
        create_task(
            owner=owner,
            title=f"t{number}",
            task_type="code",
            message=f"job {number}",
            pipeline=[PipelineStep(executor="codex")],
        )
    workers = [make_worker(f"worker-{index}") for index in range(THREADS)]

    def drain(index: int) -> list[int]:
        mine = []
        while True:
            turns = claim_turns(
                worker=workers[index], worker_id=f"w{index}", kinds=["codex"], limit=limit
            )
            if not turns:
                return mine
            mine.extend(turn.subtask.pk for turn in turns)

    outcomes = run_in_threads(drain)
    errors = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    assert not errors, errors
    claimed = [subtask_id for outcome in outcomes for subtask_id in outcome]
    assert len(claimed) == len(set(claimed)) == PENDING_TURNS  # none twice, none lost
    running = Subtask.objects.filter(status="RUNNING")
    assert running.count() == PENDING_TURNS
    # Each turn is held by the worker that received it.
    by_worker = dict(running.values_list("id", "lease_owner"))
    for index, outcome in enumerate(outcomes):
        assert all(by_worker[subtask_id] == f"w{index}" for subtask_id in outcome)


def test_cancel_and_report_at_once_never_deadlock():
    """Cancel takes the task, then its turns; reports and reclaims must take them in the same
    order, or PostgreSQL aborts one side with a deadlock error."""
    from backend.dispatch.reports import report_result
    from backend.errors import Conflict, NotFound
    from backend.tasks.models import Task
    from backend.tasks.services import cancel_task

    owner = get_user_model().objects.create_user(username="owner")
    worker = make_worker("worker")
    tasks = [
        create_task(
            owner=owner,
            title=f"t{number}",
            task_type="code",
            message="go",
            pipeline=[PipelineStep(executor="codex")],
        )
        for number in range(THREADS // 2)
    ]
    claimed = claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=THREADS)
    by_task = {turn.task.pk: turn.subtask.pk for turn in claimed}

    def act(index: int) -> object:
        task = tasks[index // 2]
        if index % 2:
            return cancel_task(task=Task.objects.get(pk=task.pk))
        try:
            return report_result(
                worker=worker,
                worker_id="w",
                attempt=1,
                subtask_id=by_task[task.pk],
                status="COMPLETED",
                result={"value": "done"},
                error="",
                usage=None,
                native_session_id="",
            )
        except (Conflict, NotFound) as refused:  # cancelled first: a clear refusal
            return refused

    outcomes = run_in_threads(act)
    unexpected = [
        outcome
        for outcome in outcomes
        if isinstance(outcome, Exception) and not isinstance(outcome, (Conflict, NotFound))
    ]
    assert not unexpected, unexpected
    for task in tasks:
        task.refresh_from_db()
        assert task.status == "CANCELLED"
        assert Subtask.objects.get(pk=by_task[task.pk]).status in ("COMPLETED", "CANCELLED")


def _task_with_a_summary_job(owner, number: int) -> None:
    """A task whose answer waits, beside a summary job of its first message (both PENDING)."""
    from django.db import transaction
    from django.utils import timezone

    from backend.prompting import Role
    from backend.tasks.models import SubtaskKind
    from backend.tasks.services import allocate_message_ids

    task = create_task(
        owner=owner,
        title=f"t{number}",
        task_type="code",
        message=f"job {number}",
        pipeline=[PipelineStep(executor="codex")],
    )
    with transaction.atomic():
        Subtask.objects.create(
            task=task,
            kind=SubtaskKind.SUMMARY,
            message_id=allocate_message_ids(task_id=task.pk, count=1),
            role=Role.ASSISTANT,
            status="PENDING",
            bot="codex",
            executor="codex",
            pending_since=timezone.now(),
            summary_first_message_id=1,
            summary_last_message_id=1,
        )


def test_turns_and_summary_jobs_are_claimed_exactly_once_and_run_side_by_side():
    owner = get_user_model().objects.create_user(username="owner")
    for number in range(PENDING_TURNS // 2):
        _task_with_a_summary_job(owner, number)
    workers = [make_worker(f"worker-{index}") for index in range(THREADS)]

    def drain(index: int) -> list[int]:
        mine = []
        while turns := claim_turns(
            worker=workers[index], worker_id=f"w{index}", kinds=["codex"], limit=3
        ):
            mine.extend(turn.subtask.pk for turn in turns)
        return mine

    outcomes = run_in_threads(drain)
    errors = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    assert not errors, errors
    claimed = [subtask_id for outcome in outcomes for subtask_id in outcome]
    assert len(claimed) == len(set(claimed)) == PENDING_TURNS
    # A task's turn and its summary job run at the same time: a dispatch never waits.
    assert Subtask.objects.filter(status="RUNNING", kind="summary").count() == PENDING_TURNS // 2
    assert Subtask.objects.filter(status="RUNNING", kind="turn").count() == PENDING_TURNS // 2


def test_a_summary_job_is_scheduled_once_however_many_dispatches_call_for_it():
    from backend.dispatch import summaries
    from backend.dispatch.models import HistoryPolicy
    from backend.dispatch.policies import resolve_policy
    from backend.dispatch.prompts import build_turn_prompt
    from backend.dispatch.summaries import schedule_summaries
    from backend.tasks.factories import answer_pending
    from backend.tasks.models import Task
    from backend.tasks.services import append_message

    HistoryPolicy.objects.update_or_create(
        task_type="code",
        defaults={
            "summaries_enabled": True,
            "summary_bot": "codex",
            "summary_threshold_turns": 4,
            "max_messages": 4,
            "overrides": [
                "summaries_enabled",
                "summary_bot",
                "summary_threshold_turns",
                "max_messages",
            ],
        },
    )
    owner = get_user_model().objects.create_user(username="owner")
    task = create_task(
        owner=owner,
        title="long",
        task_type="code",
        message="q 0",
        pipeline=[PipelineStep(executor="codex")],
    )
    for number in range(1, 12):
        answer_pending(task=task, answer=f"a {number}")
        append_message(task=task, message=f"q {number}")
    [pending] = Subtask.objects.filter(task=task, status="PENDING")
    prompt = build_turn_prompt(
        subtask=pending,
        task=Task.objects.get(pk=task.pk),
        resolved=resolve_policy(task_type="code"),
    )
    assert prompt.build.report.messages_omitted >= 4

    assert len(schedule_summaries(prompts=[(pending, prompt)])) == 1
    assert schedule_summaries(prompts=[(pending, prompt)]) == []  # one is in flight
    Subtask.objects.filter(task=task, kind="summary").delete()
    # Dispatches that all found no job in flight: the check under the task's lock decides.
    candidate = summaries._candidate(pending, prompt)
    assert candidate is not None
    outcomes = run_in_threads(lambda index: summaries._schedule(candidate))
    assert not [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    assert sum(outcome is not None for outcome in outcomes) == 1
    assert Subtask.objects.filter(task=task, kind="summary").count() == 1
