"""Pruning against a writer that references the artifact concurrently (PostgreSQL, two connections).

The writer's new reference is not yet committed when prune looks, so prune removes the row; the
deferred foreign key then refuses the writer's commit. Either way no turn is left pointing at a
removed artifact.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.tasks.artifact_retention import prune_artifacts
from backend.tasks.models import Subtask
from tests.artifacts.conftest import spill, task_of

# A transactional test flushes every table, the shipped bots included: `shipped_bots` puts them
# back, so the test does not depend on which tests ran before it.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres_only,
    pytest.mark.usefixtures("shipped_bots"),
]


def test_a_reference_committed_after_pruning_is_refused(user) -> None:
    doomed = spill(owner=user, text="doomed\n" + "d" * 20_000)
    Artifact.objects.filter(pk=doomed.pk).update(created_at=timezone.now() - timedelta(days=90))
    task_of(doomed).delete()
    other = spill(owner=user, text="other\n" + "o" * 20_000)
    turn = Subtask.objects.get(artifact=other)

    referenced = threading.Event()
    pruned = threading.Event()
    outcome: list[object] = []

    def reference_then_commit() -> None:
        try:
            with transaction.atomic():
                Subtask.objects.filter(pk=turn.pk).update(artifact=doomed.pk)
                referenced.set()
                assert pruned.wait(timeout=60)
            outcome.append("committed")
        except Exception as error:  # noqa: BLE001 - the test inspects the outcome
            outcome.append(error)
        finally:
            connection.close()

    writer = threading.Thread(target=reference_then_commit)
    writer.start()
    try:
        assert referenced.wait(timeout=60)
        removed = prune_artifacts(older_than=timedelta(days=30), dry_run=False)
    finally:
        pruned.set()
        writer.join(timeout=60)

    assert [artifact.id for artifact in removed] == [doomed.id]
    assert len(outcome) == 1 and isinstance(outcome[0], IntegrityError)
    assert Subtask.objects.get(pk=turn.pk).artifact_id == other.pk
    assert not Subtask.objects.filter(artifact_id=doomed.pk).exists()
