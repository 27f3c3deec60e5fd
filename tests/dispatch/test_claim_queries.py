"""What a claim costs in queries: fixed, whatever the policy and however long the histories.

A claim whose prompts leave history out costs a fixed number more, for the whole batch: reading
the turns of the transcripts their omission notices point to, and storing the transcripts, the
turn indexes and the turn files (one per earlier turn) not stored yet. A summary they show costs
nothing more (it comes with the history's anchors), and a batch of summary jobs costs a fixed
number too.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backend.configuration_cache import CONFIGURATION
from backend.dispatch.claims import claim_turns
from backend.dispatch.models import HistoryPolicy
from backend.prompting import Role
from backend.tasks import transcript_spans
from backend.tasks.models import Subtask, SubtaskKind, SubtaskStatus, Task
from backend.tasks.services import (
    PipelineStep,
    allocate_message_ids,
    append_message,
    create_task,
    record_result,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


@pytest.fixture(autouse=True)
def no_short_parts(monkeypatch):
    """The histories here (50 turns) stay shorter than a sealed part: what sealing one costs is
    counted in `test_transcript_parts`."""
    monkeypatch.setattr(
        transcript_spans, "TRANSCRIPT_SHORT_PART_TURNS", transcript_spans.TRANSCRIPT_PART_TURNS
    )


TASKS = 10
# The `code` policy under test: no message cap (a character budget, large or small), no cap
# at all, the shipped default, a small message cap.
POLICIES = {
    "max_messages_none": {"max_messages": None},
    "max_messages_none_small_chars": {
        "max_messages": None,
        "max_chars": 300,
        "per_message_max_chars": 100,
    },
    "no_caps": {"max_messages": None, "max_chars": None, "per_message_max_chars": None},
    "default": {},
    "max_messages_2": {"max_messages": 2},
}
# Everything but checking leases, taking the turns (and reading them), their native sessions,
# the history and recording them: bots, their models' rows in the model table, policy rows.
# The claims counted here are the first since the configuration changed, so they read bots,
# models and policies; a later one reuses what they read (`test_configuration_cache`).
FIXED_QUERIES = 3
# When a prompt leaves history out: the transcripts' sealed parts (none here: the histories
# are shorter than a part) and the turns after them; in their own transaction (here a
# savepoint and its release) inserting the artifacts (transcripts, turn indexes, the turn
# files of turns without an artifact) and locking their rows, pointing the tasks to their
# transcript and index and linking the new turn files to their turns; and reading the
# manifest (which a batch without pointer lines skips). Every claim here has new turn files:
# the rounds they answer were recorded since the last claim.
TRANSCRIPT_QUERIES = 9


def claim_queries(claimed: int) -> int:
    """Checking for leases run out, taking the turns and reading them: one `WITH claimed AS
    (UPDATE … WHERE id IN (SELECT … SKIP LOCKED) RETURNING …) SELECT …` on PostgreSQL, which
    returns the claimed rows with their tasks, the configuration version and whether a lease
    ran out; on SQLite the lease check, then a transaction (here a savepoint and its release)
    of a read and a compare-and-set UPDATE per turn taken, then the configuration version and
    the claimed rows."""
    return 1 if connection.vendor == "postgresql" else 6 + claimed


def session_queries() -> int:
    """The claimed turns' native sessions: PostgreSQL's claim statement returns them."""
    return 0 if connection.vendor == "postgresql" else 1


def history_queries(caps: dict) -> int:
    """The history, under any policy: on PostgreSQL one statement picks the windows, the totals
    and the anchors and reads their rows (`history_selection`); on SQLite the ORM ranks the
    window ids with the totals, then reads the window rows and the anchors."""
    return 1 if connection.vendor == "postgresql" else 3


def event_queries() -> int:
    """The prompt reports, the `turn.claimed` events and the tasks' status, for any number of
    tasks: on PostgreSQL one statement (`record_claims`: inserting the reports, reading the
    turns still running, numbering the events on the tasks, which start running, inserting
    the events, notifying the tasks' streams); elsewhere a transaction (here a savepoint and
    its release) of the reports' insert and four steps: the turns still running, the tasks'
    numbers read, then reserved with their status, the events."""
    return 1 if connection.vendor == "postgresql" else 7


def answered_tasks(user, *, executor: str, rounds: int) -> None:
    for number in range(TASKS):
        task = create_task(
            owner=user,
            title=f"{executor} {number}",
            task_type="code",
            message="question 1",
            pipeline=[PipelineStep(executor=executor)],
        )
        for answer in range(1, rounds + 1):
            turn = task.subtasks.get(role=Role.ASSISTANT, status=SubtaskStatus.PENDING)
            record_result(
                subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": f"answer {answer}"}
            )
            append_message(task=task, message=f"question {answer + 1}")


def queries_to_claim(worker, *, kinds: list[str], limit: int) -> tuple[int, bool]:
    """Queries of one claim, and whether a prompt left history out; rolled back afterwards so
    every setting claims the same turns."""
    CONFIGURATION.clear()
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            claimed = claim_turns(worker=worker, worker_id="w", kinds=kinds, limit=limit)
        assert len(claimed) == limit
        omits = any(turn.report.messages_omitted for turn in claimed)
        transaction.set_rollback(True)
    return len(queries.captured_queries), omits


def test_a_claim_costs_the_same_whatever_the_policy_and_the_length_of_the_histories(user, worker):
    # Ten tasks with one answered round each, and ten with 25 (50 turns of history, more
    # than any message cap here): a claim must cost the same for both.
    answered_tasks(user, executor="claude_code", rounds=1)
    answered_tasks(user, executor="codex", rounds=25)
    for name, caps in POLICIES.items():
        # A row's value applies where the row names it among its overrides.
        HistoryPolicy.objects.filter(task_type="code").update(**caps, overrides=list(caps))
        for limit in (1, TASKS):
            expected = (
                FIXED_QUERIES
                + history_queries(caps)
                + claim_queries(limit)
                + session_queries()
                + event_queries()
            )
            short, short_omits = queries_to_claim(worker, kinds=["claude_code"], limit=limit)
            long, long_omits = queries_to_claim(worker, kinds=["codex"], limit=limit)
            assert short == expected + TRANSCRIPT_QUERIES * short_omits, (name, limit)
            assert long == expected + TRANSCRIPT_QUERIES * long_omits, (name, limit)
            if name not in ("no_caps", "max_messages_none"):
                # The long histories are cut (fifty short turns fit the default character
                # cap): transcripts were counted.
                assert long_omits, name


SUMMARIES_ON = {
    "summaries_enabled": True,
    "summary_bot": "summarizer",
    # Never due here: the schedule check needs no query (see the summary job test below).
    "summary_threshold_turns": 10_000,
    "max_messages": 8,
}


def with_summaries(*, threshold: int = 10_000) -> None:
    values = {**SUMMARIES_ON, "summary_threshold_turns": threshold}
    HistoryPolicy.objects.filter(task_type="code").update(
        **values, overrides=[*values, "max_messages"]
    )


def summary_job(task: Task, *, last: int, finished: bool) -> Subtask:
    """A summary job of `task` covering messages 1 to `last`, finished or pending."""
    with transaction.atomic():
        message_id = allocate_message_ids(task_id=task.pk, count=1)
        job = Subtask.objects.create(
            task=task,
            kind=SubtaskKind.SUMMARY,
            message_id=message_id,
            role=Role.ASSISTANT,
            status=SubtaskStatus.PENDING,
            bot="summarizer",
            executor="agno",
            pending_since=timezone.now(),
            summary_first_message_id=1,
            summary_last_message_id=last,
        )
    if finished:
        record_result(subtask=job, status=SubtaskStatus.COMPLETED, result={"value": "so far"})
    return job


def test_a_finished_summary_costs_a_claim_no_query(user, worker):
    answered_tasks(user, executor="codex", rounds=25)
    for task in Task.objects.all():
        summary_job(task, last=20, finished=True)
    with_summaries()
    for limit in (1, TASKS):
        CONFIGURATION.clear()
        with transaction.atomic():
            with CaptureQueriesContext(connection) as queries:
                claimed = claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=limit)
            assert len(claimed) == limit
            assert all(turn.report.summary_last_message_id == 20 for turn in claimed)
            transaction.set_rollback(True)
        expected = (
            FIXED_QUERIES
            + history_queries({})  # the shipped policy
            + claim_queries(limit)
            + session_queries()
            + event_queries()
            + TRANSCRIPT_QUERIES
        )
        assert len(queries.captured_queries) == expected, limit


# Claiming summary jobs, besides checking leases and taking and reading them: the summaries they
# build on, bots, the bots' models (the model table), policy rows, the jobs' turns and folded
# summaries, the turns those summaries cover (by role), the reports' insert. Their tasks' status
# is left alone: no query.
SUMMARY_JOB_QUERIES = 7


def test_claiming_summary_jobs_costs_the_same_however_many(user, worker):
    answered_tasks(user, executor="codex", rounds=25)
    for task in Task.objects.all():
        summary_job(task, last=10, finished=True)
        job = summary_job(task, last=30, finished=False)
        previous = Task.objects.get(pk=task.pk).summary_id
        Subtask.objects.filter(pk=job.pk).update(summary_previous=previous)
    with_summaries()
    for limit in (1, TASKS):
        CONFIGURATION.clear()
        with transaction.atomic():
            with CaptureQueriesContext(connection) as queries:
                claimed = claim_turns(worker=worker, worker_id="w", kinds=["agno"], limit=limit)
            assert len(claimed) == limit
            assert all(turn.subtask.kind == SubtaskKind.SUMMARY for turn in claimed)
            assert all(turn.report.summary_last_message_id == 10 for turn in claimed)
            transaction.set_rollback(True)
        expected = SUMMARY_JOB_QUERIES + claim_queries(limit)
        assert len(queries.captured_queries) == expected, limit
