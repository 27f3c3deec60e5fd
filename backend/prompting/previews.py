"""Kind-aware cuts: within the same budget, a cut text keeps the evidence of its kind.

Every cut a prompt makes goes through here: the preview ingestion stores for a spilled text
(:func:`make_kind_preview`), and each cut of a first message, a Current Message, a Previous
Result, a history turn, a resume prompt's turns or a summary's input (:func:`cut_preview` of a
whole text, :func:`recut_preview` of a stored preview). A cut keeps verbatim slices of the
original and marks every place where something was left out with Codex's marker, so every kept
character is the original's and every marker's N is exact
(:class:`~backend.prompting.truncate.Preview`). The budget is ``head_chars + tail_chars`` kept
code points, markers not counted. What is kept depends on the kind
(:mod:`~backend.prompting.kinds`):

* ``json`` — a skeleton that is itself valid JSON (:mod:`~backend.prompting.json_skeleton`).
  Text that does not scan as JSON, or a stored preview cut again, gets the line preview.
* ``command_output``, ``text`` and ``web_or_search`` — the first and last lines within a
  quarter of the budget each, then, within half the budget, the evidence lines of the middle
  (:mod:`~backend.prompting.evidence`: errors, tracebacks, exit codes; URLs and titles), in the
  evidence's own order — the longest prefix of it that fits, so a larger budget keeps every
  evidence line a smaller one kept. What the evidence leaves goes back to the head and the
  tail, never past an evidence line the budget could not take (so no budget keeps one by luck
  that a larger budget drops). Without evidence in the middle: the line preview.
* ``file_or_code`` (and any text without evidence) — head and tail cut on line boundaries:
  when a line break lies within the last quarter of the head's budget (or the first quarter of
  the tail's), the cut moves there, so each marker stands on a line of its own. Text with no
  such line break is cut like :func:`~backend.prompting.truncate.make_preview`.

A text longer than ``PREVIEW_SCAN_MAX_CHARS`` is never scanned whole: its preview reads only its
two ends, half that bound each (:class:`TextEnds`, :func:`ends_to_read`). Its head and tail are
the same as if the whole text were read; evidence lines are looked for within the two ends only,
and a JSON text gets the line preview. So a text stored as a stream, which ingestion never holds
whole, gets the preview its text would get (:func:`make_ends_preview`), and the cost of a
preview has a bound. A stored preview cut again is read the same way: only its kept parts are
known, and evidence is looked for within them.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.prompting.evidence import EvidenceLine, evidence_lines, has_evidence
from backend.prompting.json_skeleton import JSON_SKELETON_MAX_CHARS, json_skeleton, skeleton_walk
from backend.prompting.kinds import ArtifactKind, classify_text
from backend.prompting.truncate import Preview, make_preview, preview_from_slices

__all__ = [
    "JSON_SKELETON_MAX_CHARS",
    "PREVIEW_SCAN_MAX_CHARS",
    "TextEnds",
    "cut_preview",
    "ends_to_read",
    "json_skeleton",
    "make_ends_preview",
    "make_kind_preview",
    "recut_preview",
    "skeleton_walk",
]

PREVIEW_SCAN_MAX_CHARS = JSON_SKELETON_MAX_CHARS
_EVIDENCE_SHARE = 2  # evidence lines get at most 1 / _EVIDENCE_SHARE of the budget
_LINE_SNAP_SHARE = 4  # a cut moves to a line break within 1 / _LINE_SNAP_SHARE of its budget
_BRIDGE_CHARS = 24  # evidence spans this close together are kept as one


@dataclass(frozen=True)
class TextEnds:
    """A text known by its two ends only: ``head`` is its first ``len(head)`` code points,
    ``tail`` its last ``len(tail)``, and ``length`` its length; what lies between is not known
    (the two ends do not meet)."""

    head: str
    tail: str
    length: int

    def __post_init__(self) -> None:
        if len(self.head) + len(self.tail) >= self.length:
            raise ValueError("the ends of a TextEnds must leave a middle out")

    @classmethod
    def of(cls, text: str, chars: int) -> TextEnds:
        """The first and last ``chars`` code points of ``text``."""
        return cls(head=text[:chars], tail=text[len(text) - chars :], length=len(text))


def ends_to_read(length: int, *, head_chars: int, tail_chars: int) -> int | None:
    """How many code points of each end the preview of a text of ``length`` reads, or None when
    it reads the whole text: a text longer than ``PREVIEW_SCAN_MAX_CHARS`` is read at its two
    ends, half that bound each (more when the preview's own budget is larger)."""
    each = max(PREVIEW_SCAN_MAX_CHARS // 2, head_chars + tail_chars + 1)
    return each if length > 2 * each else None


def make_kind_preview(text: str, kind: str, *, head_chars: int, tail_chars: int) -> Preview:
    """The preview ingestion stores for ``text`` of ``kind`` (see the module docstring)."""
    budget = head_chars + tail_chars
    if len(text) <= budget:
        return make_preview(text, head_chars=head_chars, tail_chars=tail_chars)
    each = ends_to_read(len(text), head_chars=head_chars, tail_chars=tail_chars)
    if each is not None:
        return make_ends_preview(
            TextEnds.of(text, each), kind, head_chars=head_chars, tail_chars=tail_chars
        )
    if kind == ArtifactKind.JSON:
        skeleton = json_skeleton(text, budget)
        if skeleton is not None:
            return skeleton
    return _read_preview(_Known.whole(text), kind, head_chars, tail_chars)


def make_ends_preview(ends: TextEnds, kind: str, *, head_chars: int, tail_chars: int) -> Preview:
    """The preview of a text known by its ends (see the module docstring): what
    ``make_kind_preview`` stores for the whole text when it reads ``len(ends.head)`` code
    points of each end (:func:`ends_to_read`)."""
    if min(len(ends.head), len(ends.tail)) <= head_chars + tail_chars:
        raise ValueError("each end must be longer than the preview's budget")
    return _read_preview(_Known.of_ends(ends), kind, head_chars, tail_chars)


def cut_preview(text: str, cap: int | None, kind: str | None = None) -> Preview | None:
    """``text`` cut to at most ``cap`` kept code points the way its kind needs, or None when it
    fits. ``kind`` is the stored text's kind when known, else the text is classified."""
    if cap is None or len(text) <= cap:
        return None
    if cap == 0:
        return Preview(head="", tail="", total_chars=len(text))
    head = cap // 2
    return make_kind_preview(
        text, kind or classify_text(text), head_chars=head, tail_chars=cap - head
    )


def recut_preview(preview: Preview, cap: int | None, kind: str) -> Preview:
    """A stored preview cut again to at most ``cap`` kept code points: its evidence first, as
    :func:`cut_preview` would keep it of the parts the preview kept. A JSON skeleton is cut
    from its two ends (a skeleton of a skeleton could not count its markers exactly)."""
    if cap is None or preview.kept_chars <= cap:
        return preview
    if kind == ArtifactKind.JSON or cap == 0:
        return preview.recut(cap)
    head = cap // 2
    return _read_preview(_Known.of_preview(preview), kind, head, cap - head)


def _read_preview(known: _Known, kind: str, head_chars: int, tail_chars: int) -> Preview:
    if has_evidence(kind):
        return _evidence_preview(known, head_chars, tail_chars, kind)
    return _line_preview(known, head_chars, tail_chars)


@dataclass(frozen=True)
class _Known:
    """What a cut reads of its text: verbatim ``slices`` (``(offset, text)``, in order, the
    first at 0 and the last ending at ``length``) — the whole text, its two ends, or a stored
    preview's parts. Positions are the text's own. ``head`` is the first slice and ``tail`` the
    last (the same one for a whole text); a cut's head lies within ``head`` and its tail within
    ``tail``, and evidence is looked for within the slices."""

    slices: tuple[tuple[int, str], ...]
    length: int

    @classmethod
    def whole(cls, text: str) -> _Known:
        return cls(((0, text),), len(text))

    @classmethod
    def of_ends(cls, ends: TextEnds) -> _Known:
        return cls(((0, ends.head), (ends.length - len(ends.tail), ends.tail)), ends.length)

    @classmethod
    def of_preview(cls, preview: Preview) -> _Known:
        slices = preview.slices()
        if not slices or slices[0][0] != 0:
            slices.insert(0, (0, ""))
        if len(slices) == 1 or slices[-1][0] + len(slices[-1][1]) != preview.total_chars:
            slices.append((preview.total_chars, ""))
        return cls(tuple(slices), preview.total_chars)

    @property
    def head(self) -> str:
        return self.slices[0][1]

    @property
    def tail(self) -> str:
        return self.slices[-1][1]

    @property
    def tail_offset(self) -> int:
        return self.slices[-1][0]

    def head_end(self, budget: int, snap_share: int = _LINE_SNAP_SHARE) -> int:
        return _head_end(self.head, 0, budget, snap_share)

    def tail_start(self, budget: int, snap_share: int = _LINE_SNAP_SHARE) -> int:
        offset = self.tail_offset
        return offset + _tail_start(self.tail, len(self.tail), budget, snap_share)

    def holds(self, start: int, end: int) -> bool:
        """Whether ``[start, end)`` lies within one known slice."""
        return any(offset <= start and end <= offset + len(text) for offset, text in self.slices)

    def slice(self, start: int, end: int) -> str:
        for offset, text in self.slices:
            if offset <= start and end <= offset + len(text):
                return text[start - offset : end - offset]
        raise AssertionError("a cut never keeps what lies between the known parts")

    def evidence(self, start: int, end: int, kind: str) -> list[EvidenceLine]:
        """The evidence lines of the known slices, each clipped to ``[start, end)`` (those
        wholly outside it left out), in the order a cut takes them.

        Lines are found in each whole slice, never in the region alone: a line (a traceback
        with its frames) the head grew into is the same line, only less of it is left to take,
        so a larger budget, which leaves a smaller region, never costs a line more."""
        found: list[tuple[int, int, EvidenceLine]] = []
        for offset, text in self.slices:
            for line in evidence_lines(text, 0, len(text), kind):
                clipped_start = max(line.start + offset, start)
                clipped_end = min(line.end + offset, end)
                if clipped_start < clipped_end:
                    clipped = EvidenceLine(clipped_start, clipped_end, line.tier)
                    found.append((line.tier, line.start + offset, clipped))
        return [line for _, _, line in sorted(found, key=lambda item: item[:2])]


# --- line-bounded head and tail -------------------------------------------------------------


def _head_end(text: str, start: int, budget: int, snap_share: int = _LINE_SNAP_SHARE) -> int:
    """Where a head of ``budget`` code points from ``start`` ends: after a line break when one
    lies in its last ``1 / snap_share``, else exactly at the budget."""
    end = min(start + budget, len(text))
    if end == len(text):
        return end
    floor = end - max(budget // snap_share, 1)
    newline = text.rfind("\n", max(floor, start), end)
    return newline + 1 if newline != -1 else end


def _tail_start(text: str, end: int, budget: int, snap_share: int = _LINE_SNAP_SHARE) -> int:
    """Where a tail of ``budget`` code points before ``end`` starts: at a line break (kept,
    so the marker ends its line) when one lies in its first ``1 / snap_share``, else exactly
    there."""
    start = max(end - budget, 0)
    if start == 0 or budget == 0:
        return end if budget == 0 else start
    ceiling = start + max(budget // snap_share, 1)
    newline = text.find("\n", start, min(ceiling, end))
    return newline if newline != -1 else start


def _line_preview(known: _Known, head_chars: int, tail_chars: int) -> Preview:
    head_end = known.head_end(head_chars)
    tail_start = max(known.tail_start(tail_chars), head_end)
    return preview_from_slices(
        [(0, known.slice(0, head_end)), (tail_start, known.slice(tail_start, known.length))],
        known.length,
    )


# --- evidence lines -------------------------------------------------------------------------


def _take_evidence(
    candidates: list[EvidenceLine], budget: int
) -> tuple[list[tuple[int, int]], list[EvidenceLine]]:
    """The longest prefix of ``candidates`` whose sizes fit ``budget`` (a line is charged its
    whole span, overlaps with its neighbours not discounted, so what one line costs never
    depends on which others are kept), as merged spans in text order; and the rest."""
    used = 0
    taken = 0
    for line in candidates:
        if used + line.size > budget:
            break
        used += line.size
        taken += 1
    spans: list[tuple[int, int]] = []
    for line in sorted(candidates[:taken], key=lambda line: line.start):
        if spans and line.start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], line.end))
        else:
            spans.append((line.start, line.end))
    return spans, candidates[taken:]


def _evidence_preview(known: _Known, head_chars: int, tail_chars: int, kind: str) -> Preview:
    budget = head_chars + tail_chars
    length = known.length
    # First the first and last whole lines within a quarter of the budget each, then evidence.
    head_end = known.head_end(head_chars // 2, snap_share=1)
    tail_start = max(known.tail_start(tail_chars // 2, snap_share=1), head_end)
    candidates = known.evidence(head_end, tail_start, kind)
    if not candidates:
        return _line_preview(known, head_chars, tail_chars)
    spans, left = _take_evidence(candidates, budget // _EVIDENCE_SHARE)
    # What the evidence did not use goes back to the head and tail; neither grows past a kept
    # span, nor over an evidence line left out (a smaller budget must not keep it by luck).
    # (An evidence span opens and closes with line breaks; the head may keep the one that opens
    # a line left out, and the tail the one that closes it: they are no part of the line.)
    head_limit = min([s for s, _ in spans] + [_after_break(known, line) for line in left])
    head_limit = min(head_limit, tail_start)
    tail_limit = max([e for _, e in spans] + [_before_break(known, line) for line in left])
    tail_limit = max(tail_limit, head_end)
    spare = budget - (head_end + (length - tail_start) + sum(e - s for s, e in spans))
    spans, spare = _bridge(known, spans, left, spare)
    # A gap too small to be worth a marker is kept (never across what is not known).
    head_room = min(head_limit, len(known.head))
    if head_room - head_end <= min(_BRIDGE_CHARS, spare):
        spare -= head_room - head_end
        head_end = head_room
    tail_room = max(tail_limit, known.tail_offset, head_end)
    if tail_start - tail_room <= min(_BRIDGE_CHARS, spare):
        spare -= tail_start - tail_room
        tail_start = tail_room
    grown = known.head_end(head_end + spare // 2, snap_share=1)
    grown = min(max(grown, head_end), head_limit)
    spare -= grown - head_end
    head_end = grown
    grown = known.tail_start(length - tail_start + spare, snap_share=1)
    tail_start = max(min(grown, tail_start), tail_limit, head_end)
    slices = [(0, known.slice(0, head_end))]
    slices += [(s, known.slice(s, e)) for s, e in spans]
    slices.append((tail_start, known.slice(tail_start, length)))
    return preview_from_slices(slices, length)


def _after_break(known: _Known, line: EvidenceLine) -> int:
    """Where a line left out starts, past the line break that opens its span."""
    return line.start + 1 if known.slice(line.start, line.start + 1) == "\n" else line.start


def _before_break(known: _Known, line: EvidenceLine) -> int:
    """Where a line left out ends, before the line break that closes its span."""
    return line.end - 1 if known.slice(line.end - 1, line.end) == "\n" else line.end


def _bridge(
    known: _Known, spans: list[tuple[int, int]], left: list[EvidenceLine], spare: int
) -> tuple[list[tuple[int, int]], int]:
    """Kept spans a few code points apart joined (a marker would cost as much as the text it
    hides), from what the budget has spare, unless the gap holds an evidence line left out or
    is not known."""
    joined: list[tuple[int, int]] = []
    for span in spans:
        if joined:
            gap = span[0] - joined[-1][1]
            holds_left = any(joined[-1][1] <= line.start < span[0] for line in left)
            if (
                gap <= min(_BRIDGE_CHARS, spare)
                and not holds_left
                and known.holds(joined[-1][0], span[1])
            ):
                joined[-1] = (joined[-1][0], span[1])
                spare -= gap
                continue
        joined.append(span)
    return joined, spare
