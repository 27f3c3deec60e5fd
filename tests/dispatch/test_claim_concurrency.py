"""Exactly-once claims: 8 workers claiming at the same time, each with its own connection."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from backend.dispatch.services import claim_turns
from backend.tasks.models import Subtask
from backend.tasks.services import PipelineStep, create_task
from tests.conftest import make_worker
from tests.tasks.test_concurrency import THREADS, run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

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
            pipeline=[PipelineStep(bot="assistant", executor="codex")],
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
