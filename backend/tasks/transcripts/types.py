"""The plain data a transcript is made of, as it goes from reading to storing.

A `TranscriptRequest` asks for a task's transcript before a message; `reading` answers with a
`Transcript` (its tail's text and index, its `TurnFile`s, its sealed `Part`s, each artifact a
`StoredPiece`), `storing` stores it and answers with the `HistoryFiles` a manifest lists. These
are frozen values without I/O, so a sealed part read once can be kept (`sealing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backend.artifacts.selectors import ManifestEntry, ManifestPart
from backend.artifacts.storage import ContentAddress, content_address, storage_key_for
from backend.prompting.addressing import artifact_id_for, count_lines
from backend.prompting.inputs import ArtifactPointer
from backend.tasks import transcript_spans

Runs = tuple[tuple[int, int], ...]


def runs_of(message_ids: Sequence[int]) -> Runs:
    """Ascending ids as inclusive runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for message_id in message_ids:
        if runs and runs[-1][1] + 1 == message_id:
            runs[-1] = (runs[-1][0], message_id)
        else:
            runs.append((message_id, message_id))
    return tuple(runs)


def merge_runs(runs: Sequence[tuple[int, int]]) -> Runs:
    """Consecutive runs, with those that touch joined into one."""
    merged: list[tuple[int, int]] = []
    for first, last in runs:
        if merged and merged[-1][1] + 1 == first:
            merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return tuple(merged)


def transcript_path(task_id: int) -> str:
    """Where the executor finds the task's transcript in its workspace."""
    return f".baton/history/task-{task_id}.md"


@dataclass(frozen=True)
class TranscriptRequest:
    task_id: int
    is_group_chat: bool
    multi_bot: bool
    before_message_id: int


@dataclass(frozen=True)
class Stale:
    """A task's part rows to remove when its transcript is stored: long parts numbered from
    `long_from` on (None: none), and short parts numbered from `short_from` on or below
    `short_below`."""

    long_from: int | None = None
    short_from: int | None = None
    short_below: int = 0


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
class StoredPiece:
    """An artifact a transcript is made of, as a composite and a manifest need it."""

    id: str
    sha256: str
    size_bytes: int
    size_chars: int
    size_lines: int

    @classmethod
    def of_text(cls, text: str) -> StoredPiece:
        address = content_address(text)
        return cls(
            id=artifact_id_for(address.sha256),
            sha256=address.sha256,
            size_bytes=address.size_bytes,
            size_chars=len(text),
            size_lines=count_lines(text),
        )

    @property
    def address(self) -> ContentAddress:
        """Where its text is stored (`storage.content_address` of the text)."""
        return ContentAddress(
            sha256=self.sha256, storage_key=storage_key_for(self.sha256), size_bytes=self.size_bytes
        )

    def as_list(self) -> list[str | int]:
        return [self.id, self.sha256, self.size_bytes, self.size_chars, self.size_lines]

    def as_part(self) -> ManifestPart:
        return ManifestPart(id=self.id, sha256=self.sha256, size_bytes=self.size_bytes)

    @property
    def pk(self) -> str:
        """The id, as a composite reads a part's (`artifacts.services.Stored`)."""
        return self.id


@dataclass(frozen=True)
class Part:
    """A sealed part of a transcript: stored already (`new` False), or sealed by this dispatch
    (`new` True: its texts and turn files are stored with the transcript)."""

    span: int
    """Its turns' count when full: `TRANSCRIPT_PART_TURNS` or `TRANSCRIPT_SHORT_PART_TURNS`."""
    number: int
    """Its place among the parts of its span: it holds the history's turns `number * span`
    to `(number + 1) * span - 1`."""
    first_message_id: int
    last_message_id: int
    runs: Runs
    turns: int
    users: int
    assistants: int
    transcript: StoredPiece
    turn_index: StoredPiece
    turn_files: StoredPiece | None
    """The list of its turn files; None until a new part's files are stored."""
    new: bool = False
    transcript_text: str = ""
    index_text: str = ""
    files: tuple[TurnFile, ...] = ()


@dataclass(frozen=True)
class Transcript:
    text: str
    """The tail's text: the turns after the sealed parts, or every turn when there are none."""
    pointer: ArtifactPointer
    runs: Runs
    """The message ids it shows, oldest first, as inclusive runs (what a replay reads again)."""
    turns: int
    index: str
    """The tail's rows of the index of the turn files (`turn_files.render_turn_index`)."""
    turn_files: tuple[TurnFile, ...]
    """One per turn of the tail, in the same order."""
    parts: tuple[Part, ...] = ()
    """The sealed parts before the tail, in order (none for a short conversation)."""
    is_group_chat: bool = False
    multi_bot: bool = False
    stale: Stale | None = None
    """Part rows that were rendered otherwise, or that a long part covers, and are replaced or
    removed when stored."""
    piece: StoredPiece | None = None
    """The tail's piece, for a transcript in parts (hashed once, for the pointer)."""

    @property
    def message_ids(self) -> tuple[int, ...]:
        return tuple(
            message_id for first, last in self.runs for message_id in range(first, last + 1)
        )

    def snapshot(self) -> list[int] | dict[str, object]:
        """What a prompt report keeps to rebuild it (`transcript_for` reads it back): the
        message ids of a transcript rendered whole, or, for one in parts, their runs, its
        number of sealed parts and their size."""
        if not self.parts:
            return list(self.message_ids)
        long_span = transcript_spans.TRANSCRIPT_PART_TURNS
        short_span = transcript_spans.TRANSCRIPT_SHORT_PART_TURNS
        longs = sum(part.span == long_span for part in self.parts)
        shorts = len(self.parts) - longs
        return {
            "runs": [list(run) for run in self.runs],
            "parts": longs,
            "part_turns": long_span,
            **({"short_parts": shorts, "short_part_turns": short_span} if shorts else {}),
        }


@dataclass(frozen=True)
class HistoryFiles:
    """What a manifest lists for a transcript besides the prompt's own pointers."""

    transcript: ManifestEntry | None
    """The transcript when it is composite (listed with its parts); None when the prompt's
    pointer names a plain artifact, which the manifest lists like any other."""
    files: list[ManifestEntry]
    """The index, then one file per turn of the tail (of every turn, without sealed parts)."""
    lists: list[ManifestPart] = field(default_factory=list)
    """The sealed parts' lists of turn files."""
