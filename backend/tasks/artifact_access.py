"""Who may read an artifact: access follows the tasks whose turns produced or reference it.

A caller may read an artifact when they may see (`selectors.visible_tasks`) the task that first
produced it or a task with a turn that references it; an executor worker, while it holds a
claim on a task's turn, reads the artifacts that task's turns reference (a spilled or cut text,
a turn file) and the task's transcript and turn index, and no longer once the claim ends; an
operator with the artifacts' view permission reads them all, as the admin shows them
(`backend.model_permissions`), and one with the tasks' view permission those of every task.

A task's transcript and turn index may be composite artifacts (`artifacts.models.ArtifactPart`):
an executor fetches their parts one by one and assembles the file. So whoever may read a task's
history files (the task's viewers, and the worker holding its turn) may also read each part of
its current transcript or turn index, and the three artifacts of each of its sealed transcript
parts (`TranscriptPart`: its piece of the transcript, its rows of the index, the list of its
turn files), which the composites are made of.

The rule lives with the turns because only they know who refers to what; the artifacts package
stores content and knows nothing of tasks (dependencies point from tasks to artifacts).
"""

from __future__ import annotations

import copy

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef, Q

from backend.artifacts.models import Artifact, ArtifactPart
from backend.errors import NotFound
from backend.model_permissions import VIEW, operator_may
from backend.tasks.models import Subtask, SubtaskStatus, Task, TranscriptPart
from backend.tasks.selectors import visible_tasks


def visible_artifact(*, user: User, artifact_id: str) -> Artifact:
    """The artifact, or NotFound when it does not exist or the user may not see it (one query).

    An operator with the artifacts' view permission sees every artifact, including orphans
    whose turns are gone and that wait for `prune_artifacts`; anyone else needs a visible task
    that produced or references it (see the module docstring for what a task references).
    """
    artifacts = Artifact.objects.filter(pk=artifact_id)
    if not operator_may(user, VIEW, Artifact):
        tasks = visible_tasks(user=user)
        # An executor worker reads the artifacts of the tasks whose turns it holds right now.
        claimed = Task.objects.filter(
            subtasks__claimed_by=user, subtasks__status=SubtaskStatus.RUNNING
        )
        readable = Task.objects.filter(Q(pk__in=tasks) | Q(pk__in=claimed))
        referenced = Subtask.objects.filter(artifact_id=OuterRef("pk")).filter(
            Q(task__in=tasks) | Q(task__in=claimed)
        )
        # A task's current transcript and turn index are the task's own files.
        history_of = readable.filter(
            Q(transcript_id=OuterRef("pk")) | Q(turn_index_id=OuterRef("pk"))
        )
        # So are the parts an executor assembles them from.
        part_of_history = ArtifactPart.objects.filter(part_id=OuterRef("pk")).filter(
            Q(composite_id__in=readable.values("transcript_id"))
            | Q(composite_id__in=readable.values("turn_index_id"))
        )
        sealed_part = TranscriptPart.objects.filter(task__in=readable).filter(
            Q(transcript_id=OuterRef("pk"))
            | Q(turn_index_id=OuterRef("pk"))
            | Q(turn_files_id=OuterRef("pk"))
        )
        artifacts = artifacts.filter(
            Q(task__in=tasks)
            | Exists(referenced)
            | Exists(history_of)
            | Exists(part_of_history)
            | Exists(sealed_part)
        )
    artifact = artifacts.first()
    if artifact is None:
        raise NotFound(f"Artifact {artifact_id} does not exist.")
    return artifact


def artifact_as_seen_by(*, user: User, artifact: Artifact) -> Artifact:
    """The artifact's metadata as `user`'s own tasks justify it (an unsaved copy of the row).

    Identical texts share one artifact, so its row says who produced it first and when it was
    last read by anyone. A caller who may see the producing task (or every artifact) gets the
    row as it is; anyone else learns nothing about other owners: the task is the caller's own
    earliest task that references the text, created_at is when that task's turn recorded it, and
    last_read_at is not shown (one query).
    """
    if operator_may(user, VIEW, Artifact) or (
        artifact.task_id is not None
        and visible_tasks(user=user).filter(pk=artifact.task_id).exists()
    ):
        return artifact
    own = (
        Subtask.objects.filter(artifact_id=artifact.pk, task__in=visible_tasks(user=user))
        .order_by("created_at", "id")
        .values_list("task_id", "created_at")
        .first()
    )
    seen = copy.copy(artifact)
    seen.task_id, seen.last_read_at = (own[0] if own else None), None
    if own is not None:
        seen.created_at = own[1]
    return seen
