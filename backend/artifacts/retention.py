"""Retention: remember when artifacts are read, and prune the ones nothing refers to any more.

An artifact stays while any turn references it: prompts point at it and executors download it,
so removing it would break "nothing is lost" (DESIGN.md, principle 2). Once every referencing
turn is gone (its task deleted), the artifact is garbage, and `prune_artifacts` removes the row
and the stored file after it has been neither created nor read for the retention period.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.artifacts.storage import artifact_storage
from backend.tasks.models import Subtask

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrunedArtifact:
    """One artifact that was removed (or, in a dry run, would be)."""

    id: str
    kind: str
    size_bytes: int


def record_artifact_read(*, artifact_id: str) -> None:
    """Stamp `last_read_at` (one UPDATE, no read) so a recently read artifact is not pruned."""
    Artifact.objects.filter(pk=artifact_id).update(last_read_at=timezone.now())


def prunable_artifacts(*, older_than: timedelta) -> QuerySet[Artifact]:
    """Artifacts no turn references, created and last read more than `older_than` ago."""
    cutoff = timezone.now() - older_than
    return (
        Artifact.objects.filter(created_at__lt=cutoff)
        .filter(Q(last_read_at__isnull=True) | Q(last_read_at__lt=cutoff))
        .filter(~Exists(Subtask.objects.filter(artifact_id=OuterRef("pk"))))
        .order_by("created_at", "id")
    )


def prune_artifacts(*, older_than: timedelta, dry_run: bool) -> list[PrunedArtifact]:
    """Remove unreferenced artifacts older than `older_than`; return what was (or would be) removed.

    Each artifact is removed in its own transaction: its row is locked and the selection is
    checked again, so one that gained a reference (or a read) since the candidates were listed
    is kept; the foreign key from turns backs this up on commit. The stored file is deleted only
    after the row's deletion has committed: a crash in between leaves an orphan file, which is
    harmless (identical content recorded later reuses it), never a row without its file.
    """
    candidates = list(
        prunable_artifacts(older_than=older_than).values_list("id", "kind", "size_bytes")
    )
    if dry_run:
        return [
            PrunedArtifact(id=id_, kind=kind, size_bytes=size) for id_, kind, size in candidates
        ]

    storage = artifact_storage()
    pruned: list[PrunedArtifact] = []
    for artifact_id, _, _ in candidates:
        try:
            with transaction.atomic():
                artifact = (
                    prunable_artifacts(older_than=older_than)
                    .select_for_update()
                    .filter(pk=artifact_id)
                    .first()
                )
                if artifact is None:
                    continue  # referenced or read meanwhile, or already removed
                artifact.delete()
        except (ProtectedError, IntegrityError):
            logger.info("artifact %s gained a reference while pruning; kept", artifact_id)
            continue
        # Identical content may have been recorded again since the commit; its new row owns
        # the same file, so leave the file alone then.
        if not Artifact.objects.filter(pk=artifact_id).exists():
            try:
                storage.delete(artifact.storage_key)
            except Exception:
                # The row is gone; a file left behind is only wasted space.
                logger.exception("artifact %s: could not delete its stored file", artifact_id)
        removed = PrunedArtifact(id=artifact_id, kind=artifact.kind, size_bytes=artifact.size_bytes)
        logger.info(
            "pruned artifact %s (%s, %d bytes)", removed.id, removed.kind, removed.size_bytes
        )
        pruned.append(removed)
    return pruned
