"""Storing the whole texts a prompt points to by content address, before the prompt is sent.

The prompt core points every cut to the whole text (docs/architecture.md, principle 2). A text
that spilled at ingestion already is an artifact; a shorter one that a prompt cut anyway (by
`per_message_max_chars`, `current_message_max_chars`, `previous_result_max_chars` or the token
budget) is addressed by its content (`backend.prompting.addressing`), and this module makes that
address true: it stores the text and links it to its turn, so the artifact is in the dispatch
manifest, readable by the executor that holds the task's turn, and kept by retention while the
turn exists. Idempotent and safe under concurrency: the same text is one artifact.
"""

from __future__ import annotations

from collections.abc import Iterable

from backend.artifacts.models import Artifact
from backend.artifacts.services import atomic_storing_artifacts, store_artifact
from backend.prompting.addressing import WholeText
from backend.tasks.models import Subtask


def store_whole_texts(*, task_id: int, whole_texts: Iterable[WholeText]) -> None:
    """Store each text of `task_id`'s turns not stored yet, and link it to its turn.

    An artifact already stored is locked before its turns point to it, so a concurrent prune
    waits and then sees the references; one pruned meanwhile is stored again.
    """
    pending: dict[str, list[WholeText]] = {}
    for whole in whole_texts:
        pending.setdefault(whole.pointer.artifact_id, []).append(whole)
    for artifact_id, wholes in pending.items():
        with atomic_storing_artifacts():
            if not Artifact.objects.select_for_update().filter(pk=artifact_id).exists():
                first = wholes[0]
                artifact = store_artifact(text=first.text, kind=first.pointer.kind, task_id=task_id)
                if artifact.pk != artifact_id:  # the core and storage disagree on the address
                    raise RuntimeError("content address mismatch")
            # Every turn with this text points to it; a turn keeps the artifact it has (a
            # spilled turn's is its own whole text).
            Subtask.objects.filter(
                task_id=task_id,
                message_id__in=[whole.message_id for whole in wholes],
                artifact__isnull=True,
            ).update(artifact_id=artifact_id)
