"""The transcript statements (`backend/queries/transcripts.sql`) against the ORM's queries
they stand for on PostgreSQL, which SQLite runs."""

from __future__ import annotations

import pytest
from django.db.models import Q

from backend import queries
from backend.dispatch.policies import resolve_policy
from backend.dispatch.prompts import build_turn_prompt
from backend.tasks import transcript_spans
from backend.tasks.factories import conversation, pending_assistant_turns
from backend.tasks.history import HISTORY_STATUSES
from backend.tasks.models import ACTIVE_SUBTASK_STATUSES, Subtask, SubtaskKind, TranscriptPart
from backend.tasks.transcripts import reading, sealing, store_transcripts

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db]


@pytest.fixture
def sealed(monkeypatch, django_user_model):
    """Two tasks whose transcripts are stored in parts of both lengths, and one without."""
    monkeypatch.setattr(transcript_spans, "TRANSCRIPT_PART_TURNS", 8)
    monkeypatch.setattr(transcript_spans, "TRANSCRIPT_SHORT_PART_TURNS", 2)
    owner = django_user_model.objects.create(username="owner")
    tasks = []
    for rounds in (30, 16, 1):
        task = conversation(
            owner=owner,
            messages=[f"question {number}" for number in range(rounds + 1)],
            answers=(f"answer {number}" for number in range(rounds)),
        )
        [turn] = pending_assistant_turns(task=task)
        prompt = build_turn_prompt(
            subtask=turn, task=task, resolved=resolve_policy(task_type=task.task_type)
        )
        if prompt.transcript is not None:
            store_transcripts({task.pk: prompt.transcript})
        tasks.append(task)
    return tasks


def test_transcript_parts_reads_what_the_orm_reads(sealed):
    task_ids = [sealed[1].pk, sealed[0].pk, sealed[2].pk]
    oracle = list(
        TranscriptPart.objects.filter(task_id__in=task_ids)
        .order_by("task_id", "-span", "number")
        .values_list(*sealing._PART_COLUMNS)
    )
    rows = queries.fetch("transcript_parts", {"task_ids": task_ids})
    assert {row[1] for row in oracle} == {2, 8}
    assert [tuple(row) for row in rows] == oracle
    assert isinstance(rows[0][5], str) and isinstance(rows[0][12], str)
    assert [tuple(row) for row in sealing._part_rows(task_ids)] == oracle


def test_transcript_tails_reads_what_the_orm_reads(django_user_model):
    owner = django_user_model.objects.create(username="owner")
    one = conversation(owner=owner, messages=[f"q{n}" for n in range(6)], answers=["a"] * 5)
    two = conversation(owner=owner, messages=["q0", "q1", "q2"], answers=["x" * 50, "b"])
    # q1 as if it had been steered into the answer before it: read with that answer's bot.
    Subtask.objects.filter(task=two, message_id=3).update(steered_into_message_id=2)
    target_bot = Subtask.objects.get(task=two, message_id=2).bot
    turns = list(Subtask.objects.filter(task=one).order_by("message_id"))
    bounds = [
        (one.pk, turns[2].message_id, turns[-1].message_id),
        (two.pk, 0, 10**9),
    ]
    statuses = [*HISTORY_STATUSES, *ACTIVE_SUBTASK_STATUSES]
    where = Q()
    for task_id, after, before in bounds:
        where |= Q(task_id=task_id, message_id__gt=after, message_id__lt=before)
    oracle = reading._turn_rows(where & Q(kind=SubtaskKind.TURN, status__in=statuses))
    rows = reading._tail_rows(bounds)
    assert len(rows) == len(oracle) > 0
    assert list(reading._turns(rows)) == list(reading._turns(oracle))
    steered = [message for _, _, message, _ in reading._turns(rows) if message.message_id == 3]
    assert [(m.steered_into_message_id, m.steered_into_bot) for m in steered] == [
        (2, target_bot or None)
    ]
    assert target_bot
    # The JSON column comes as its text; every other column as the ORM reads it.
    assert [row[:10] + row[11:] for row in map(tuple, rows)] == [
        row[:10] + row[11:] for row in map(tuple, oracle)
    ]
