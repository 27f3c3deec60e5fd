"""Transcripts: the whole conversation before a turn, for the omission notice to point to.

A prompt whose history leaves messages out points, in its notice, to the task's transcript in
the executor's workspace (`.baton/history/task-<id>.md`, rendered by
`backend.prompting.transcript`). This module reads the turns it is made of, and stores it as the
task's transcript artifact when a prompt that points to it is dispatched. Reading every earlier
turn costs one query over bounded fields (history texts and previews, never whole results), and
only for prompts that omit something; a batch of dispatched turns shares one query to read them
and three to store them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from django.db.models import Case, Q, QuerySet, Value, When

from backend.artifacts.services import ArtifactText, atomic_storing_artifacts, store_artifacts
from backend.prompting.addressing import workspace_path
from backend.prompting.inputs import ArtifactPointer, HistoryMessage, Role
from backend.prompting.transcript import render_transcript, transcript_pointer
from backend.prompting.truncate import layout_fields
from backend.tasks.history import HISTORY_STATUSES, any_of
from backend.tasks.models import TURNS, Subtask, SubtaskStatus, Task


@dataclass(frozen=True)
class Transcript:
    text: str
    pointer: ArtifactPointer
    message_ids: tuple[int, ...]
    """The turns it shows, oldest first (what a replay reads again)."""


def transcript_path(task_id: int) -> str:
    """Where the executor finds the task's transcript in its workspace."""
    return f".baton/history/task-{task_id}.md"


@dataclass(frozen=True)
class TranscriptRequest:
    task_id: int
    is_group_chat: bool
    multi_bot: bool
    before_message_id: int


def transcripts_for(requests: Sequence[TranscriptRequest]) -> dict[int, Transcript]:
    """The transcripts of several tasks, by task id: each the task's COMPLETED and FAILED turns
    before its request's message. One query for the whole batch (none for an empty one)."""
    if not requests:
        return {}
    condition = any_of(
        [
            Q(task_id=request.task_id, message_id__lt=request.before_message_id)
            for request in requests
        ]
    )
    rows: dict[int, list[HistoryMessage]] = {}
    turns = Subtask.objects.filter(condition, TURNS, status__in=HISTORY_STATUSES)
    for task_id, message in _messages(turns.order_by("task_id", "message_id")):
        rows.setdefault(task_id, []).append(message)
    return {
        request.task_id: _transcript(request.task_id, rows[request.task_id], request)
        for request in requests
        if rows.get(request.task_id)
    }


def transcript_for(
    *, task_id: int, is_group_chat: bool, multi_bot: bool, message_ids: Sequence[int]
) -> Transcript | None:
    """The transcript of exactly the turns `message_ids` (what a replay reads again)."""
    turns = Subtask.objects.filter(task_id=task_id, message_id__in=list(message_ids))
    rows = [message for _, message in _messages(turns.order_by("message_id"))]
    if not rows:
        return None
    request = TranscriptRequest(task_id, is_group_chat, multi_bot, before_message_id=0)
    return _transcript(task_id, rows, request)


_COLUMNS = (
    "task_id",
    "message_id",
    "role",
    "status",
    "sender",
    "bot",
    "history_text",
    "history_is_preview",
    "preview_head",
    "preview_tail",
    "preview_layout",
    "history_chars",
    "artifact_id",
    "artifact__kind",
    "artifact__size_chars",
    "artifact__size_lines",
)


def _messages(turns: QuerySet[Subtask]) -> Iterator[tuple[int, HistoryMessage]]:
    """(task id, message) for each turn, read as plain values: a transcript reads every earlier
    turn, so no model instances. The rows were validated as `history_message`s when they were
    recorded and each prompt that includes them validates them again; here they are only
    rendered, so they are constructed without a second validation."""
    for row in turns.values_list(*_COLUMNS):
        (task_id, message_id, role, status, sender, bot, text, spilled, head, tail) = row[:10]
        layout, chars, artifact_id, kind, size_chars, size_lines = row[10:]
        parts = layout_fields(layout) if spilled else {}
        pointer = (
            ArtifactPointer.model_construct(
                artifact_id=artifact_id,
                kind=kind,
                total_chars=size_chars,
                total_lines=size_lines,
                workspace_path=workspace_path(artifact_id),
            )
            if artifact_id is not None
            else None
        )
        yield (
            task_id,
            HistoryMessage.model_construct(
                message_id=message_id,
                role=Role(role),
                text=text,
                sender=(sender or None) if role == Role.USER else None,
                bot=(bot or None) if role == Role.ASSISTANT else None,
                failed=status == SubtaskStatus.FAILED,
                error=None,
                token_count=None,
                total_chars=chars,
                preview_head=head if spilled else None,
                preview_tail=tail if spilled else None,
                **{f"preview_{name}": value for name, value in parts.items()},
                artifact=pointer,
            ),
        )


def _transcript(task_id: int, rows: list[HistoryMessage], request: TranscriptRequest) -> Transcript:
    text = render_transcript(rows, is_group_chat=request.is_group_chat, multi_bot=request.multi_bot)
    return Transcript(
        text=text,
        pointer=transcript_pointer(text, workspace_path=transcript_path(task_id)),
        message_ids=tuple(turn.message_id for turn in rows),
    )


def store_transcripts(transcripts: Mapping[int, Transcript]) -> None:
    """Store each task's transcript (once per content) as its current one, in one transaction:
    three queries for the whole batch, whatever its size. The transcripts' rows stay locked
    until the tasks point to them, so a concurrent prune waits and then sees the references."""
    if not transcripts:
        return
    with atomic_storing_artifacts():
        artifacts = store_artifacts(
            [
                ArtifactText(text=transcript.text, kind=transcript.pointer.kind, task_id=task_id)
                for task_id, transcript in transcripts.items()
            ]
        )
        for artifact, transcript in zip(artifacts, transcripts.values(), strict=True):
            if artifact.pk != transcript.pointer.artifact_id:
                raise RuntimeError("content address mismatch")
        Task.objects.filter(pk__in=list(transcripts)).update(
            transcript_id=Case(
                *[
                    When(pk=task_id, then=Value(transcript.pointer.artifact_id))
                    for task_id, transcript in transcripts.items()
                ]
            )
        )
