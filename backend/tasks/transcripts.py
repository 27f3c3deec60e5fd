"""Transcripts: the whole conversation before a turn, for the omission notice to point to.

A prompt whose history leaves messages out points, in its notice, to the task's transcript in
the executor's workspace (`.baton/history/task-<id>.md`, rendered by
`backend.prompting.transcript`), and names the same conversation split into history files
(`backend.prompting.turn_files`): each earlier turn's whole text at
`.baton/history/turns/<message_id>.md`, and their index. This module reads the turns they are
made of, and stores them when a prompt that points to them is dispatched: the transcript and the
index as the task's current ones, each turn file as the turn's artifact.

A turn file costs nothing to list when its turn already has an artifact (its text spilled, or a
prompt cut it): it is that artifact at a second path. Any other turn's whole text is its history
text, stored once and linked to the turn like a cut text, so the next dispatch lists it without
writing, access and retention follow the turn, and an executor never downloads an unchanged file
twice (it is content-addressed). A task's turns are written once over its life, not on every
dispatch.

Reading every earlier turn costs one query over bounded fields (history texts and previews,
never whole results), and only for prompts that omit something. A batch of dispatched turns
shares that query, and storing costs a fixed number more for the whole batch while the new rows
fit one statement (thousands of turns; on SQLite an INSERT takes about a hundred rows, so a
long history's first dispatch there takes a few statements more, once).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from django.db.models import Case, Q, QuerySet, Value, When

from backend.artifacts.models import Artifact
from backend.artifacts.selectors import ManifestEntry
from backend.artifacts.services import ArtifactText, atomic_storing_artifacts, store_artifacts
from backend.prompting.addressing import workspace_path
from backend.prompting.inputs import ArtifactPointer, HistoryMessage, Role
from backend.prompting.kinds import ArtifactKind, classify_text
from backend.prompting.transcript import render_transcript, transcript_pointer
from backend.prompting.truncate import layout_fields
from backend.prompting.turn_files import TURN_INDEX_PATH, render_turn_index, turn_file_path
from backend.tasks.history import HISTORY_STATUSES, any_of
from backend.tasks.models import TURNS, Subtask, SubtaskStatus, Task

_Item = TypeVar("_Item")

# A statement's parameters stay under SQLite's limit (32,766) and PostgreSQL's (65,535): texts
# are locked by id (one parameter each), and a turn is linked with three.
_TEXTS_PER_STATEMENT = 10_000
_LINKS_PER_STATEMENT = 5_000


@dataclass(frozen=True)
class TurnFile:
    """An earlier turn's whole text at its own workspace path (`turn_files.turn_file_path`):
    the turn's artifact when it has one (`stored`), else its history text (`text`), which
    `store_transcripts` stores and links to the turn."""

    subtask_id: int
    path: str
    stored: ManifestEntry | None
    text: str = ""


@dataclass(frozen=True)
class Transcript:
    text: str
    pointer: ArtifactPointer
    message_ids: tuple[int, ...]
    """The turns it shows, oldest first (what a replay reads again)."""
    index: str
    """The index of the turn files (`turn_files.render_turn_index`)."""
    turn_files: tuple[TurnFile, ...]
    """One per turn it shows, in the same order."""


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
    rows: dict[int, list[tuple[HistoryMessage, TurnFile]]] = {}
    turns = Subtask.objects.filter(condition, TURNS, status__in=HISTORY_STATUSES)
    for task_id, message, turn_file in _turns(turns.order_by("task_id", "message_id")):
        rows.setdefault(task_id, []).append((message, turn_file))
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
    rows = [(message, turn_file) for _, message, turn_file in _turns(turns.order_by("message_id"))]
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
    "id",
    "artifact__sha256",
    "artifact__size_bytes",
)


def _turns(turns: QuerySet[Subtask]) -> Iterator[tuple[int, HistoryMessage, TurnFile]]:
    """(task id, message, turn file) for each turn, read as plain values: a transcript reads
    every earlier turn, so no model instances. The rows were validated as `history_message`s
    when they were recorded and each prompt that includes them validates them again; here
    they are only rendered, so they are constructed without a second validation."""
    for row in turns.values_list(*_COLUMNS):
        (task_id, message_id, role, status, sender, bot, text, spilled, head, tail) = row[:10]
        layout, chars, artifact_id, kind, size_chars, size_lines = row[10:16]
        subtask_id, sha256, size_bytes = row[16:]
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
        path = turn_file_path(message_id)
        turn_file = (
            TurnFile(
                subtask_id,
                path,
                ManifestEntry(artifact_id, sha256, kind, size_bytes, size_chars, size_lines, path),
            )
            if artifact_id is not None
            else TurnFile(subtask_id, path, None, text)
        )
        message = HistoryMessage.model_construct(
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
        )
        yield task_id, message, turn_file


def _transcript(
    task_id: int, rows: list[tuple[HistoryMessage, TurnFile]], request: TranscriptRequest
) -> Transcript:
    messages = [message for message, _ in rows]
    text = render_transcript(
        messages, is_group_chat=request.is_group_chat, multi_bot=request.multi_bot
    )
    return Transcript(
        text=text,
        pointer=transcript_pointer(text, workspace_path=transcript_path(task_id)),
        message_ids=tuple(message.message_id for message in messages),
        index=render_turn_index(messages),
        turn_files=tuple(turn_file for _, turn_file in rows),
    )


def store_transcripts(transcripts: Mapping[int, Transcript]) -> dict[int, list[ManifestEntry]]:
    """Store each task's transcript and turn index (once per content) as its current ones, and
    the turn files not stored yet as their turns' artifacts, in one transaction; return each
    task's history files besides the transcript, as its manifest lists them: the index, then
    one file per turn, oldest first.

    Queries: a fixed number for the whole batch (three, and a fourth when a turn file is new)
    while the new rows fit one statement (see the module docstring). Every row stays locked
    until the tasks and turns point to it, so a concurrent prune waits and then sees the
    references.
    """
    if not transcripts:
        return {}
    new_files = [
        (task_id, turn_file)
        for task_id, transcript in transcripts.items()
        for turn_file in transcript.turn_files
        if turn_file.stored is None
    ]
    texts = [
        *(
            ArtifactText(text=transcript.text, kind=ArtifactKind.TRANSCRIPT, task_id=task_id)
            for task_id, transcript in transcripts.items()
        ),
        *(
            ArtifactText(text=transcript.index, kind=ArtifactKind.TRANSCRIPT, task_id=task_id)
            for task_id, transcript in transcripts.items()
        ),
        *(
            ArtifactText(text=turn_file.text, kind=classify_text(turn_file.text), task_id=task_id)
            for task_id, turn_file in new_files
        ),
    ]
    with atomic_storing_artifacts():
        artifacts: list[Artifact] = []
        for some_texts in _batches(texts, size=_TEXTS_PER_STATEMENT):
            artifacts.extend(store_artifacts(some_texts))
        count = len(transcripts)
        stored_transcripts, indexes = artifacts[:count], artifacts[count : 2 * count]
        for artifact, transcript in zip(stored_transcripts, transcripts.values(), strict=True):
            if artifact.pk != transcript.pointer.artifact_id:
                raise RuntimeError("content address mismatch")
        Task.objects.filter(pk__in=list(transcripts)).update(
            transcript_id=_by_task(transcripts, stored_transcripts),
            turn_index_id=_by_task(transcripts, indexes),
        )
        links = [
            (turn_file.subtask_id, artifact.pk)
            for (_, turn_file), artifact in zip(new_files, artifacts[2 * count :], strict=True)
        ]
        for batch in _batches(links, size=_LINKS_PER_STATEMENT):
            Subtask.objects.filter(
                pk__in=[subtask_id for subtask_id, _ in batch], artifact__isnull=True
            ).update(
                artifact_id=Case(
                    *[
                        When(pk=subtask_id, then=Value(artifact_id))
                        for subtask_id, artifact_id in batch
                    ]
                )
            )
    new_entries = {
        turn_file.subtask_id: ManifestEntry.of(artifact, workspace_path=turn_file.path)
        for (_, turn_file), artifact in zip(new_files, artifacts[2 * count :], strict=True)
    }
    return {
        task_id: [
            ManifestEntry.of(index, workspace_path=TURN_INDEX_PATH),
            *(
                turn_file.stored or new_entries[turn_file.subtask_id]
                for turn_file in transcript.turn_files
            ),
        ]
        for (task_id, transcript), index in zip(transcripts.items(), indexes, strict=True)
    }


def _by_task(transcripts: Mapping[int, Transcript], artifacts: list[Artifact]) -> Case:
    return Case(
        *[
            When(pk=task_id, then=Value(artifact.pk))
            for task_id, artifact in zip(transcripts, artifacts, strict=True)
        ]
    )


def _batches(items: Sequence[_Item], *, size: int) -> Iterator[Sequence[_Item]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
