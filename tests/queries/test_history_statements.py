"""`history_selection` (backend/queries/history.sql) reads what the ORM's form of the history
selection reads, case by case: windows under each kind of policy, anchors, summaries, the
totals through sealed transcript parts, and a batch of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from backend.artifacts.services import store_artifact
from backend.prompting import PromptPolicy, Role
from backend.tasks import transcript_spans
from backend.tasks.factories import conversation
from backend.tasks.history import selection
from backend.tasks.history.rows import STEERED_INTO_BOT
from backend.tasks.models import Subtask, SubtaskKind, SubtaskStatus, Task, TranscriptPart
from backend.tasks.services import PipelineStep, allocate_message_ids, record_result

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db,
    pytest.mark.usefixtures("pipeline_bots"),
]

CAPPED = PromptPolicy(max_messages=4)
BY_CHARS = PromptPolicy(max_messages=None, max_chars=700, per_message_max_chars=200)
BY_CHARS_UNCAPPED = PromptPolicy(max_messages=None, max_chars=700, per_message_max_chars=None)
UNBOUNDED = PromptPolicy(max_messages=None, max_chars=None, per_message_max_chars=None)
SUMMARIES = PromptPolicy(max_messages=4, summaries_enabled=True, summary_bot="summarizer")


def chat(user, rounds: int, *, steps: int = 1, answer_chars: int = 0) -> Task:
    """A task with `rounds` answered rounds and one more pending user message."""
    pipeline = (
        [
            PipelineStep(bot="coder", executor="codex"),
            PipelineStep(bot="reviewer", executor="claude_code"),
        ]
        if steps == 2
        else [PipelineStep(executor="agno")]
    )
    return conversation(
        owner=user,
        title="chat",
        task_type="chat",
        messages=[f"question {number}" for number in range(1, rounds + 2)],
        answers=[
            tuple(
                f"answer {number} of step {step} " + "x" * (answer_chars * number % 450)
                for step in range(steps)
            )
            for number in range(1, rounds + 1)
        ],
        pipeline=pipeline,
    )


def pending(task: Task) -> list[Subtask]:
    return list(
        task.subtasks.filter(role=Role.ASSISTANT, status=SubtaskStatus.PENDING).order_by(
            "message_id"
        )
    )


def summarized(task: Task, *, last: int) -> Task:
    """`task` with a finished summary of messages 1 to `last`."""
    with transaction.atomic():
        job = Subtask.objects.create(
            task=task,
            kind=SubtaskKind.SUMMARY,
            message_id=allocate_message_ids(task_id=task.pk, count=1),
            role=Role.ASSISTANT,
            status=SubtaskStatus.PENDING,
            bot="summarizer",
            executor="agno",
            pending_since=timezone.now(),
            summary_first_message_id=1,
            summary_last_message_id=last,
        )
    record_result(subtask=job, status=SubtaskStatus.COMPLETED, result={"value": "so far"})
    return Task.objects.get(pk=task.pk)


def sealed(task: Task, *, span: int, ranges: list[tuple[int, int]]) -> Task:
    """`task` with sealed parts of `span` over the message ranges given, each holding the
    counts of the history turns in its range (as sealing stores them)."""
    artifact = store_artifact(text=f"part of task {task.pk}", kind="text", task_id=task.pk)
    for number, (first, last) in enumerate(ranges):
        turns = task.subtasks.filter(
            message_id__gte=first, message_id__lte=last, kind=SubtaskKind.TURN
        )
        TranscriptPart.objects.create(
            task=task,
            span=span,
            number=number,
            first_message_id=first,
            last_message_id=last,
            message_runs=[[first, last]],
            turns=turns.count(),
            users=turns.filter(role=Role.USER).count(),
            assistants=turns.filter(role=Role.ASSISTANT).count(),
            is_group_chat=False,
            multi_bot=False,
            builder_version="test",
            transcript=artifact,
            turn_index=artifact,
            turn_files=artifact,
            pieces=[],
        )
    return task


def interrupted(task: Task) -> Task:
    """`task` with its second answer interrupted and its fourth cancelled."""
    task.subtasks.filter(message_id=2).update(status=SubtaskStatus.INTERRUPTED)
    task.subtasks.filter(message_id=4).update(status=SubtaskStatus.CANCELLED)
    return task


def steered(task: Task) -> Task:
    """`task` with user messages 5 and 7 given to running answers (steers): 5 to one a window
    of four leaves out, 7 to one without a bot."""
    task.subtasks.filter(message_id=5).update(steered_into_message_id=2)
    task.subtasks.filter(message_id=7).update(steered_into_message_id=6)
    task.subtasks.filter(message_id=6).update(bot="")
    return task


LONG = transcript_spans.TRANSCRIPT_PART_TURNS
SHORT = transcript_spans.TRANSCRIPT_SHORT_PART_TURNS

# Each case: the tasks and policies of a batch, made from a user.
CASES: dict[str, Callable[[Any], list[tuple[Task, PromptPolicy]]]] = {
    "first turn, no history": lambda user: [(chat(user, 0), CAPPED)],
    "history off": lambda user: [(chat(user, 3), PromptPolicy(enabled=False))],
    "window capped, first message pinned": lambda user: [(chat(user, 6), CAPPED)],
    "window capped, nothing pinned": lambda user: [
        (chat(user, 6), PromptPolicy(max_messages=3, keep_first_user_message=False))
    ],
    "window by characters, capped per message": lambda user: [
        (chat(user, 12, answer_chars=37), BY_CHARS)
    ],
    "window by characters": lambda user: [(chat(user, 12, answer_chars=37), BY_CHARS_UNCAPPED)],
    "window unbounded": lambda user: [(chat(user, 8), UNBOUNDED)],
    "interrupted and cancelled turns": lambda user: [(interrupted(chat(user, 4)), CAPPED)],
    "previous pipeline step": lambda user: [(chat(user, 3, steps=2), CAPPED)],
    "latest summary": lambda user: [(summarized(chat(user, 6), last=6), SUMMARIES)],
    "summary of later turns": lambda user: [(summarized(chat(user, 2), last=4), SUMMARIES)],
    "sealed long parts": lambda user: [
        (sealed(chat(user, 8), span=LONG, ranges=[(1, 4), (5, 8)]), CAPPED)
    ],
    "sealed long and short parts": lambda user: [
        (
            sealed(
                sealed(chat(user, 10), span=LONG, ranges=[(1, 6)]),
                span=SHORT,
                ranges=[(7, 8), (9, 10)],
            ),
            CAPPED,
        )
    ],
    "short parts a long part covers": lambda user: [
        (
            sealed(
                sealed(chat(user, 10), span=SHORT, ranges=[(1, 2), (3, 4), (5, 6), (7, 8)]),
                span=LONG,
                ranges=[(1, 4)],
            ),
            CAPPED,
        )
    ],
    "steered user messages": lambda user: [(steered(chat(user, 4)), CAPPED)],
    "a batch of every policy": lambda user: [
        (chat(user, 0), CAPPED),
        (chat(user, 6), CAPPED),
        (chat(user, 12, answer_chars=37), BY_CHARS),
        (chat(user, 12, answer_chars=41), BY_CHARS_UNCAPPED),
        (chat(user, 5), UNBOUNDED),
        (summarized(chat(user, 6), last=6), SUMMARIES),
        (sealed(chat(user, 8), span=LONG, ranges=[(1, 4)]), CAPPED),
    ],
}


def _read(turn: Subtask, fields: tuple[str, ...]) -> tuple[Any, ...]:
    """A selected turn's values of `fields` (its artifact's as `artifact__…`) and what was left
    unread of it."""
    values = [
        getattr(turn.artifact, name.split("__", 1)[1], None)
        if name.startswith("artifact__")
        else getattr(turn, name)
        for name in fields
    ]
    steered_into_bot = getattr(turn, STEERED_INTO_BOT)
    return (*values, steered_into_bot, frozenset(turn.get_deferred_fields()))


def _seen(read: selection.Selection) -> dict[str, Any]:
    return {
        "window": [_read(turn, selection.WINDOW_FIELDS) for turn in read.window],
        "totals": read.totals,
        "anchors": sorted(_read(turn, selection.ANCHOR_FIELDS) for turn in read.anchors),
    }


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_statement_selects_what_the_orm_selects(user, case, django_assert_num_queries):
    batch = [
        selection.HistoryRequest(turn, task, policy)
        for task, policy in case(user)
        for turn in pending(task)[:1]
    ]
    with django_assert_num_queries(1):
        by_statement = selection._selected_by_statement(batch)
    assert _seen(by_statement) == _seen(selection._selected_by_orm(batch))
    assert by_statement.window or by_statement.anchors


def test_the_sealed_parts_replace_counting_their_turns(user, django_assert_num_queries):
    """The totals add up the sealed parts' counts: a part's counts are what the totals say,
    whatever its turns are now."""
    task = sealed(chat(user, 8), span=LONG, ranges=[(1, 4)])
    TranscriptPart.objects.filter(task=task).update(users=100, assistants=200)
    [turn] = pending(task)[:1]
    read = selection._selected_by_statement([selection.HistoryRequest(turn, task, CAPPED)])
    assert read.totals == {task.pk: (100 + 6, 200 + 6)}


def test_postgresql_keeps_one_plan_for_the_statement(user):
    """Prepared after a few runs, the statement is planned once and its plan reused: the plan
    kept counts the rows of the array parameters from the counts in the text. (Told only of
    the arrays, PostgreSQL assumes 100 rows each, finds that plan dearer than one for the
    values of each run, and plans again on every run: most of the statement's cost.)"""
    task = chat(user, 6, steps=2)
    [turn] = pending(task)[:1]
    batch = [selection.HistoryRequest(turn, task, SUMMARIES)]
    for _ in range(15):
        selection._selected_by_statement(batch)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%LIMIT 1\n),\npicked AS%"],
        )
        [(generic, custom)] = cursor.fetchall()
    assert generic >= 5, (generic, custom)
