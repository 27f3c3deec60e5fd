"""Storing text as an artifact: the content once, by its sha256, and the row that names it.

This is storage only. Whether a text is long enough to spill, and what a turn keeps of it
instead, is ingestion's decision (`backend.tasks.ingestion`); this module never looks at turns.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from backend.artifacts.models import Artifact
from backend.artifacts.storage import ArtifactIntegrityError, store_text
from backend.prompting.addressing import artifact_id_for, count_lines


def store_artifact(*, text: str, kind: str, task_id: int | None) -> Artifact:
    """Store `text` under its content address and return its artifact, created on first sight.

    The text must be valid Unicode (see `storage.store_text`). The task `task_id` is recorded as
    the producer only when the artifact is new: identical text stored later shares the first row.
    Concurrency-safe; must run inside the caller's transaction.
    """
    stored = store_text(text)
    artifact_id = artifact_id_for(stored.sha256)
    # Locking the row makes a concurrent prune wait for this transaction, after which it sees
    # the caller's new reference and keeps the artifact.
    existing = Artifact.objects.select_for_update().filter(pk=artifact_id).first()
    if existing is None:
        try:
            with transaction.atomic():
                return Artifact.objects.create(
                    id=artifact_id,
                    sha256=stored.sha256,
                    storage_key=stored.storage_key,
                    size_chars=len(text),
                    size_bytes=stored.size_bytes,
                    size_lines=count_lines(text),
                    kind=kind,
                    task_id=task_id,
                )
        except IntegrityError:
            existing = Artifact.objects.get(pk=artifact_id)  # a concurrent writer won
    if existing.sha256 != stored.sha256:
        raise ArtifactIntegrityError(
            f"artifact id {artifact_id} already names different content (sha256 prefix clash)"
        )
    return existing
