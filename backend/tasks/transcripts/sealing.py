"""Sealed parts: when a part of a long conversation's transcript is sealed, and its rows.

A long conversation is not rendered again on every dispatch. Its earlier turns are cut into
consecutive long parts of `TRANSCRIPT_PART_TURNS` turns in history, and the turns after the last
long part into short parts of `TRANSCRIPT_SHORT_PART_TURNS`, fewer than a long part holds (the
turns that would fill its last short part seal the long part instead, and its short parts go;
the spans are `backend.tasks.transcript_spans`); a part is *sealed* (a `TranscriptPart` row) once
every turn in its range of message ids has finished and at least one turn in history follows
it. Finished turns never change, so a sealed part never does: its piece of the transcript, its
rows of the index and the list of its turn files are stored once, and a row read before is not
built again (`_sealed_part`).

A dispatch then reads the part rows and only the turns after the last sealed part (about a
short part's worth), renders and stores those (the *tail*), and names the whole as composite
artifacts (`backend.artifacts.services.store_artifacts_and_composites`): the transcript is the
composite of [the sealed parts' composite, the tail], and so is the index (`whole`). Rendered in
parts, the transcript always opens with the escape note (a later part may need it); it is
otherwise byte for byte the transcript of the same turns rendered whole, and the index is
exactly the index. A conversation too short to seal a part is rendered whole, as one artifact.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import connection
from django.db.models import Q, TextField
from django.db.models.functions import Cast

from backend import queries
from backend.artifacts.models import Artifact
from backend.artifacts.services import Stored, composite_row
from backend.prompting import BUILDER_VERSION
from backend.prompting.inputs import HistoryMessage, Role
from backend.prompting.kinds import ArtifactKind
from backend.prompting.transcript import render_transcript_part
from backend.prompting.turn_files import render_turn_index
from backend.tasks import transcript_spans
from backend.tasks.models import TranscriptPart
from backend.tasks.transcripts.types import (
    Part,
    Stale,
    StoredPiece,
    Transcript,
    TranscriptRequest,
    TurnFile,
    runs_of,
)

# Sealed parts a server process keeps built, by their rows' columns (about 1 KiB each).
_SEALED_PARTS_KEPT = 20_000

_PART_COLUMNS = (
    "task_id",
    "span",
    "number",
    "first_message_id",
    "last_message_id",
    Cast("message_runs", TextField()),
    "turns",
    "users",
    "assistants",
    "is_group_chat",
    "multi_bot",
    "builder_version",
    Cast("pieces", TextField()),
)


def may_be_in_parts(*, turns: int) -> bool:
    """Whether a transcript of this many turns may have a sealed part: one more turn than the
    shortest part holds (a turn in history follows every sealed part)."""
    spans = [transcript_spans.TRANSCRIPT_PART_TURNS]
    if transcript_spans.shorts_per_long():
        spans.append(transcript_spans.TRANSCRIPT_SHORT_PART_TURNS)
    return turns > min(spans)


def sealed_parts(
    requests: Sequence[TranscriptRequest],
) -> tuple[dict[int, list[Part]], dict[int, Stale]]:
    """Each task's sealed parts that its request can use (its long parts consecutive from the
    first, then its short parts consecutive from the first after them, all before its message,
    rendered as it would render them), and the rows to remove when it is stored."""
    requested = {request.task_id: request for request in requests}
    task_ids = list(requested)
    long_span = transcript_spans.TRANSCRIPT_PART_TURNS
    per_long = transcript_spans.shorts_per_long()
    rows = _part_rows(task_ids)
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
        if span == long_span:
            expected = len(usable)
        elif span == transcript_spans.TRANSCRIPT_SHORT_PART_TURNS and per_long:
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
                if span == long_span
                else Stale(short_from=expected, short_below=long_count * per_long)
            )
            stopped.add(task_id)
            continue
        if last >= request.before_message_id:
            stopped.add(task_id)
            continue
        usable.append(_sealed_part(span, number, first, last, row[5], *row[6:9], row[12]))
        if span == long_span:
            longs[task_id] += 1
    return parts, stale


def _part_rows(task_ids: list[int]) -> Sequence[Sequence[Any]]:
    """The part rows of these tasks, `_PART_COLUMNS` in order, by task, span (long first) and
    number. The JSON columns are read as their text, which is the key of the part they make:
    a long conversation has many sealed parts, and each dispatch would decode them all again."""
    if connection.vendor == "postgresql":
        return queries.fetch("transcript_parts", {"task_ids": task_ids})
    return list(
        TranscriptPart.objects.filter(task_id__in=task_ids)
        .order_by("task_id", "-span", "number")
        .values_list(*_PART_COLUMNS)
    )


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


def seal(
    parts: list[Part],
    history: list[tuple[HistoryMessage, TurnFile]],
    *,
    first_active: int | None,
    request: TranscriptRequest,
) -> tuple[list[Part], list[tuple[HistoryMessage, TurnFile]]]:
    """`parts` with the new parts sealed from the start of `history`, and the rest of it: a
    long part while there are no short ones and a long part's turns and one more are here,
    else short parts, as long as they stay fewer than a long part's worth (the turns that
    would complete one are sealed as the long part instead, `completes_a_long_part`). A part
    is sealed only when none of its turns is still running."""
    long_span = transcript_spans.TRANSCRIPT_PART_TURNS
    short_span = transcript_spans.TRANSCRIPT_SHORT_PART_TURNS
    per_long = transcript_spans.shorts_per_long()
    while True:
        long_count = sum(part.span == long_span for part in parts)
        short_count = len(parts) - long_count
        if short_count == 0 and len(history) > long_span:
            span, number = long_span, long_count
        elif short_count < per_long - 1 and len(history) > short_span:
            span, number = short_span, long_count * per_long + short_count
        else:
            return parts, history
        chunk = history[:span]
        if first_active is not None and first_active < chunk[-1][0].message_id:
            return parts, history
        parts = [*parts, new_part(number, chunk, request, span=span)]
        history = history[span:]


def completes_a_long_part(
    parts: list[Part], history: list[tuple[HistoryMessage, TurnFile]], first_active: int | None
) -> bool:
    """Whether the turns after the short parts would seal the last short part a long part
    holds: then the long part is sealed instead, from all its turns."""
    per_long = transcript_spans.shorts_per_long()
    short_span = transcript_spans.TRANSCRIPT_SHORT_PART_TURNS
    short_count = sum(part.span != transcript_spans.TRANSCRIPT_PART_TURNS for part in parts)
    if not per_long or short_count != per_long - 1:
        return False
    if len(history) <= short_span:
        return False
    last = history[short_span - 1][0].message_id
    return first_active is None or first_active > last


def new_part(
    number: int,
    chunk: list[tuple[HistoryMessage, TurnFile]],
    request: TranscriptRequest,
    *,
    span: int,
) -> Part:
    """The part `number` of its span sealed from `chunk`, rendered and not stored yet."""
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
        runs=runs_of([message.message_id for message in messages]),
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


def whole(
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
    long_span = transcript_spans.TRANSCRIPT_PART_TURNS
    longs: list[Stored] = [piece(part) for part in parts if part.span == long_span]
    shorts: list[Stored] = [piece(part) for part in parts if part.span != long_span]
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


def whole_composites(
    transcripts: Mapping[int, Transcript],
    *,
    tails: Mapping[int, StoredPiece],
    indexes: Mapping[int, StoredPiece],
) -> tuple[list[tuple[Sequence[Stored], str, int | None]], dict[int, tuple[int, int]]]:
    """For each transcript in parts, the composites to store (see `whole`), for the
    transcript and then for the index; and, by task id, where in that list the two wholes
    are."""
    batch: list[tuple[Sequence[Stored], str, int | None]] = []
    wholes: dict[int, tuple[int, int]] = {}
    for task_id, transcript in transcripts.items():
        if not transcript.parts:
            continue
        at = []
        for newest, piece in (
            (tails[task_id], transcript_piece),
            (indexes[task_id], index_piece),
        ):
            chain = whole(transcript.parts, newest, task_id=task_id, piece=piece)
            batch += [(parts, ArtifactKind.TRANSCRIPT, task_id) for parts, _ in chain]
            at.append(len(batch) - 1)
        wholes[task_id] = (at[0], at[1])
    return batch, wholes


def transcript_piece(part: Part) -> StoredPiece:
    """A part's piece of the transcript (a `piece` of `whole`)."""
    return part.transcript


def index_piece(part: Part) -> StoredPiece:
    """A part's rows of the index (a `piece` of `whole`)."""
    return part.turn_index


def removed_parts(transcripts: Mapping[int, Transcript]) -> list[Q]:
    """The part rows storing these transcripts removes: the stale ones, and the short parts
    whose turns a long part sealed now holds."""
    long_span = transcript_spans.TRANSCRIPT_PART_TURNS
    per_long = transcript_spans.shorts_per_long()
    short = ~Q(span=long_span)
    removed = []
    for task_id, transcript in transcripts.items():
        stale = transcript.stale or Stale()
        if stale.long_from is not None:
            removed.append(Q(task_id=task_id, span=long_span) & Q(number__gte=stale.long_from))
        if stale.short_from is not None:
            removed.append(Q(task_id=task_id, number__gte=stale.short_from) & short)
        covered = max(
            [stale.short_below]
            + [
                (part.number + 1) * per_long
                for part in transcript.parts
                if part.new and part.span == long_span
            ]
        )
        if covered:
            removed.append(Q(task_id=task_id, number__lt=covered) & short)
    return removed
