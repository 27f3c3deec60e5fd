"""What a claim costs in queries: fixed, whatever the policy and however long the histories.

A claim whose prompts leave history out costs a fixed number more, for the whole batch: reading
the turns of the transcripts their omission notices point to, and storing the transcripts, the
turn indexes and the turn files (one per earlier turn) not stored yet.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from backend.dispatch.claims import claim_turns
from backend.dispatch.models import HistoryPolicy
from backend.prompting import Role
from backend.tasks.models import SubtaskStatus
from backend.tasks.services import PipelineStep, append_message, create_task, record_result

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

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
# Everything but taking the turns: reclaim, the savepoint around the claim and its release,
# the task status update, the claimed turns, bots, their models' rows in the model table, policy
# rows, the history (anchors, window ids, window rows), native sessions and the reports' insert.
FIXED_QUERIES = 13
# When a prompt leaves history out: the transcripts' turns; in their own transaction (here a
# savepoint and its release) inserting the new artifacts (transcripts, turn indexes, the turn
# files of turns without an artifact), locking them all, pointing the tasks to their transcript
# and index and linking the new turn files to their turns; and reading the manifest (which a
# batch without pointer lines skips). Every claim here has new turn files: the rounds they
# answer were recorded since the last claim.
TRANSCRIPT_QUERIES = 8


def claim_queries(claimed: int) -> int:
    """Taking the turns: a locking read and one UPDATE with SKIP LOCKED; without it a read
    and a compare-and-set UPDATE per turn taken (SQLite)."""
    return 2 if connection.features.has_select_for_update_skip_locked else 1 + claimed


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
        HistoryPolicy.objects.filter(task_type="code").update(**caps)
        for limit in (1, TASKS):
            expected = FIXED_QUERIES + claim_queries(limit)
            short, short_omits = queries_to_claim(worker, kinds=["claude_code"], limit=limit)
            long, long_omits = queries_to_claim(worker, kinds=["codex"], limit=limit)
            assert short == expected + TRANSCRIPT_QUERIES * short_omits, (name, limit)
            assert long == expected + TRANSCRIPT_QUERIES * long_omits, (name, limit)
            if name != "no_caps":
                assert long_omits  # the long histories are cut: transcripts were counted
