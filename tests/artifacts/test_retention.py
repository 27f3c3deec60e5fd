"""Pruning: only old artifacts that no turn references are removed, with their stored files."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.artifacts.retention import PrunedArtifact
from backend.artifacts.storage import artifact_storage
from backend.tasks import artifact_retention
from backend.tasks.artifact_retention import prune_artifacts
from backend.tasks.models import Subtask, Task
from tests.artifacts.conftest import spill, task_of

pytestmark = pytest.mark.django_db

THIRTY_DAYS = timedelta(days=30)


def age(artifact: Artifact, *, days: int, read_days_ago: int | None = None) -> None:
    """Backdate the artifact (and its task), and optionally its last read."""
    now = timezone.now()
    last_read = None if read_days_ago is None else now - timedelta(days=read_days_ago)
    Artifact.objects.filter(pk=artifact.pk).update(
        created_at=now - timedelta(days=days), last_read_at=last_read
    )
    Task.objects.filter(pk=artifact.task_id).update(created_at=now - timedelta(days=days))


def orphan(artifact: Artifact) -> None:
    """Delete the task whose turn referenced the artifact, so nothing references it."""
    task_of(artifact).delete()
    assert not Subtask.objects.filter(artifact=artifact).exists()


def stored(artifact: Artifact) -> bool:
    return artifact_storage().exists(artifact.storage_key)


@pytest.fixture
def old_orphan(user) -> Artifact:
    artifact = spill(owner=user, text="orphan\n" + "o" * 20_000, title="Old, deleted")
    age(artifact, days=90)
    orphan(artifact)
    return artifact


@pytest.fixture
def old_referenced(user) -> Artifact:
    """An artifact of a 90-day-old task whose turn still references it."""
    artifact = spill(owner=user, text="kept\n" + "k" * 20_000, title="Old, still there")
    age(artifact, days=90)
    return artifact


@pytest.fixture
def recent_orphan(user) -> Artifact:
    artifact = spill(owner=user, text="recent\n" + "r" * 20_000, title="Recent, deleted")
    age(artifact, days=3)
    orphan(artifact)
    return artifact


@pytest.fixture
def old_orphan_read_recently(user) -> Artifact:
    artifact = spill(owner=user, text="read\n" + "q" * 20_000, title="Old, read lately")
    age(artifact, days=90, read_days_ago=2)
    orphan(artifact)
    return artifact


def test_prune_removes_only_old_unreferenced_artifacts(
    old_orphan, old_referenced, recent_orphan, old_orphan_read_recently
) -> None:
    pruned = prune_artifacts(older_than=THIRTY_DAYS, dry_run=False)

    assert pruned == [
        PrunedArtifact(id=old_orphan.id, kind=old_orphan.kind, size_bytes=old_orphan.size_bytes)
    ]
    assert not Artifact.objects.filter(pk=old_orphan.pk).exists()
    assert not stored(old_orphan)
    for kept in (old_referenced, recent_orphan, old_orphan_read_recently):
        assert Artifact.objects.filter(pk=kept.pk).exists()
        assert stored(kept)


def test_referenced_artifacts_are_never_pruned(old_referenced, user) -> None:
    # Even a zero-day retention keeps what a turn of a live task points at.
    assert prune_artifacts(older_than=timedelta(0), dry_run=False) == []
    assert Artifact.objects.filter(pk=old_referenced.pk).exists()
    assert stored(old_referenced)


def test_an_artifact_referenced_only_by_a_later_task_is_kept(user, other_user) -> None:
    text = "shared\n" + "s" * 20_000
    artifact = spill(owner=user, text=text)
    assert spill(owner=other_user, text=text) == artifact
    age(artifact, days=90)
    task_of(artifact).delete()  # the producing task is gone; the other task's turn remains

    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == []
    assert Artifact.objects.filter(pk=artifact.pk).exists()
    assert stored(artifact)


def test_dry_run_removes_nothing(old_orphan, old_referenced) -> None:
    pruned = prune_artifacts(older_than=THIRTY_DAYS, dry_run=True)
    assert [artifact.id for artifact in pruned] == [old_orphan.id]
    assert Artifact.objects.filter(pk=old_orphan.pk).exists()
    assert stored(old_orphan)


def test_an_artifact_that_gains_a_reference_while_pruning_is_kept(
    old_orphan, user, monkeypatch
) -> None:
    """The candidates are listed first; the re-check under the row lock sees the new reference."""
    listed = artifact_retention.prunable_artifacts
    calls = []

    def reference_after_listing(*, older_than):
        calls.append(older_than)
        if len(calls) == 2:  # the re-check inside the per-artifact transaction
            survivor = spill(owner=user, text="other\n" + "z" * 20_000)
            Subtask.objects.filter(artifact=survivor).update(artifact=old_orphan)
        return listed(older_than=older_than)

    monkeypatch.setattr(artifact_retention, "prunable_artifacts", reference_after_listing)
    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == []
    assert len(calls) == 2
    assert Artifact.objects.filter(pk=old_orphan.pk).exists()
    assert stored(old_orphan)


def test_command_prints_what_it_removed(old_orphan, old_referenced) -> None:
    out = StringIO()
    call_command("prune_artifacts", "--older-than", "30", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines == [
        f"removed {old_orphan.id} {old_orphan.kind} {old_orphan.size_bytes} bytes",
        f"Removed 1 artifacts, {old_orphan.size_bytes} bytes",
        "Removed 0 orphan files, 0 bytes",
    ]
    assert not Artifact.objects.filter(pk=old_orphan.pk).exists()
    assert Artifact.objects.filter(pk=old_referenced.pk).exists()


def test_command_dry_run(old_orphan) -> None:
    out = StringIO()
    call_command("prune_artifacts", "--older-than", "30", "--dry-run", stdout=out)
    assert out.getvalue().splitlines() == [
        f"would remove {old_orphan.id} {old_orphan.kind} {old_orphan.size_bytes} bytes",
        f"Would remove 1 artifacts, {old_orphan.size_bytes} bytes (dry run: nothing was removed)",
        "Would remove 0 orphan files, 0 bytes (dry run: nothing was removed)",
    ]
    assert Artifact.objects.filter(pk=old_orphan.pk).exists()
    assert stored(old_orphan)


def test_command_with_nothing_to_remove(recent_orphan) -> None:
    out = StringIO()
    call_command("prune_artifacts", "--older-than", "30", stdout=out)
    assert out.getvalue().splitlines() == [
        "Removed 0 artifacts, 0 bytes",
        "Removed 0 orphan files, 0 bytes",
    ]


def test_command_refuses_negative_days() -> None:
    with pytest.raises(CommandError, match="older-than"):
        call_command("prune_artifacts", "--older-than", "-1")


def test_command_requires_older_than() -> None:
    with pytest.raises(CommandError):
        call_command("prune_artifacts")
