"""What a dispatch records after its claim: the prompt reports and the turns' `turn.claimed`
events (with their tasks' RUNNING status) commit together, or not at all."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from backend.dispatch.claims import claim_turns
from backend.dispatch.models import PromptReport
from backend.tasks import task_events
from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskEvent, TaskStatus
from backend.tasks.services import PipelineStep, create_task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def _running_turn(user) -> Subtask:
    """A task's first turn as a claim leaves it: RUNNING, its task not yet."""
    task = create_task(
        owner=user,
        title="t",
        task_type="code",
        message="Fix the build.",
        pipeline=[PipelineStep(executor="codex")],
    )
    turn = task.subtasks.get(role="ASSISTANT")
    Subtask.objects.filter(pk=turn.pk).update(status=SubtaskStatus.RUNNING, attempts=1)
    turn.refresh_from_db()
    return turn


def test_events_are_not_recorded_without_the_rows_written_along(user):
    turn = _running_turn(user)
    status_before = Task.objects.get(pk=turn.task_id).status
    events_before = TaskEvent.objects.filter(task_id=turn.task_id).count()
    # A report with only its turn named: its other columns are NOT NULL.
    refused = [PromptReport(subtask_id=turn.pk, task_id=turn.task_id)]
    with pytest.raises(DatabaseError), transaction.atomic():
        task_events.record_claims(turns=[turn], along=refused)
    assert TaskEvent.objects.filter(task_id=turn.task_id).count() == events_before
    assert Task.objects.get(pk=turn.task_id).status == status_before != TaskStatus.RUNNING
    task_events.record_claims(turns=[turn])
    assert TaskEvent.objects.filter(task_id=turn.task_id).latest("seq").type == "turn.claimed"
    assert Task.objects.get(pk=turn.task_id).status == TaskStatus.RUNNING


def test_a_claim_stores_its_reports_and_then_its_events(user, worker):
    turn = _running_turn(user)
    Subtask.objects.filter(pk=turn.pk).update(status=SubtaskStatus.PENDING, attempts=0)
    with CaptureQueriesContext(connection) as queries:
        [claimed] = claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=1)
    report = PromptReport.objects.get(subtask_id=turn.pk)
    assert (report.attempt, report.worker_id, report.claimed_by_id) == (1, "w", worker.pk)
    assert report.prompt_sha256 == claimed.report.prompt_sha256
    event = TaskEvent.objects.filter(task_id=turn.task_id).latest("seq")
    assert (event.type, event.subtask_id) == ("turn.claimed", turn.pk)
    statements = [query["sql"] for query in queries.captured_queries]
    [reports] = [
        index
        for index, statement in enumerate(statements)
        if PromptReport._meta.db_table in statement and "INSERT" in statement
    ]
    events = [
        index
        for index, statement in enumerate(statements)
        if TaskEvent._meta.db_table in statement and "INSERT" in statement
    ]
    # One statement holds both on PostgreSQL; the ORM inserts the reports first.
    assert len(events) == 1 and reports <= events[0]
    assert (reports == events[0]) == (connection.vendor == "postgresql")
