"""Retention mechanics: remember when artifacts are read, and remove artifacts safely.

Which artifacts may go is decided by whoever references them (the turns:
`backend.tasks.artifact_retention`); this module only offers the age filter and the removal of a
selection's rows and stored files, and knows nothing of tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.artifacts.storage import artifact_storage

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
    this up on commit. The stored file is deleted only after the row's deletion has committed:
    a crash in between leaves an orphan file, which is harmless (identical content recorded
    later reuses it), never a row without its file.
    """
    candidates = list(selection().values_list("id", "kind", "size_bytes"))
    if dry_run:
        return [
            PrunedArtifact(id=id_, kind=kind, size_bytes=size) for id_, kind, size in candidates
        ]

    storage = artifact_storage()
    pruned: list[PrunedArtifact] = []
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
