"""A running turn's partial answer: stored as what it gained, assembled where it is read.

A worker posts its partial answer up to twice a second. Rewriting the whole text on each post
cost as much as the text already held (PostgreSQL copies a long text value whole on any
change, WAL included), so a turn's progress cost the square of its length. So a post sends
only what the text gained since the last post Baton accepted, with the length the stored text
must have before it (`partial_text_offset`, a compare-and-set), and Baton stores it as one
`ProgressPiece` row: an append costs what it adds.

The stored partial answer of a turn is always `Subtask.partial_text` followed by the pieces of
its current attempt, in offset order; `Subtask.partial_text_chars` and `partial_text_bytes`
measure it, so an append is checked without reading the text. A whole text (a replaced answer,
or a worker that lost track) becomes the attempt's first piece, so the row's column stays
small while the turn runs. When the attempt ends the turn (a result, a failure, a cancel, an
interrupt), `end_attempts` folds its pieces into the column once and deletes them, with the
turn's `turn.progress` events, which the turn's other events and its stored text outlive. When
the turn goes back to the queue instead (a retry, a release, an expired lease),
`discard_attempts` drops what the attempt wrote: it is no answer of the turn, and the next
attempt starts from an empty text, as its worker does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db.models import F, TextField, Value
from django.db.models.functions import Concat

from backend.errors import PartialTextMismatch, PayloadTooLarge
from backend.tasks import task_events
from backend.tasks.ingestion import replace_unstorable_chars
from backend.tasks.models import ProgressPiece, Subtask


@dataclass(frozen=True)
class PartialTextChange:
    """What a post did to the stored partial answer, for its progress event: the text it
    gained (`added`), and whether it replaced the answer rather than extending it (`reset`)."""

    added: str
    reset: bool


def utf8_bytes(text: str) -> int:
    """The UTF-8 size of stored text (no lone surrogates: `replace_unstorable_chars` ran)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8"))


def replace_partial_text(*, subtask: Subtask, text: str) -> PartialTextChange | None:
    """Store `text` as the turn's whole partial answer (unsaved fields of `subtask`: the caller
    saves `partial_text`, `partial_text_chars` and `partial_text_bytes`). None when the stored
    answer is that text already."""
    text = replace_unstorable_chars(text)[0]
    size = utf8_bytes(text)
    _check_size(size=size, field="partial_text")
    before = partial_text_of(subtask)
    if text == before:
        return None
    ProgressPiece.objects.filter(subtask_id=subtask.pk).delete()
    if text:
        ProgressPiece.objects.create(
            subtask_id=subtask.pk, attempt=subtask.attempts, offset=0, text=text
        )
    subtask.partial_text = ""
    subtask.partial_text_chars = len(text)
    subtask.partial_text_bytes = size
    if text.startswith(before):
        return PartialTextChange(added=text[len(before) :], reset=False)
    return PartialTextChange(added=text, reset=True)


def append_partial_text(*, subtask: Subtask, text: str, offset: int) -> PartialTextChange | None:
    """Append `text` to the turn's partial answer, which must be `offset` code points long
    (else PartialTextMismatch, which tells its length: the worker sends the whole text then).
    Writes one piece and sets `partial_text_chars` and `partial_text_bytes` (unsaved)."""
    if offset != subtask.partial_text_chars:
        raise PartialTextMismatch(
            f"partial_text_offset is {offset}, but the stored partial text is "
            f"{subtask.partial_text_chars} characters long; send the whole text as "
            "partial_text.",
            stored_chars=subtask.partial_text_chars,
        )
    if not text:
        return None
    text = replace_unstorable_chars(text)[0]
    size = utf8_bytes(text)
    _check_size(size=subtask.partial_text_bytes + size, field="partial_text_append")
    ProgressPiece.objects.create(
        subtask_id=subtask.pk, attempt=subtask.attempts, offset=offset, text=text
    )
    subtask.partial_text_chars += len(text)
    subtask.partial_text_bytes += size
    return PartialTextChange(added=text, reset=False)


def _check_size(*, size: int, field: str) -> None:
    """PayloadTooLarge naming `field` when the stored partial text would be over
    BATON_MAX_MESSAGE_BYTES (the message limit, as for a message the product posts)."""
    limit = settings.BATON_MAX_MESSAGE_BYTES
    if size > limit:
        what = "the partial text with it" if field == "partial_text_append" else field
        raise PayloadTooLarge(
            f"{field}: {what} is {size} bytes of UTF-8; the limit is {limit} bytes.",
            field=field,
        )


def has_pieces(subtask: Subtask) -> bool:
    """Whether the turn's partial answer goes on in pieces (judged from the row alone)."""
    return subtask.partial_text_chars > len(subtask.partial_text)


def partial_text_of(subtask: Subtask) -> str:
    """The turn's whole partial answer: its row's text and its attempt's pieces (a query only
    when there are pieces)."""
    if not has_pieces(subtask):
        return subtask.partial_text
    pieces = (
        ProgressPiece.objects.filter(subtask_id=subtask.pk, attempt=subtask.attempts)
        .order_by("offset")
        .values_list("text", flat=True)
    )
    return subtask.partial_text + "".join(pieces)


def show_partial_texts(turns: Sequence[Subtask]) -> None:
    """Set each turn's `partial_text` (in memory) to its whole partial answer, for a view: one
    query for all the turns that have pieces, none when no turn has."""
    pieced = {turn.pk: turn for turn in turns if has_pieces(turn)}
    if not pieced:
        return
    texts: dict[int, list[str]] = {}
    rows = ProgressPiece.objects.filter(subtask_id__in=list(pieced)).order_by(
        "subtask_id", "offset"
    )
    for subtask_id, attempt, text in rows.values_list("subtask_id", "attempt", "text"):
        if attempt == pieced[subtask_id].attempts:
            texts.setdefault(subtask_id, []).append(text)
    for subtask_id, turn in pieced.items():
        turn.partial_text = turn.partial_text + "".join(texts.get(subtask_id, []))


def end_attempts(*, turns: Sequence[Subtask]) -> None:
    """The turns' attempts ended: fold each one's pieces into its row (one write of the whole
    text), delete its pieces and its `turn.progress` events. Runs in the transaction that ends
    them; `turns` are read under the task's lock (their in-memory `partial_text` is set too).
    Costs nothing for turns that never had progress."""
    by_id = {turn.pk: turn for turn in turns if turn.progress_updated_at is not None}
    if not by_id:
        return
    rows = list(
        ProgressPiece.objects.filter(subtask_id__in=list(by_id))
        .order_by("subtask_id", "offset")
        .values_list("subtask_id", "attempt", "text")
    )
    texts: dict[int, list[str]] = {}
    for subtask_id, attempt, text in rows:
        if attempt == by_id[subtask_id].attempts:
            texts.setdefault(subtask_id, []).append(text)
    for subtask_id, pieces in texts.items():
        added = "".join(pieces)
        Subtask.objects.filter(pk=subtask_id).update(
            partial_text=Concat(F("partial_text"), Value(added), output_field=TextField())
        )
        by_id[subtask_id].partial_text += added
    if rows:
        ProgressPiece.objects.filter(subtask_id__in=list(by_id)).delete()
    task_events.prune_progress(turns=list(by_id.values()))


def discard_attempts(*, turns: Sequence[Subtask]) -> None:
    """The turns go back to the queue: drop what their ended attempts wrote (the row's partial
    answer, its pieces, its progress events), so that the next attempt shows and extends only
    its own text. Runs in the transaction that requeues them; sets the in-memory rows too.
    Costs nothing for turns that never had progress."""
    by_id = {turn.pk: turn for turn in turns if turn.progress_updated_at is not None}
    if not by_id:
        return
    cleared: dict[str, object] = {
        "partial_text": "",
        "partial_text_chars": 0,
        "partial_text_bytes": 0,
        "progress_events": None,
        "progress_updated_at": None,
    }
    ProgressPiece.objects.filter(subtask_id__in=list(by_id)).delete()
    Subtask.objects.filter(pk__in=list(by_id)).update(**cleared)
    for turn in by_id.values():
        for name, value in cleared.items():
            setattr(turn, name, value)
    task_events.prune_progress(turns=list(by_id.values()))
