"""Storing a transcript that a dispatched prompt points to, and listing its history files.

The transcript and the index become the task's current ones; a transcript in parts is named
as composites of its sealed parts and its tail (`sealing.whole`), and a part sealed by this
dispatch is stored with it (its pieces, the list of its turn files, its row).

A turn file costs nothing to list when its turn already has an artifact (its text spilled, or a
prompt cut it): it is that artifact at a second path. Any other turn's whole text is its history
text, stored once and linked to the turn like a cut text, so the next dispatch lists it without
writing, access and retention follow the turn, and an executor never downloads an unchanged file
twice (it is content-addressed). A sealed part's turn files are listed in one JSON artifact
(`{"files": [...]}`, each entry an artifact and its workspace path, `turn_file_list`), so a
manifest names a part's files by one entry instead of one per turn. A task's turns are written
once over its life, not on every dispatch.

Storing a batch costs a fixed number of queries while the new rows fit one statement (see
`store_transcripts`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from django.db.models import Case, Value, When

from backend.artifacts.models import Artifact
from backend.artifacts.selectors import ManifestEntry
from backend.artifacts.services import (
    ArtifactText,
    atomic_storing_artifacts,
    store_artifacts,
    store_artifacts_and_composites,
)
from backend.prompting import BUILDER_VERSION
from backend.prompting.kinds import ArtifactKind, classify_text
from backend.prompting.turn_files import TURN_INDEX_PATH
from backend.tasks.history import any_of
from backend.tasks.models import Subtask, Task, TranscriptPart
from backend.tasks.transcripts.sealing import (
    index_piece,
    removed_parts,
    transcript_piece,
    whole,
    whole_composites,
)
from backend.tasks.transcripts.types import (
    HistoryFiles,
    Part,
    StoredPiece,
    Transcript,
    TurnFile,
    transcript_path,
)

_Item = TypeVar("_Item")

# A statement's parameters stay under SQLite's limit (32,766) and PostgreSQL's (65,535): texts
# are locked by id (one parameter each), and a turn is linked with three.
_TEXTS_PER_STATEMENT = 10_000
_LINKS_PER_STATEMENT = 5_000


def store_transcripts(
    transcripts: Mapping[int, Transcript],
    *,
    current: Mapping[int, tuple[str | None, str | None]] | None = None,
) -> dict[int, HistoryFiles]:
    """Store each task's transcript and turn index as its current ones, in one transaction:
    the tails (once per content), the parts this dispatch sealed (their pieces, the lists of
    their turn files and their rows), the turn files not stored yet (as their turns'
    artifacts) and, for a transcript in parts, the composites naming the whole; return each
    task's history files as its manifest lists them.

    Queries: a fixed number for the whole batch while the new rows fit one statement: one
    inserting the artifacts (the texts and, for transcripts in parts, the composites naming
    each whole), one locking those that existed already (none when every one is new), one for
    the part rows of new composites, one linking new turn files to their turns and one
    pointing the tasks to their transcripts; two more when a part is sealed (its list stored,
    and its row; three when its list existed already). Every row stays locked until the tasks,
    turns and parts point to it, so a concurrent prune waits and then sees the references.

    `current` gives, by task id, the (transcript, turn index) artifact ids the task points to
    as read (the claimed rows' task): a transcript in parts that is exactly the current one,
    stored whole already (no part to seal, every turn file stored and linked), is listed
    without a query. A turn's result that leaves its task waiting for a message stores it
    (`tasks.services.store_next_transcript`), so the next dispatch finds it so.
    """
    history_files: dict[int, HistoryFiles] = {}
    for task_id, transcript in transcripts.items():
        listed = _stored_already(task_id, transcript, (current or {}).get(task_id))
        if listed is not None:
            history_files[task_id] = listed
    batch = _Batch.of(
        {
            task_id: transcript
            for task_id, transcript in transcripts.items()
            if task_id not in history_files
        }
    )
    if not batch.transcripts:
        return history_files
    written = _write(batch)
    for number, (task_id, transcript) in enumerate(batch.transcripts.items()):
        history_files[task_id] = _history_files(task_id, transcript, written, number=number)
    return history_files


@dataclass(frozen=True)
class _Batch:
    """The transcripts a store writes and what in them is new, in the order of its texts: the
    tails, the indexes, the new parts' texts (transcript and index of each), the new turn
    files."""

    transcripts: Mapping[int, Transcript]
    new_parts: list[tuple[int, Part]]
    new_files: list[tuple[int, TurnFile]]
    tails: dict[int, StoredPiece]
    indexes: dict[int, StoredPiece]

    @classmethod
    def of(cls, transcripts: Mapping[int, Transcript]) -> _Batch:
        return cls(
            transcripts=transcripts,
            new_parts=[
                (task_id, part)
                for task_id, transcript in transcripts.items()
                for part in transcript.parts
                if part.new
            ],
            new_files=[
                (task_id, turn_file)
                for task_id, transcript in transcripts.items()
                for turn_file in (
                    *transcript.turn_files,
                    *(file for part in transcript.parts if part.new for file in part.files),
                )
                if turn_file.stored is None
            ],
            tails={
                task_id: transcript.piece or StoredPiece.of_text(transcript.text)
                for task_id, transcript in transcripts.items()
            },
            indexes={
                task_id: StoredPiece.of_text(transcript.index)
                for task_id, transcript in transcripts.items()
            },
        )

    def texts(self) -> list[ArtifactText]:
        return [
            *(
                ArtifactText(
                    text=transcript.text,
                    kind=ArtifactKind.TRANSCRIPT,
                    task_id=task_id,
                    known_address=self.tails[task_id].address,
                )
                for task_id, transcript in self.transcripts.items()
            ),
            *(
                ArtifactText(
                    text=transcript.index,
                    kind=ArtifactKind.TRANSCRIPT,
                    task_id=task_id,
                    known_address=self.indexes[task_id].address,
                )
                for task_id, transcript in self.transcripts.items()
            ),
            *(
                ArtifactText(text=text, kind=ArtifactKind.TRANSCRIPT, task_id=task_id)
                for task_id, part in self.new_parts
                for text in (part.transcript_text, part.index_text)
            ),
            *(
                ArtifactText(
                    text=turn_file.text, kind=classify_text(turn_file.text), task_id=task_id
                )
                for task_id, turn_file in self.new_files
            ),
        ]


@dataclass(frozen=True)
class _Written:
    """What `_write` stored: per transcript of the batch, in order, its tail and index; by
    task id, the wholes (transcript, index) of a transcript in parts; the entries of the new
    turn files by subtask id; the new parts' lists by (task id, part number)."""

    tails: list[Artifact]
    indexes: list[Artifact]
    wholes: dict[int, tuple[Artifact, Artifact]]
    file_entries: dict[int, ManifestEntry]
    lists: dict[tuple[int, int], StoredPiece]


def _write(batch: _Batch) -> _Written:
    """Store the batch in one transaction, its rows locked until the tasks point to them."""
    transcripts = batch.transcripts
    with atomic_storing_artifacts():
        removed = removed_parts(transcripts)
        if removed:
            TranscriptPart.objects.filter(any_of(removed)).delete()
        # The composites naming each whole go in with the last batch of texts: their newest
        # pieces are those texts, and their other pieces the sealed parts'.
        composites, in_parts = whole_composites(
            transcripts, tails=batch.tails, indexes=batch.indexes
        )
        artifacts: list[Artifact] = []
        batches = list(_batches(batch.texts(), size=_TEXTS_PER_STATEMENT))
        for some_texts in batches[:-1]:
            artifacts.extend(store_artifacts(some_texts))
        last, composite_rows = store_artifacts_and_composites(batches[-1], composites)
        artifacts.extend(last)
        wholes = {
            task_id: (composite_rows[transcript_at], composite_rows[index_at])
            for task_id, (transcript_at, index_at) in in_parts.items()
        }
        count = len(transcripts)
        tails, indexes = artifacts[:count], artifacts[count : 2 * count]
        stored_files = artifacts[2 * count + 2 * len(batch.new_parts) :]
        new_files = list(zip(batch.new_files, stored_files, strict=True))
        _link_turn_files(
            [(turn_file.subtask_id, artifact.pk) for (_, turn_file), artifact in new_files]
        )
        file_entries = {
            turn_file.subtask_id: ManifestEntry.of(artifact, workspace_path=turn_file.path)
            for (_, turn_file), artifact in new_files
        }
        lists = _store_new_parts(batch.new_parts, file_entries, transcripts)
        pointing = {
            task_id: wholes.get(task_id, (tail, index))
            for task_id, tail, index in zip(transcripts, tails, indexes, strict=True)
        }
        for task_id, transcript in transcripts.items():
            if pointing[task_id][0].pk != transcript.pointer.artifact_id:
                raise RuntimeError("content address mismatch")
        _point_tasks(pointing)
    return _Written(
        tails=tails, indexes=indexes, wholes=wholes, file_entries=file_entries, lists=lists
    )


def _history_files(
    task_id: int, transcript: Transcript, written: _Written, *, number: int
) -> HistoryFiles:
    """The history files of the batch's transcript `number` (of task `task_id`), stored."""
    tail, index = written.tails[number], written.indexes[number]
    files = [
        turn_file.stored or written.file_entries[turn_file.subtask_id]
        for turn_file in transcript.turn_files
    ]
    if task_id not in written.wholes:
        return HistoryFiles(
            transcript=None,
            files=[ManifestEntry.of(index, workspace_path=TURN_INDEX_PATH), *files],
        )
    return _in_parts(
        task_id,
        transcript,
        wholes=written.wholes[task_id],
        newest=(_piece(tail), _piece(index)),
        files=files,
        lists=[
            (part.turn_files or written.lists[(task_id, part.number)]) for part in transcript.parts
        ],
    )


def _in_parts(
    task_id: int,
    transcript: Transcript,
    *,
    wholes: tuple[Artifact, Artifact],
    newest: tuple[StoredPiece, StoredPiece],
    files: list[ManifestEntry],
    lists: list[StoredPiece],
) -> HistoryFiles:
    """The history files of a transcript in parts whose wholes (transcript, index) and newest
    pieces are stored."""
    parts = transcript.parts
    return HistoryFiles(
        transcript=_composite_entry(
            wholes[0],
            path=transcript_path(task_id),
            parts=[*(part.transcript for part in parts), newest[0]],
        ),
        files=[
            _composite_entry(
                wholes[1],
                path=TURN_INDEX_PATH,
                parts=[*(part.turn_index for part in parts), newest[1]],
            ),
            *files,
        ],
        lists=[listing.as_part() for listing in lists],
    )


def _stored_already(
    task_id: int, transcript: Transcript, current: tuple[str | None, str | None] | None
) -> HistoryFiles | None:
    """The history files of a transcript in parts that is its task's current one (`current`:
    the ids its task points to) and needs nothing stored: no part sealed now, none to remove,
    every turn file stored. None otherwise."""
    if (
        current is None
        or transcript.pointer.artifact_id != current[0]
        or not transcript.parts
        or transcript.piece is None
        or transcript.stale is not None
        or any(part.new or part.turn_files is None for part in transcript.parts)
        or any(turn_file.stored is None for turn_file in transcript.turn_files)
    ):
        return None
    index = StoredPiece.of_text(transcript.index)
    wholes = tuple(
        whole(transcript.parts, newest, task_id=task_id, piece=piece)[-1][1]
        for newest, piece in ((transcript.piece, transcript_piece), (index, index_piece))
    )
    if (wholes[0].pk, wholes[1].pk) != current:
        return None
    return _in_parts(
        task_id,
        transcript,
        wholes=(wholes[0], wholes[1]),
        newest=(transcript.piece, index),
        files=[turn_file.stored for turn_file in transcript.turn_files if turn_file.stored],
        lists=[part.turn_files for part in transcript.parts if part.turn_files],
    )


def _link_turn_files(links: Sequence[tuple[int, str]]) -> None:
    """Make each newly stored turn file (subtask id, artifact id) its turn's artifact (one
    statement per batch: the first dispatch of a long task links thousands)."""
    for batch in _batches(links, size=_LINKS_PER_STATEMENT):
        Subtask.objects.filter(
            id__in=[subtask_id for subtask_id, _ in batch], artifact_id__isnull=True
        ).update(artifact_id=_by_id(dict(batch)))


def _point_tasks(current: Mapping[int, tuple[Artifact, Artifact]]) -> None:
    """Make each task's (transcript, turn index) its current ones (one statement)."""
    Task.objects.filter(id__in=list(current)).update(
        transcript_id=_by_id({task_id: pair[0].pk for task_id, pair in current.items()}),
        turn_index_id=_by_id({task_id: pair[1].pk for task_id, pair in current.items()}),
    )


def _by_id(values: Mapping[int, str]) -> Case:
    """Each row's own value by its id, for an update of many rows to different values."""
    return Case(*(When(id=row_id, then=Value(value)) for row_id, value in values.items()))


def _store_new_parts(
    new_parts: Sequence[tuple[int, Part]],
    file_entries: Mapping[int, ManifestEntry],
    transcripts: Mapping[int, Transcript],
) -> dict[tuple[int, int], StoredPiece]:
    """Store the lists of the new parts' turn files and the parts' rows (two queries more
    when a part is new, three when one of its lists was stored before); the lists by (task
    id, part number)."""
    if not new_parts:
        return {}
    listings = store_artifacts(
        [
            ArtifactText(
                text=turn_file_list(
                    [
                        turn_file.stored or file_entries[turn_file.subtask_id]
                        for turn_file in part.files
                    ]
                ),
                kind=ArtifactKind.JSON,
                task_id=task_id,
            )
            for task_id, part in new_parts
        ]
    )
    TranscriptPart.objects.bulk_create(
        [
            TranscriptPart(
                task_id=task_id,
                span=part.span,
                number=part.number,
                first_message_id=part.first_message_id,
                last_message_id=part.last_message_id,
                message_runs=[list(run) for run in part.runs],
                turns=part.turns,
                users=part.users,
                assistants=part.assistants,
                pieces={
                    "transcript": part.transcript.as_list(),
                    "turn_index": part.turn_index.as_list(),
                    "turn_files": _piece(listing).as_list(),
                },
                is_group_chat=transcripts[task_id].is_group_chat,
                multi_bot=transcripts[task_id].multi_bot,
                builder_version=BUILDER_VERSION,
                transcript_id=part.transcript.id,
                turn_index_id=part.turn_index.id,
                turn_files_id=listing.pk,
            )
            for (task_id, part), listing in zip(new_parts, listings, strict=True)
        ],
        # A part sealed meanwhile by a concurrent dispatch of the same task is the same part.
        ignore_conflicts=True,
    )
    return {
        (task_id, part.number): _piece(listing)
        for (task_id, part), listing in zip(new_parts, listings, strict=True)
    }


def turn_file_list(entries: Sequence[ManifestEntry]) -> str:
    """The list of a sealed part's turn files, as an executor reads it: a JSON object whose
    `files` are manifest entries (an artifact and the workspace path it goes to)."""
    return (
        json.dumps(
            {
                "files": [
                    {
                        "id": entry.id,
                        "sha256": entry.sha256,
                        "kind": entry.kind,
                        "size_bytes": entry.size_bytes,
                        "size_chars": entry.size_chars,
                        "size_lines": entry.size_lines,
                        "path": entry.workspace_path,
                    }
                    for entry in entries
                ]
            },
            separators=(",", ":"),
        )
        + "\n"
    )


def _composite_entry(
    artifact: Artifact, *, path: str, parts: Sequence[StoredPiece]
) -> ManifestEntry:
    return ManifestEntry(
        id=artifact.id,
        sha256=artifact.sha256,
        kind=artifact.kind,
        size_bytes=artifact.size_bytes,
        size_chars=artifact.size_chars,
        size_lines=artifact.size_lines,
        workspace_path=path,
        parts=tuple(piece.as_part() for piece in parts),
    )


def _piece(artifact: Artifact) -> StoredPiece:
    return StoredPiece(
        id=artifact.id,
        sha256=artifact.sha256,
        size_bytes=artifact.size_bytes,
        size_chars=artifact.size_chars,
        size_lines=artifact.size_lines,
    )


def _batches(items: Sequence[_Item], *, size: int) -> Iterator[Sequence[_Item]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
