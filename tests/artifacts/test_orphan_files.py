"""The orphan sweep: stored files no artifact row owns go once they are older than the grace
period; owned files, young files and anything outside the artifact layout stay. And the file of
a pruned artifact whose text is recorded again meanwhile is kept."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from io import StringIO

import pytest
from django.core.files.base import ContentFile
from django.core.management import call_command
from django.utils import timezone

from backend.artifacts import retention
from backend.artifacts.models import Artifact
from backend.artifacts.retention import OrphanFile, remove_orphan_files, remove_unowned_file
from backend.artifacts.selectors import artifact_content
from backend.artifacts.storage import artifact_storage, content_address
from backend.tasks.artifact_retention import prune_artifacts
from tests.artifacts.conftest import spill, task_of

pytestmark = pytest.mark.django_db

GRACE = timedelta(hours=1)


def put(key: str, data: bytes, *, age: timedelta) -> str:
    """Store `data` at `key` as a file last modified `age` ago (the storage is a directory)."""
    storage = artifact_storage()
    assert storage.save(key, ContentFile(data)) == key
    modified = (timezone.now() - age).timestamp()
    os.utime(storage.path(key), (modified, modified))
    return key


def put_orphan(text: str, *, age: timedelta) -> str:
    """A whole file at the text's content address, with no row (a rolled-back write)."""
    return put(content_address(text).storage_key, text.encode(), age=age)


def exists(key: str) -> bool:
    return artifact_storage().exists(key)


def test_only_old_files_no_row_owns_are_removed(user) -> None:
    old = put_orphan("rolled back\n" * 2_000, age=timedelta(days=2))
    young = put_orphan("being written\n" * 2_000, age=timedelta(minutes=5))
    sha = content_address("crashed halfway\n" * 2_000).sha256
    partial = put(f"{sha[:2]}/{sha}.txt", b"crashed ha", age=timedelta(days=2))
    renamed = put(f"{sha[:2]}/{sha}_Ab12xYz.txt", b"crashed", age=timedelta(days=2))
    owned = spill(owner=user)
    modified = (timezone.now() - timedelta(days=90)).timestamp()
    os.utime(artifact_storage().path(owned.storage_key), (modified, modified))

    removed = remove_orphan_files(older_than=GRACE, dry_run=False)

    assert sorted(orphan.storage_key for orphan in removed) == sorted([old, partial, renamed])
    assert {orphan.storage_key: orphan.size_bytes for orphan in removed}[partial] == 10
    assert not any(exists(key) for key in (old, partial, renamed))
    assert exists(young)
    assert exists(owned.storage_key)
    assert artifact_content(artifact=Artifact.objects.get()).size_bytes == owned.size_bytes


def test_files_outside_the_artifact_layout_are_never_touched() -> None:
    sha = "ab" + "0" * 62
    foreign = [
        put("README.txt", b"not ours", age=timedelta(days=30)),
        put("ab/notes.txt", b"not ours", age=timedelta(days=30)),
        put(f"cd/{sha}.txt", b"wrong shard", age=timedelta(days=30)),
        put(f"backups/ab/{sha}.txt", b"elsewhere", age=timedelta(days=30)),
    ]
    assert remove_orphan_files(older_than=GRACE, dry_run=False) == []
    assert all(exists(key) for key in foreign)


def test_a_dry_run_lists_orphans_and_removes_nothing() -> None:
    old = put_orphan("rolled back\n" * 2_000, age=timedelta(days=2))
    assert remove_orphan_files(older_than=GRACE, dry_run=True) == [
        OrphanFile(storage_key=old, size_bytes=len(("rolled back\n" * 2_000).encode()))
    ]
    assert exists(old)


def test_an_empty_storage_has_no_orphans() -> None:
    assert remove_orphan_files(older_than=GRACE, dry_run=False) == []


def test_the_command_sweeps_orphans_after_pruning_and_logs_counts(user, caplog) -> None:
    text = "rolled back\n" * 2_000
    old = put_orphan(text, age=timedelta(days=2))
    put_orphan("being written\n" * 2_000, age=timedelta(minutes=5))
    out = StringIO()
    with caplog.at_level(logging.INFO, logger="baton.events"):
        call_command("prune_artifacts", "--older-than", "30", stdout=out)

    size = len(text.encode())
    assert out.getvalue().splitlines() == [
        "Removed 0 artifacts, 0 bytes",
        f"removed orphan file {old} {size} bytes",
        f"Removed 1 orphan files, {size} bytes",
    ]
    assert not exists(old)
    assert (
        f'{{"dry_run": false, "event": "orphan_files_removed", "files": 1, "size_bytes": {size}}}'
        in caplog.messages
    )
    assert "rolled back" not in caplog.text


def test_the_grace_period_is_a_setting(settings) -> None:
    old = put_orphan("rolled back\n" * 2_000, age=timedelta(hours=2))
    settings.BATON_ARTIFACT_ORPHAN_GRACE_SECONDS = 3 * 3600
    call_command("prune_artifacts", "--older-than", "30", stdout=StringIO())
    assert exists(old)
    settings.BATON_ARTIFACT_ORPHAN_GRACE_SECONDS = 3600
    call_command("prune_artifacts", "--older-than", "30", stdout=StringIO())
    assert not exists(old)


def test_a_file_is_never_removed_while_a_row_owns_it(user) -> None:
    artifact = spill(owner=user)
    assert remove_unowned_file(sha256=artifact.sha256, storage_key=artifact.storage_key) is False
    assert exists(artifact.storage_key)
    assert Artifact.objects.filter(pk=artifact.pk).exists()  # the stand-in row changed nothing


def test_a_pruned_artifact_recorded_again_before_its_file_goes_keeps_the_file(
    user, other_user, monkeypatch
) -> None:
    """Prune commits the row's removal; identical text is recorded again before the file is
    removed: the new row owns the file, so it stays and serves the text."""
    text = "shared\n" + "s" * 20_000
    doomed = spill(owner=user, text=text)
    Artifact.objects.filter(pk=doomed.pk).update(created_at=timezone.now() - timedelta(days=90))
    task_of(doomed).delete()
    real_removal = retention.remove_unowned_file
    again = []

    def recorded_again_first(*, sha256: str, storage_key: str) -> bool:
        again.append(spill(owner=other_user, text=text))
        return real_removal(sha256=sha256, storage_key=storage_key)

    monkeypatch.setattr(retention, "remove_unowned_file", recorded_again_first)
    assert [
        pruned.id for pruned in prune_artifacts(older_than=timedelta(days=30), dry_run=False)
    ] == [doomed.id]

    assert [artifact.pk for artifact in again] == [doomed.pk]
    assert artifact_content(artifact=Artifact.objects.get(pk=doomed.pk)).size_bytes == len(
        text.encode()
    )


def test_text_recorded_again_after_its_file_went_is_stored_again(user, other_user) -> None:
    """The row survived but its file is gone (removed before this writer held the row): the
    writer, holding the row, finds the file missing and writes it."""
    text = "again\n" + "a" * 20_000
    artifact = spill(owner=user, text=text)
    artifact_storage().delete(artifact.storage_key)

    assert spill(owner=other_user, text=text) == artifact
    assert artifact_content(artifact=artifact).size_bytes == len(text.encode())
