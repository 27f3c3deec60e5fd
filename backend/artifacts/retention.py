"""Retention mechanics: remember when artifacts are read, and remove artifacts safely.

Which artifacts may go is decided by whoever references them (the turns:
`backend.tasks.artifact_retention`); this module only offers the age filter and the removal of a
selection's rows and stored files, and knows nothing of tasks.

A stored file is owned by the artifact row of its sha256, and is removed only while no row owns
it, under the same hold on its content address that writers take (`remove_unowned_file`; see
`backend.artifacts.services`). Files no row owns are left by rolled-back writes and crashes;
`remove_orphan_files` sweeps them once they are older than BATON_ARTIFACT_ORPHAN_GRACE_SECONDS.
A composite artifact owns no file (its content is its parts'): removing one removes its row and
its part rows only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.artifacts.storage import StoredFile, artifact_storage, stored_files
from backend.events import log_event
from backend.prompting.addressing import artifact_id_for
from backend.prompting.kinds import ArtifactKind

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrunedArtifact:
    """One artifact that was removed (or, in a dry run, would be)."""

    id: str
    kind: str
    size_bytes: int


@dataclass(frozen=True)
class OrphanFile:
    """A stored file no artifact row owns that was removed (or, in a dry run, would be)."""

    storage_key: str
    size_bytes: int


def record_artifact_read(*, artifact_id: str) -> None:
    """Stamp `last_read_at` (one UPDATE, no read) so a recently read artifact is not pruned."""
    Artifact.objects.filter(pk=artifact_id).update(last_read_at=timezone.now())


def stale_artifacts(*, older_than: timedelta) -> QuerySet[Artifact]:
    """Artifacts created and last read more than `older_than` ago, referenced or not."""
    cutoff = timezone.now() - older_than
    return Artifact.objects.filter(created_at__lt=cutoff).filter(
        Q(last_read_at__isnull=True) | Q(last_read_at__lt=cutoff)
    )


def remove_artifacts(
    *, selection: Callable[[], QuerySet[Artifact]], dry_run: bool
) -> list[PrunedArtifact]:
    """Remove the artifacts `selection()` lists; return what was (or would be) removed.

    `selection` is called once to list the candidates, then again for each one: it is removed
    in its own transaction, its row locked and the selection checked again, so one that left the
    selection since (gained a reference, or a read) is kept; a protecting foreign key backs
    this up on commit. The stored file is removed only after the row's deletion has committed,
    and only if no row owns it by then (`remove_unowned_file`): identical content recorded again
    meanwhile keeps its file, and a crash in between leaves an orphan file for the sweep, never
    a row without its file. A composite has no file to remove; its part rows go with its row,
    and its parts stay until a later selection lists them.
    """
    candidates = list(selection().values_list("id", "kind", "size_bytes"))
    if dry_run:
        pruned = [
            PrunedArtifact(id=id_, kind=kind, size_bytes=size) for id_, kind, size in candidates
        ]
        _log_pruned(pruned, dry_run=True)
        return pruned

    pruned = []
    for artifact_id, _, _ in candidates:
        try:
            with transaction.atomic():
                artifact = selection().select_for_update().filter(pk=artifact_id).first()
                if artifact is None:
                    continue  # referenced or read meanwhile, or already removed
                artifact.delete()
        except (ProtectedError, IntegrityError):
            logger.info("artifact %s gained a reference while pruning; kept", artifact_id)
            continue
        if not artifact.composite:
            try:
                remove_unowned_file(sha256=artifact.sha256, storage_key=artifact.storage_key)
            except Exception:  # noqa: BLE001 - the row is gone; the sweep removes the file later
                logger.exception("artifact %s: could not delete its stored file", artifact_id)
        removed = PrunedArtifact(id=artifact_id, kind=artifact.kind, size_bytes=artifact.size_bytes)
        logger.info(
            "pruned artifact %s (%s, %d bytes)", removed.id, removed.kind, removed.size_bytes
        )
        pruned.append(removed)
    _log_pruned(pruned, dry_run=False)
    return pruned


def _log_pruned(pruned: list[PrunedArtifact], *, dry_run: bool) -> None:
    log_event(
        "artifacts_pruned",
        artifacts=len(pruned),
        size_bytes=sum(artifact.size_bytes for artifact in pruned),
        dry_run=dry_run,
    )


def remove_unowned_file(*, sha256: str, storage_key: str) -> bool:
    """Delete the stored file of `sha256` unless an artifact row owns it; True when deleted.

    "No row owns it" must stay true until the file is gone, and a row that does not exist cannot
    be locked, so the address is held the way a writer holds it: by inserting its row, here a
    stand-in that is never committed. A writer whose row came first makes the insert wait for
    its commit and then fail, and the file is kept; a writer that comes later waits for the
    stand-in to be rolled back, finds the file missing and writes it again.
    """
    with transaction.atomic():
        try:
            with transaction.atomic():
                Artifact.objects.create(
                    id=artifact_id_for(sha256),
                    sha256=sha256,
                    storage_key=storage_key,
                    size_chars=0,
                    size_bytes=0,
                    size_lines=0,
                    kind=ArtifactKind.TEXT.value,
                )
        except IntegrityError:
            return False  # a row owns the file
        try:
            artifact_storage().delete(storage_key)
        finally:
            transaction.set_rollback(True)  # the stand-in only held the address
    return True


def remove_orphan_files(*, older_than: timedelta, dry_run: bool) -> list[OrphanFile]:
    """Remove stored files no artifact row owns, last modified more than `older_than` ago.

    Files of rolled-back writes, of writes that failed halfway, of crashes between a row's
    removal and its file's, and other names a storage backend chose for a save. The age keeps
    a file that a write in progress is still filling; each file that has a content address is
    removed under the hold writers take (`remove_unowned_file`), so one that text recorded
    meanwhile needs is kept. Lists the storage with `listdir` and asks the database once per
    shard directory.
    """
    storage = artifact_storage()
    cutoff = timezone.now() - older_than
    orphans: list[OrphanFile] = []
    for shard in _by_shard(stored_files()):
        owned = set(
            Artifact.objects.filter(
                sha256__in=[file.sha256 for file in shard if file.sha256 is not None]
            ).values_list("sha256", flat=True)
        )
        for file in shard:
            if file.sha256 in owned:
                continue
            try:
                if storage.get_modified_time(file.storage_key) >= cutoff:
                    continue
                size = storage.size(file.storage_key)
                if not dry_run and not _remove_orphan(file):
                    continue
            except FileNotFoundError:
                continue  # removed meanwhile
            except Exception:  # noqa: BLE001 - one file must not stop the sweep
                logger.exception("could not remove the orphan file %s", file.storage_key)
                continue
            orphans.append(OrphanFile(storage_key=file.storage_key, size_bytes=size))
    log_event(
        "orphan_files_removed",
        files=len(orphans),
        size_bytes=sum(orphan.size_bytes for orphan in orphans),
        dry_run=dry_run,
    )
    return orphans


def _by_shard(files: Iterator[StoredFile]) -> Iterator[list[StoredFile]]:
    shard: list[StoredFile] = []
    for file in files:
        if shard and shard[0].storage_key[:2] != file.storage_key[:2]:
            yield shard
            shard = []
        shard.append(file)
    if shard:
        yield shard


def _remove_orphan(file: StoredFile) -> bool:
    if file.sha256 is None:
        # No writer ever reads or writes another name again once its save has returned.
        artifact_storage().delete(file.storage_key)
        return True
    return remove_unowned_file(sha256=file.sha256, storage_key=file.storage_key)
