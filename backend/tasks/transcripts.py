"""Transcripts: the whole conversation before a turn, for the omission notice to point to.

A prompt whose history leaves messages out points, in its notice, to the task's transcript in
the executor's workspace (`.baton/history/task-<id>.md`, rendered by
`backend.prompting.transcript`), and names the same conversation split into history files
(`backend.prompting.turn_files`): each earlier turn's whole text at
`.baton/history/turns/<message_id>.md`, and their index. This module reads the turns they are
made of, and stores them when a prompt that points to them is dispatched: the transcript and the
index as the task's current ones, each turn file as the turn's artifact.

**Sealed parts.** A long conversation is not rendered again on every dispatch. Its earlier
turns are cut into consecutive long parts of `TRANSCRIPT_PART_TURNS` turns in history, and the
turns after the last long part into short parts of `TRANSCRIPT_SHORT_PART_TURNS`, fewer than a
long part holds (the turns that would fill its last short part seal the long part instead, and
its short parts go); a part is *sealed* (a `TranscriptPart` row) once every turn in its range
of message ids has finished and at least one turn in history follows it. Finished turns never
change, so a sealed part never does: its piece of the transcript, its rows of the index and the
list of its turn files are stored once. A dispatch then reads the part rows and only the turns
after the last sealed part (about a short part's worth), renders and stores those (the
*tail*), and names the whole as composite artifacts
(`backend.artifacts.services.store_artifacts_and_composites`): the transcript is the
composite of [the sealed parts' composite, the tail], and so is the index. Rendered in parts,
the transcript always opens with the escape note (a later part may need it); it is otherwise
byte for byte the transcript of the same turns rendered whole, and the index is exactly the
index. A conversation too short to seal a part is rendered whole, as one artifact.

A turn file costs nothing to list when its turn already has an artifact (its text spilled, or a
prompt cut it): it is that artifact at a second path. Any other turn's whole text is its history
text, stored once and linked to the turn like a cut text, so the next dispatch lists it without
writing, access and retention follow the turn, and an executor never downloads an unchanged file
twice (it is content-addressed). A sealed part's turn files are listed in one JSON artifact
(`{"files": [...]}`, each entry an artifact and its workspace path), so a manifest names a
part's files by one entry instead of one per turn. A task's turns are written once over its
life, not on every dispatch.

Queries, for a batch of dispatched turns: one for the part rows, one for the turns after them
(a second, rarely, when a turn dispatched late stops before its task's last sealed part, or
when a long part is sealed from its turns), and a fixed number to store (see
`store_transcripts`) while the new rows fit one statement.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Q

from backend import sql
from backend.artifacts.models import Artifact
from backend.artifacts.selectors import ManifestEntry, ManifestPart
from backend.artifacts.services import (
    ArtifactText,
    Stored,
    atomic_storing_artifacts,
    composite_row,
    store_artifacts,
    store_artifacts_and_composites,
)
from backend.artifacts.storage import ContentAddress, content_address, storage_key_for
from backend.prompting import BUILDER_VERSION
from backend.prompting.addressing import artifact_id_for, count_lines, workspace_path
from backend.prompting.inputs import ArtifactPointer, HistoryMessage, Role
from backend.prompting.kinds import ArtifactKind, classify_text
from backend.prompting.transcript import (
    render_transcript,
    render_transcript_part,
    render_transcript_tail,
    transcript_pointer,
)
from backend.prompting.truncate import layout_fields
from backend.prompting.turn_files import TURN_INDEX_PATH, render_turn_index, turn_file_path
from backend.tasks.history import HISTORY_STATUSES, any_of
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    Task,
    TranscriptPart,
)

_Item = TypeVar("_Item")

# Turns in history per long sealed part: a manifest lists three entries per sealed part.
TRANSCRIPT_PART_TURNS = 128
# Turns per short sealed part: the turns after the last long part are sealed in short parts
# until enough for a long one have finished, so a dispatch renders at most about this many
# turns again (the turns after the last sealed part) and a manifest lists at most
# TRANSCRIPT_PART_TURNS / TRANSCRIPT_SHORT_PART_TURNS - 1 short parts. Short parts are not
# used when they would not be shorter, or do not divide a long part.
TRANSCRIPT_SHORT_PART_TURNS = 16

# Sealed parts a server process keeps built, by their rows' columns (about 1 KiB each).
_SEALED_PARTS_KEPT = 20_000

# A statement's parameters stay under SQLite's limit (32,766) and PostgreSQL's (65,535): texts
# are locked by id (one parameter each), and a turn is linked with three.
_TEXTS_PER_STATEMENT = 10_000
_LINKS_PER_STATEMENT = 5_000

Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Stale:
    """A task's part rows to remove when its transcript is stored: long parts numbered from
    `long_from` on (None: none), and short parts numbered from `short_from` on or below
    `short_below`."""

    long_from: int | None = None
    short_from: int | None = None
    short_below: int = 0


def _shorts_per_long() -> int:
    """How many short parts a long part's turns make; 0 when short parts are not used."""
    long, short = TRANSCRIPT_PART_TURNS, TRANSCRIPT_SHORT_PART_TURNS
    return long // short if short < long and long % short == 0 else 0


def may_be_in_parts(*, turns: int) -> bool:
    """Whether a transcript of this many turns may have a sealed part: one more turn than the
    shortest part holds (a turn in history follows every sealed part)."""
    spans = [TRANSCRIPT_PART_TURNS]
    if _shorts_per_long():
        spans.append(TRANSCRIPT_SHORT_PART_TURNS)
    return turns > min(spans)


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
        longs = sum(part.span == TRANSCRIPT_PART_TURNS for part in self.parts)
        shorts = len(self.parts) - longs
        return {
            "runs": [list(run) for run in self.runs],
            "parts": longs,
            "part_turns": TRANSCRIPT_PART_TURNS,
            **(
                {"short_parts": shorts, "short_part_turns": TRANSCRIPT_SHORT_PART_TURNS}
                if shorts
                else {}
            ),
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


def transcript_path(task_id: int) -> str:
    """Where the executor finds the task's transcript in its workspace."""
    return f".baton/history/task-{task_id}.md"


@dataclass(frozen=True)
class TranscriptRequest:
    task_id: int
    is_group_chat: bool
    multi_bot: bool
    before_message_id: int


_PART_COLUMNS = (
    "task_id",
    "span",
    "number",
    "first_message_id",
    "last_message_id",
    "message_runs",
    "turns",
    "users",
    "assistants",
    "is_group_chat",
    "multi_bot",
    "builder_version",
    "pieces",
)


def transcripts_for(requests: Sequence[TranscriptRequest]) -> dict[int, Transcript]:
    """The transcripts of several tasks, by task id: each the task's turns in history before
    its request's message, its sealed parts read and the turns after them rendered. Two
    queries for the whole batch, rarely three (none for an empty one)."""
    if not requests:
        return {}
    parts, stale = _sealed_parts(requests)
    tails = _tails(requests, parts)
    # A turn dispatched late may stop right after a sealed part: a transcript ends with a
    # tail, so such a one renders its last part's turns again instead.
    short = [
        request
        for request in requests
        if parts.get(request.task_id) and not tails.get(request.task_id, ([], None))[0]
    ]
    if short:
        for request in short:
            parts[request.task_id].pop()
        tails.update(_tails(short, parts))
    # The turns after the short parts complete a long part: it is sealed from its turns, read
    # again (once every TRANSCRIPT_PART_TURNS turns), in place of the short parts.
    completing = [
        request
        for request in requests
        if _completes_a_long_part(
            parts.get(request.task_id, []), *tails.get(request.task_id, ([], None))
        )
    ]
    if completing:
        for request in completing:
            parts[request.task_id] = [
                part for part in parts[request.task_id] if part.span == TRANSCRIPT_PART_TURNS
            ]
        tails.update(_tails(completing, parts))
    transcripts = {}
    for request in requests:
        history, first_active = tails.get(request.task_id, ([], None))
        transcript = _transcript(
            request,
            parts=parts.get(request.task_id, []),
            history=history,
            first_active=first_active,
            stale=stale.get(request.task_id),
        )
        if transcript is not None:
            transcripts[request.task_id] = transcript
    return transcripts


def transcript_for(
    *, task_id: int, is_group_chat: bool, multi_bot: bool, snapshot: list[int] | dict[str, Any]
) -> Transcript | None:
    """The transcript a prompt report's snapshot names (`Transcript.snapshot`), rendered again
    from its turns (what a replay reads); None when one of them no longer exists."""
    table = Subtask._meta.db_table
    if isinstance(snapshot, dict):
        runs = [(int(first), int(last)) for first, last in snapshot["runs"]]
        condition = " OR ".join(f"{table}.message_id BETWEEN %s AND %s" for _ in runs)
        params = [bound for run in runs for bound in run]
        wanted = sum(last - first + 1 for first, last in runs)
        part_count, part_turns = int(snapshot["parts"]), int(snapshot["part_turns"])
        short_count = int(snapshot.get("short_parts", 0))
        short_turns = int(snapshot.get("short_part_turns", TRANSCRIPT_SHORT_PART_TURNS))
    else:
        params = [int(message_id) for message_id in snapshot]
        condition = f"{table}.message_id IN ({sql.placeholders(params)})"
        wanted = len(snapshot)
        part_count, part_turns = 0, TRANSCRIPT_PART_TURNS
        short_count, short_turns = 0, TRANSCRIPT_SHORT_PART_TURNS
    if not params:
        return None
    found = _turns(f"{table}.task_id = %s AND ({condition})", [task_id, *params])
    rows = [(message, turn_file) for _, _, message, turn_file in found]
    if not rows or len(rows) != wanted:
        return None
    request = TranscriptRequest(task_id, is_group_chat, multi_bot, before_message_id=0)
    parts = []
    for number in range(part_count):
        chunk = rows[number * part_turns : (number + 1) * part_turns]
        parts.append(_new_part(number, chunk, request, span=part_turns))
    start = part_count * part_turns
    for index in range(short_count):
        chunk = rows[start + index * short_turns : start + (index + 1) * short_turns]
        number = part_count * (part_turns // short_turns) + index
        parts.append(_new_part(number, chunk, request, span=short_turns))
    return _transcript(
        request,
        parts=parts,
        history=rows[start + short_count * short_turns :],
        first_active=None,
        stale=None,
        seal=False,
    )


def _sealed_parts(
    requests: Sequence[TranscriptRequest],
) -> tuple[dict[int, list[Part]], dict[int, Stale]]:
    """Each task's sealed parts that its request can use (its long parts consecutive from the
    first, then its short parts consecutive from the first after them, all before its message,
    rendered as it would render them), and the rows to remove when it is stored."""
    requested = {request.task_id: request for request in requests}
    task_ids = list(requested)
    per_long = _shorts_per_long()
    # The JSON columns come as their text, which is the key of the part they make: a long
    # conversation has many sealed parts, and each dispatch would decode them all again.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {sql.value_columns(TranscriptPart, _PART_COLUMNS)} "  # noqa: S608
            f"FROM {TranscriptPart._meta.db_table} "
            f"WHERE task_id IN ({sql.placeholders(task_ids)}) "
            "ORDER BY task_id, span DESC, number",
            task_ids,
        )
        rows = cursor.fetchall()
    parts: dict[int, list[Part]] = {}
    stale: dict[int, Stale] = {}
    longs: dict[int, int] = {}
    stopped: set[int] = set()
    for row in rows:
        task_id, span, number, first, last = row[:5]
        group_chat, multi_bot, version = bool(row[9]), bool(row[10]), row[11]
        if task_id in stopped:
            continue
        request = requested[task_id]
        usable = parts.setdefault(task_id, [])
        long_count = longs.setdefault(task_id, 0)
        if span == TRANSCRIPT_PART_TURNS:
            expected = len(usable)
        elif span == TRANSCRIPT_SHORT_PART_TURNS and per_long:
            expected = long_count * per_long + len(usable) - long_count
            if number < long_count * per_long:
                # A long part holds its turns: it is removed with the next long part sealed.
                stale.setdefault(task_id, Stale(short_below=long_count * per_long))
                continue
        else:
            continue  # a part of a length no longer used: never read
        if (
            number != expected
            or group_chat != request.is_group_chat
            or multi_bot != request.multi_bot
            or version != BUILDER_VERSION
        ):
            # This row and every later one are replaced: for a long part, every short one too.
            stale[task_id] = (
                Stale(long_from=expected, short_from=0)
                if span == TRANSCRIPT_PART_TURNS
                else Stale(short_from=expected, short_below=long_count * per_long)
            )
            stopped.add(task_id)
            continue
        if last >= request.before_message_id:
            stopped.add(task_id)
            continue
        runs, pieces = _json_text(row[5]), _json_text(row[12])
        usable.append(_sealed_part(span, number, first, last, runs, *row[6:9], pieces))
        if span == TRANSCRIPT_PART_TURNS:
            longs[task_id] += 1
    return parts, stale


def _json_text(value: str | list[Any] | dict[str, Any]) -> str:
    """A JSON column's text (as the database drivers Baton runs on give it), whatever the
    driver decoded."""
    return value if isinstance(value, str) else json.dumps(value)


@functools.lru_cache(maxsize=_SEALED_PARTS_KEPT)
def _sealed_part(
    span: int,
    number: int,
    first: int,
    last: int,
    runs: str,
    turns: int,
    users: int,
    assistants: int,
    pieces: str,
) -> Part:
    """The part a `TranscriptPart` row stands for, from its columns as read (the JSON ones
    as text): a sealed part never changes, so one read before is not built again."""
    runs_value = json.loads(runs)
    pieces_value = json.loads(pieces)
    return Part(
        span=span,
        number=number,
        first_message_id=first,
        last_message_id=last,
        runs=tuple((run[0], run[1]) for run in runs_value),
        turns=turns,
        users=users,
        assistants=assistants,
        transcript=StoredPiece(*pieces_value["transcript"]),
        turn_index=StoredPiece(*pieces_value["turn_index"]),
        turn_files=StoredPiece(*pieces_value["turn_files"]),
    )


_Tail = tuple[list[tuple[HistoryMessage, TurnFile]], int | None]


def _tails(
    requests: Sequence[TranscriptRequest], parts: Mapping[int, list[Part]]
) -> dict[int, _Tail]:
    """Each task's turns in history after its usable sealed parts and before its request's
    message, and the first of those turns that has not finished yet (one query)."""
    table = Subtask._meta.db_table
    ranges = []
    params: list[Any] = []
    for request in requests:
        ranges.append(
            f"({table}.task_id = %s AND {table}.message_id > %s AND {table}.message_id < %s)"
        )
        after = parts[request.task_id][-1].last_message_id if parts.get(request.task_id) else 0
        params += [request.task_id, after, request.before_message_id]
    statuses = [*HISTORY_STATUSES, *ACTIVE_SUBTASK_STATUSES]
    tails: dict[int, _Tail] = {}
    for task_id, status, message, turn_file in _turns(
        f"({' OR '.join(ranges)}) AND {table}.kind = %s "
        f"AND {table}.status IN ({sql.placeholders(statuses)})",
        [*params, SubtaskKind.TURN.value, *statuses],
    ):
        history, first_active = tails.setdefault(task_id, ([], None))
        if status in ACTIVE_SUBTASK_STATUSES:
            if first_active is None:
                tails[task_id] = (history, message.message_id)
        else:
            history.append((message, turn_file))
    return tails


def _transcript(
    request: TranscriptRequest,
    *,
    parts: list[Part],
    history: list[tuple[HistoryMessage, TurnFile]],
    first_active: int | None,
    stale: Stale | None,
    seal: bool = True,
) -> Transcript | None:
    """The transcript of `parts` and then `history`, sealing new parts of `history` while a
    turn in history follows them and none of their range is still running (`_seal`)."""
    if not history:
        return None
    parts = list(parts)
    if seal:
        parts, history = _seal(parts, history, first_active=first_active, request=request)
    messages = [message for message, _ in history]
    runs = _merge_runs(
        [run for part in parts for run in part.runs]
        + list(_runs([message.message_id for message in messages]))
    )
    path = transcript_path(request.task_id)
    turn_files = tuple(turn_file for _, turn_file in history)
    if not parts:
        text = render_transcript(
            messages, is_group_chat=request.is_group_chat, multi_bot=request.multi_bot
        )
        return Transcript(
            text=text,
            pointer=transcript_pointer(text, workspace_path=path),
            runs=runs,
            turns=len(messages),
            index=render_turn_index(messages),
            turn_files=turn_files,
            is_group_chat=request.is_group_chat,
            multi_bot=request.multi_bot,
        )
    text = render_transcript_tail(
        messages, is_group_chat=request.is_group_chat, multi_bot=request.multi_bot
    )
    tail = StoredPiece.of_text(text)
    [*_, (_, whole)] = _whole(parts, tail, task_id=request.task_id, piece=_transcript_piece)
    return Transcript(
        text=text,
        pointer=ArtifactPointer(
            artifact_id=whole.pk,
            kind=ArtifactKind.TRANSCRIPT,
            total_chars=whole.size_chars,
            total_lines=whole.size_lines,
            workspace_path=path,
        ),
        runs=runs,
        turns=len(messages) + sum(part.turns for part in parts),
        index=render_turn_index(messages, header=False),
        turn_files=turn_files,
        parts=tuple(parts),
        stale=stale,
        piece=tail,
        is_group_chat=request.is_group_chat,
        multi_bot=request.multi_bot,
    )


def _seal(
    parts: list[Part],
    history: list[tuple[HistoryMessage, TurnFile]],
    *,
    first_active: int | None,
    request: TranscriptRequest,
) -> tuple[list[Part], list[tuple[HistoryMessage, TurnFile]]]:
    """`parts` with the new parts sealed from the start of `history`, and the rest of it: a
    long part while there are no short ones and a long part's turns and one more are here,
    else short parts, as long as they stay fewer than a long part's worth (the turns that
    would complete one are sealed as the long part instead, `_completes_a_long_part`). A part
    is sealed only when none of its turns is still running."""
    per_long = _shorts_per_long()
    while True:
        long_count = sum(part.span == TRANSCRIPT_PART_TURNS for part in parts)
        short_count = len(parts) - long_count
        if short_count == 0 and len(history) > TRANSCRIPT_PART_TURNS:
            span, number = TRANSCRIPT_PART_TURNS, long_count
        elif short_count < per_long - 1 and len(history) > TRANSCRIPT_SHORT_PART_TURNS:
            span, number = TRANSCRIPT_SHORT_PART_TURNS, long_count * per_long + short_count
        else:
            return parts, history
        chunk = history[:span]
        if first_active is not None and first_active < chunk[-1][0].message_id:
            return parts, history
        parts = [*parts, _new_part(number, chunk, request, span=span)]
        history = history[span:]


def _completes_a_long_part(
    parts: list[Part], history: list[tuple[HistoryMessage, TurnFile]], first_active: int | None
) -> bool:
    """Whether the turns after the short parts would seal the last short part a long part
    holds: then the long part is sealed instead, from all its turns."""
    per_long = _shorts_per_long()
    short_count = sum(part.span != TRANSCRIPT_PART_TURNS for part in parts)
    if not per_long or short_count != per_long - 1:
        return False
    if len(history) <= TRANSCRIPT_SHORT_PART_TURNS:
        return False
    last = history[TRANSCRIPT_SHORT_PART_TURNS - 1][0].message_id
    return first_active is None or first_active > last


def _new_part(
    number: int,
    chunk: list[tuple[HistoryMessage, TurnFile]],
    request: TranscriptRequest,
    *,
    span: int,
) -> Part:
    messages = [message for message, _ in chunk]
    text = render_transcript_part(
        messages,
        opens=number == 0,
        is_group_chat=request.is_group_chat,
        multi_bot=request.multi_bot,
    )
    index = render_turn_index(messages, header=number == 0)
    return Part(
        span=span,
        number=number,
        first_message_id=messages[0].message_id,
        last_message_id=messages[-1].message_id,
        runs=_runs([message.message_id for message in messages]),
        turns=len(messages),
        users=sum(message.role is Role.USER for message in messages),
        assistants=sum(message.role is Role.ASSISTANT for message in messages),
        transcript=StoredPiece.of_text(text),
        turn_index=StoredPiece.of_text(index),
        turn_files=None,
        new=True,
        transcript_text=text,
        index_text=index,
        files=tuple(turn_file for _, turn_file in chunk),
    )


def _whole(
    parts: Sequence[Part],
    newest: Stored,
    *,
    task_id: int,
    piece: Callable[[Part], StoredPiece],
) -> list[tuple[list[Stored], Artifact]]:
    """The composites that name the whole of the parts' pieces (`piece` of each: of the
    transcript, or of the index) and then the newest piece, innermost first, each with its
    parts and its (unsaved) row: the last names the whole. The whole is [the sealed pieces'
    composite, the newest piece], and the sealed pieces' composite is [the long parts'
    composite, the short parts' pieces] when there are both: each inner composite stays the
    same over many dispatches (until a part of its kind is sealed), so a dispatch links two
    parts, a short part's sealing a few more, and only a long part's one per long part."""
    longs: list[Stored] = [piece(part) for part in parts if part.span == TRANSCRIPT_PART_TURNS]
    shorts: list[Stored] = [piece(part) for part in parts if part.span != TRANSCRIPT_PART_TURNS]
    kind = ArtifactKind.TRANSCRIPT
    chain: list[tuple[list[Stored], Artifact]] = []
    sealed = longs or shorts
    if longs and shorts:
        inner = composite_row(longs, kind=kind, task_id=task_id)
        chain.append((longs, inner))
        sealed = [inner, *shorts]
    prefix = composite_row(sealed, kind=kind, task_id=task_id)
    chain.append((sealed, prefix))
    chain.append(([prefix, newest], composite_row([prefix, newest], kind=kind, task_id=task_id)))
    return chain


def _runs(message_ids: Sequence[int]) -> Runs:
    """Ascending ids as inclusive runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for message_id in message_ids:
        if runs and runs[-1][1] + 1 == message_id:
            runs[-1] = (runs[-1][0], message_id)
        else:
            runs.append((message_id, message_id))
    return tuple(runs)


def _merge_runs(runs: Sequence[tuple[int, int]]) -> Runs:
    merged: list[tuple[int, int]] = []
    for first, last in runs:
        if merged and merged[-1][1] + 1 == first:
            merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return tuple(merged)


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


def _turns(
    where: str, params: Sequence[Any]
) -> Iterator[tuple[int, str, HistoryMessage, TurnFile]]:
    """(task id, status, message, turn file) for each turn `where` selects, by task and
    message id, read as plain values: a transcript reads many earlier turns, so no model
    instances, and every dispatch that leaves history out reads them, so the SQL is written
    out (see `backend.sql`). The rows were validated as `history_message`s when they were
    recorded and each prompt that includes them validates them again; here they are only
    rendered, so they are constructed without a second validation."""
    table, artifacts = Subtask._meta.db_table, Artifact._meta.db_table
    rows = sql.values_of(
        Subtask,
        _COLUMNS,
        f"SELECT {sql.value_columns(Subtask, _COLUMNS)} FROM {table} "  # noqa: S608
        f"LEFT JOIN {artifacts} ON {artifacts}.id = {table}.artifact_id WHERE {where} "
        f"ORDER BY {table}.task_id, {table}.message_id",
        params,
    )
    for row in rows:
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
        yield task_id, status, message, turn_file


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

    Queries: a fixed number for the whole batch while the new rows fit one statement (see the
    module docstring): one inserting the artifacts (the texts and, for transcripts in parts,
    the composites naming each whole), one locking those that existed already (none when
    every one is new), one for the part rows of new composites, one linking new turn files to
    their turns and one pointing the tasks to their transcripts; two more when a part is
    sealed (its list stored, and its row; three when its list existed already). Every row
    stays locked until the tasks, turns and parts point to it, so a concurrent prune waits and
    then sees the references.

    `current` gives, by task id, the (transcript, turn index) artifact ids the task points to
    as read (the claimed rows' task): a transcript in parts that is exactly the current one,
    stored whole already (no part to seal, every turn file stored and linked), is listed
    without a query. A turn's result that leaves its task waiting for a message stores it
    (`tasks.services.store_next_transcript`), so the next dispatch finds it so.
    """
    done: dict[int, HistoryFiles] = {}
    for task_id, transcript in transcripts.items():
        listed = _stored_already(task_id, transcript, (current or {}).get(task_id))
        if listed is not None:
            done[task_id] = listed
    transcripts = {
        task_id: transcript for task_id, transcript in transcripts.items() if task_id not in done
    }
    if not transcripts:
        return done
    new_parts = [
        (task_id, part)
        for task_id, transcript in transcripts.items()
        for part in transcript.parts
        if part.new
    ]
    new_files = [
        (task_id, turn_file)
        for task_id, transcript in transcripts.items()
        for turn_file in (
            *transcript.turn_files,
            *(file for part in transcript.parts if part.new for file in part.files),
        )
        if turn_file.stored is None
    ]
    tail_pieces = {
        task_id: transcript.piece or StoredPiece.of_text(transcript.text)
        for task_id, transcript in transcripts.items()
    }
    index_pieces = {
        task_id: StoredPiece.of_text(transcript.index)
        for task_id, transcript in transcripts.items()
    }
    texts = [
        *(
            ArtifactText(
                text=transcript.text,
                kind=ArtifactKind.TRANSCRIPT,
                task_id=task_id,
                known_address=tail_pieces[task_id].address,
            )
            for task_id, transcript in transcripts.items()
        ),
        *(
            ArtifactText(
                text=transcript.index,
                kind=ArtifactKind.TRANSCRIPT,
                task_id=task_id,
                known_address=index_pieces[task_id].address,
            )
            for task_id, transcript in transcripts.items()
        ),
        *(
            ArtifactText(text=text, kind=ArtifactKind.TRANSCRIPT, task_id=task_id)
            for task_id, part in new_parts
            for text in (part.transcript_text, part.index_text)
        ),
        *(
            ArtifactText(text=turn_file.text, kind=classify_text(turn_file.text), task_id=task_id)
            for task_id, turn_file in new_files
        ),
    ]
    with atomic_storing_artifacts():
        removed = _removed_parts(transcripts)
        if removed:
            TranscriptPart.objects.filter(any_of(removed)).delete()
        # The composites naming each whole go in with the last batch of texts: their newest
        # pieces are those texts, and their other pieces the sealed parts'.
        composites, in_parts = _whole_composites(
            transcripts, tails=tail_pieces, indexes=index_pieces
        )
        artifacts: list[Artifact] = []
        batches = list(_batches(texts, size=_TEXTS_PER_STATEMENT))
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
        stored_files = artifacts[2 * count + 2 * len(new_parts) :]
        _link_turn_files(
            [
                (turn_file.subtask_id, artifact.pk)
                for (_, turn_file), artifact in zip(new_files, stored_files, strict=True)
            ]
        )
        file_entries = {
            turn_file.subtask_id: ManifestEntry.of(artifact, workspace_path=turn_file.path)
            for (_, turn_file), artifact in zip(new_files, stored_files, strict=True)
        }
        lists = _store_new_parts(new_parts, file_entries, transcripts)
        pointing = {
            task_id: wholes.get(task_id, (tail, index))
            for task_id, tail, index in zip(transcripts, tails, indexes, strict=True)
        }
        for task_id, transcript in transcripts.items():
            if pointing[task_id][0].pk != transcript.pointer.artifact_id:
                raise RuntimeError("content address mismatch")
        _point_tasks(pointing)
    history_files = done
    for (task_id, transcript), tail, index in zip(transcripts.items(), tails, indexes, strict=True):
        files = [
            turn_file.stored or file_entries[turn_file.subtask_id]
            for turn_file in transcript.turn_files
        ]
        if task_id not in wholes:
            history_files[task_id] = HistoryFiles(
                transcript=None,
                files=[ManifestEntry.of(index, workspace_path=TURN_INDEX_PATH), *files],
            )
            continue
        history_files[task_id] = _in_parts(
            task_id,
            transcript,
            wholes=wholes[task_id],
            newest=(_piece(tail), _piece(index)),
            files=files,
            lists=[(part.turn_files or lists[(task_id, part.number)]) for part in transcript.parts],
        )
    return history_files


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
        _whole(transcript.parts, newest, task_id=task_id, piece=piece)[-1][1]
        for newest, piece in ((transcript.piece, _transcript_piece), (index, _index_piece))
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


def _removed_parts(transcripts: Mapping[int, Transcript]) -> list[Q]:
    """The part rows storing these transcripts removes: the stale ones, and the short parts
    whose turns a long part sealed now holds."""
    per_long = _shorts_per_long()
    short = ~Q(span=TRANSCRIPT_PART_TURNS)
    removed = []
    for task_id, transcript in transcripts.items():
        stale = transcript.stale or Stale()
        if stale.long_from is not None:
            removed.append(
                Q(task_id=task_id, span=TRANSCRIPT_PART_TURNS) & Q(number__gte=stale.long_from)
            )
        if stale.short_from is not None:
            removed.append(Q(task_id=task_id, number__gte=stale.short_from) & short)
        covered = max(
            [stale.short_below]
            + [
                (part.number + 1) * per_long
                for part in transcript.parts
                if part.new and part.span == TRANSCRIPT_PART_TURNS
            ]
        )
        if covered:
            removed.append(Q(task_id=task_id, number__lt=covered) & short)
    return removed


def _link_turn_files(links: Sequence[tuple[int, str]]) -> None:
    """Make each newly stored turn file (subtask id, artifact id) its turn's artifact. A
    dispatch links the turns recorded since the last one, and the first dispatch of a long
    task links thousands: the SQL is written out (see `backend.sql`)."""
    table = Subtask._meta.db_table
    for batch in _batches(links, size=_LINKS_PER_STATEMENT):
        artifact_ids, params = sql.case_by_id(dict(batch))
        ids = [subtask_id for subtask_id, _ in batch]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET artifact_id = {artifact_ids} "  # noqa: S608
                f"WHERE id IN ({sql.placeholders(ids)}) AND artifact_id IS NULL",
                [*params, *ids],
            )


def _point_tasks(current: Mapping[int, tuple[Artifact, Artifact]]) -> None:
    """Make each task's (transcript, turn index) its current ones (one statement)."""
    transcripts, transcript_params = sql.case_by_id(
        {task_id: pair[0].pk for task_id, pair in current.items()}
    )
    indexes, index_params = sql.case_by_id(
        {task_id: pair[1].pk for task_id, pair in current.items()}
    )
    ids = list(current)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Task._meta.db_table} SET transcript_id = {transcripts}, "  # noqa: S608
            f"turn_index_id = {indexes} WHERE id IN ({sql.placeholders(ids)})",
            [*transcript_params, *index_params, *ids],
        )


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


def _whole_composites(
    transcripts: Mapping[int, Transcript],
    *,
    tails: Mapping[int, StoredPiece],
    indexes: Mapping[int, StoredPiece],
) -> tuple[list[tuple[Sequence[Stored], str, int | None]], dict[int, tuple[int, int]]]:
    """For each transcript in parts, the composites to store (see `_whole`), for the transcript
    and then for the index; and, by task id, where in that list the two wholes are."""
    batch: list[tuple[Sequence[Stored], str, int | None]] = []
    wholes: dict[int, tuple[int, int]] = {}
    for task_id, transcript in transcripts.items():
        if not transcript.parts:
            continue
        at = []
        for newest, piece in (
            (tails[task_id], _transcript_piece),
            (indexes[task_id], _index_piece),
        ):
            chain = _whole(transcript.parts, newest, task_id=task_id, piece=piece)
            batch += [(parts, ArtifactKind.TRANSCRIPT, task_id) for parts, _ in chain]
            at.append(len(batch) - 1)
        wholes[task_id] = (at[0], at[1])
    return batch, wholes


def _transcript_piece(part: Part) -> StoredPiece:
    return part.transcript


def _index_piece(part: Part) -> StoredPiece:
    return part.turn_index


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
