"""Which artifacts are garbage: the ones nothing references — no turn, no task (as its
transcript or turn index), no sealed transcript part, no composite artifact (as a part).

An artifact stays while any turn references it: prompts point at it and executors download it, so
removing it would break "nothing is lost" (docs/architecture.md, principle 2). Once every
referencing turn is gone (its task deleted), the artifact is garbage, and `prune_artifacts` removes
the row and the stored file after it has been neither created nor read for the retention period.
A task references only its latest transcript and turn index: earlier ones go the same way. A
turn file is its turn's artifact, so it stays while its turn does.

A sealed transcript part (`TranscriptPart`) keeps its three artifacts while its task lives. A
composite artifact keeps its parts while it exists, and is itself pruned by the rules above (a
task's former transcript is garbage like any other). Its part rows go with it, so its parts,
unless something else keeps them, are pruned on a later run: a run only removes what was
unreferenced when it started listing.

Only the turns know what references an artifact, so the selection lives here; removing rows
and files safely is storage work (`backend.artifacts.retention.remove_artifacts`).
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Exists, OuterRef, QuerySet

from backend.artifacts.models import Artifact, ArtifactPart
from backend.artifacts.retention import PrunedArtifact, remove_artifacts, stale_artifacts
from backend.tasks.models import Subtask, Task, TranscriptPart


def prunable_artifacts(*, older_than: timedelta) -> QuerySet[Artifact]:
    """Artifacts nothing references, created and last read more than `older_than` ago."""
    # One subquery per referencing column, so each is answered from that column's index.
    references = [
        Subtask.objects.filter(artifact_id=OuterRef("pk")),
        Task.objects.filter(transcript_id=OuterRef("pk")),
        Task.objects.filter(turn_index_id=OuterRef("pk")),
        TranscriptPart.objects.filter(transcript_id=OuterRef("pk")),
        TranscriptPart.objects.filter(turn_index_id=OuterRef("pk")),
        TranscriptPart.objects.filter(turn_files_id=OuterRef("pk")),
        ArtifactPart.objects.filter(part_id=OuterRef("pk")),
    ]
    return (
        stale_artifacts(older_than=older_than)
        .filter(*[~Exists(referencing) for referencing in references])
        .order_by("created_at", "id")
    )


def prune_artifacts(*, older_than: timedelta, dry_run: bool) -> list[PrunedArtifact]:
    """Remove unreferenced artifacts older than `older_than`; return what was (or would be) removed.

    Each artifact is checked against the selection again under its row lock before it goes
    (see `remove_artifacts`), so one that gained a reference meanwhile is kept.
    """
    return remove_artifacts(
        selection=lambda: prunable_artifacts(older_than=older_than), dry_run=dry_run
    )
