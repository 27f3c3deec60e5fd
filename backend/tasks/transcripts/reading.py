"""What a dispatch reads for a transcript: the task's turns before a message, as plain values.

`transcripts_for` answers a batch of `TranscriptRequest`s: each task's usable sealed parts
(`sealing.sealed_parts`), then its turns in history after them and before the request's message
(the *tail*), from which it seals the parts that are due and renders the rest. `transcript_for`
renders again, from a prompt report's snapshot, the transcript a prompt pointed to (what a
replay reads). Nothing here writes: `storing` stores what is read.

Queries, for a batch of dispatched turns: one for the part rows, one for the turns after them
(a second, rarely, when a turn dispatched late stops before its task's last sealed part, or
when a long part is sealed from its turns).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.db import connection
from django.db.models import Q

from backend import queries
from backend.artifacts.selectors import ManifestEntry
from backend.prompting.addressing import workspace_path
from backend.prompting.inputs import ArtifactPointer, HistoryMessage, Role
from backend.prompting.kinds import ArtifactKind
from backend.prompting.transcript import (
    render_transcript,
    render_transcript_tail,
    transcript_pointer,
)
from backend.prompting.truncate import layout_fields
from backend.prompting.turn_files import render_turn_index, turn_file_path
from backend.tasks import transcript_spans
from backend.tasks.history import HISTORY_STATUSES
from backend.tasks.history.rows import STEERED_INTO_BOT, with_steered_into_bot
from backend.tasks.models import ACTIVE_SUBTASK_STATUSES, Subtask, SubtaskKind, SubtaskStatus
from backend.tasks.transcripts.sealing import (
    completes_a_long_part,
    new_part,
    seal,
    sealed_parts,
    transcript_piece,
    whole,
)
from backend.tasks.transcripts.types import (
    Part,
    Stale,
    StoredPiece,
    Transcript,
    TranscriptRequest,
    TurnFile,
    merge_runs,
    runs_of,
    transcript_path,
)

_Tail = tuple[list[tuple[HistoryMessage, TurnFile]], int | None]


def transcripts_for(requests: Sequence[TranscriptRequest]) -> dict[int, Transcript]:
    """The transcripts of several tasks, by task id: each the task's turns in history before
    its request's message, its sealed parts read and the turns after them rendered. Two
    queries for the whole batch, rarely three (none for an empty one)."""
    if not requests:
        return {}
    parts, stale = sealed_parts(requests)
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
        if completes_a_long_part(
            parts.get(request.task_id, []), *tails.get(request.task_id, ([], None))
        )
    ]
    if completing:
        long_span = transcript_spans.TRANSCRIPT_PART_TURNS
        for request in completing:
            parts[request.task_id] = [
                part for part in parts[request.task_id] if part.span == long_span
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
    if isinstance(snapshot, dict):
        runs = [(int(first), int(last)) for first, last in snapshot["runs"]]
        condition = Q()
        for run in runs:
            condition |= Q(message_id__range=run)
        wanted = sum(last - first + 1 for first, last in runs)
        part_count, part_turns = int(snapshot["parts"]), int(snapshot["part_turns"])
        short_count = int(snapshot.get("short_parts", 0))
        short_turns = int(
            snapshot.get("short_part_turns", transcript_spans.TRANSCRIPT_SHORT_PART_TURNS)
        )
    else:
        runs = [(int(message_id), int(message_id)) for message_id in snapshot]
        condition = Q(message_id__in=[first for first, _ in runs])
        wanted = len(snapshot)
        part_count, part_turns = 0, transcript_spans.TRANSCRIPT_PART_TURNS
        short_count, short_turns = 0, transcript_spans.TRANSCRIPT_SHORT_PART_TURNS
    if not runs:
        return None
    found = _turns(_turn_rows(Q(task_id=task_id) & condition))
    rows = [(message, turn_file) for _, _, message, turn_file in found]
    if not rows or len(rows) != wanted:
        return None
    request = TranscriptRequest(task_id, is_group_chat, multi_bot, before_message_id=0)
    parts = []
    for number in range(part_count):
        chunk = rows[number * part_turns : (number + 1) * part_turns]
        parts.append(new_part(number, chunk, request, span=part_turns))
    start = part_count * part_turns
    for index in range(short_count):
        chunk = rows[start + index * short_turns : start + (index + 1) * short_turns]
        number = part_count * (part_turns // short_turns) + index
        parts.append(new_part(number, chunk, request, span=short_turns))
    return _transcript(
        request,
        parts=parts,
        history=rows[start + short_count * short_turns :],
        first_active=None,
        stale=None,
        seal_parts=False,
    )


def _tails(
    requests: Sequence[TranscriptRequest], parts: Mapping[int, list[Part]]
) -> dict[int, _Tail]:
    """Each task's turns in history after its usable sealed parts and before its request's
    message, and the first of those turns that has not finished yet (one query)."""
    bounds = [
        (
            request.task_id,
            parts[request.task_id][-1].last_message_id if parts.get(request.task_id) else 0,
            request.before_message_id,
        )
        for request in requests
    ]
    tails: dict[int, _Tail] = {}
    for task_id, status, message, turn_file in _turns(_tail_rows(bounds)):
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
    seal_parts: bool = True,
) -> Transcript | None:
    """The transcript of `parts` and then `history`, sealing new parts of `history` while a
    turn in history follows them and none of their range is still running (`sealing.seal`)."""
    if not history:
        return None
    parts = list(parts)
    if seal_parts:
        parts, history = seal(parts, history, first_active=first_active, request=request)
    messages = [message for message, _ in history]
    runs = merge_runs(
        [run for part in parts for run in part.runs]
        + list(runs_of([message.message_id for message in messages]))
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
    [*_, (_, named)] = whole(parts, tail, task_id=request.task_id, piece=transcript_piece)
    return Transcript(
        text=text,
        pointer=ArtifactPointer(
            artifact_id=named.pk,
            kind=ArtifactKind.TRANSCRIPT,
            total_chars=named.size_chars,
            total_lines=named.size_lines,
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
    "steered_into_message_id",
    STEERED_INTO_BOT,
)


def _tail_rows(bounds: Sequence[tuple[int, int, int]]) -> Sequence[Sequence[Any]]:
    """The rows (`_COLUMNS`) of the turns in history or still running of each (task id,
    after, before): those with a message id between the two, by task and message id."""
    statuses = [*HISTORY_STATUSES, *ACTIVE_SUBTASK_STATUSES]
    if connection.vendor == "postgresql":
        task_ids, after, before = (list(column) for column in zip(*bounds, strict=True))
        return queries.fetch(
            "transcript_tails",
            {
                "task_ids": task_ids,
                "after": after,
                "before": before,
                "kind": SubtaskKind.TURN.value,
                "statuses": statuses,
            },
        )
    ranges = Q()
    for task_id, after_id, before_id in bounds:
        ranges |= Q(task_id=task_id, message_id__gt=after_id, message_id__lt=before_id)
    return _turn_rows(ranges & Q(kind=SubtaskKind.TURN, status__in=statuses))


def _turn_rows(where: Q) -> Sequence[Sequence[Any]]:
    """The rows (`_COLUMNS`) of the turns `where` selects, by task and message id."""
    return list(
        with_steered_into_bot(Subtask.objects.filter(where))
        .order_by("task_id", "message_id")
        .values_list(*_COLUMNS)
    )


def _turns(
    rows: Iterable[Sequence[Any]],
) -> Iterator[tuple[int, str, HistoryMessage, TurnFile]]:
    """(task id, status, message, turn file) of each row of `_COLUMNS`, read as plain values:
    a transcript reads many earlier turns, so no model instances. The rows were validated as
    `history_message`s when they were recorded and each prompt that includes them validates
    them again; here they are only rendered, so they are constructed without a second
    validation."""
    for row in rows:
        (task_id, message_id, role, status, sender, bot, text, spilled, head, tail) = row[:10]
        layout, chars, artifact_id, kind, size_chars, size_lines = row[10:16]
        subtask_id, sha256, size_bytes, steered_into, steered_into_bot = row[16:]
        if spilled and isinstance(layout, str):
            layout = json.loads(layout)  # the PostgreSQL statement reads JSON as its text
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
            steered_into_message_id=steered_into if role == Role.USER else None,
            steered_into_bot=(steered_into_bot or None) if steered_into is not None else None,
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
