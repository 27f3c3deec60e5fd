"""Kind-aware previews: within the same budget, a spilled text keeps the evidence of its kind.

A preview keeps verbatim slices of the original and marks every place where something was
left out with Codex's marker, so every kept character is the original's and every marker's N
is exact (:class:`~backend.prompting.truncate.Preview`). What is kept depends on the kind
(:mod:`backend.prompting.kinds`); the budget is always ``head_chars + tail_chars`` kept code
points, markers not counted:

* ``json`` — a skeleton that is itself valid JSON: objects keep every key they can (values
  that do not fit are cut inside, or become ``"…N chars truncated…"``), arrays keep their first
  elements and then one ``"…N chars truncated…"`` element for the rest, members that do not fit
  at all become one ``"…N chars truncated…": null`` member, and long strings keep their two
  ends. Text that does not scan as JSON, or longer than ``JSON_SKELETON_MAX_CHARS``, gets the
  line preview.
* ``command_output`` — the first and last lines (the command line, the exit code and the test
  summary are usually there) and, in between, the lines that carry evidence: shell prompt
  lines, errors, failures, tracebacks, exit codes. Up to half the budget goes to them.
* ``web_or_search`` — the same with lines that hold a URL or a title (a Markdown heading, a
  ``Title:`` line, an HTML ``<title>``/``<h1>``–``<h3>``); for HTML on long lines, the tags
  themselves.
* ``file_or_code`` and ``text`` (logs) — head and tail cut on line boundaries: when a line
  break lies within the last quarter of the head's budget (or the first quarter of the tail's),
  the cut moves there, so each marker stands on a line of its own. Text with no such line
  break is cut like :func:`~backend.prompting.truncate.make_preview`.

A line that carries evidence is kept with the line breaks around it, so each marker stands on a
line of its own; a line longer than ``EVIDENCE_LINE_MAX_CHARS`` keeps only the match, and
evidence spans at most ``_BRIDGE_CHARS`` apart are kept as one (with what lies between).

A text longer than ``PREVIEW_SCAN_MAX_CHARS`` is never scanned whole: its preview reads only its
two ends, half that bound each (:class:`TextEnds`, :func:`ends_to_read`). Its head and tail are
the same as if the whole text were read; evidence lines are looked for within the two ends only,
and a JSON text gets the line preview (a skeleton needs the whole text, and the skeleton's own
bound is the same). So a text stored as a stream, which ingestion never holds whole, gets the
preview its text would get (:func:`make_ends_preview`), and the cost of a preview has a bound.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from backend.prompting.kinds import ArtifactKind
from backend.prompting.truncate import (
    ElisionStyle,
    Preview,
    make_preview,
    preview_from_slices,
)

JSON_SKELETON_MAX_CHARS = 8_000_000
PREVIEW_SCAN_MAX_CHARS = JSON_SKELETON_MAX_CHARS
EVIDENCE_LINE_MAX_CHARS = 400
_EVIDENCE_SHARE = 2  # evidence lines get at most 1 / _EVIDENCE_SHARE of the budget
_LINE_SNAP_SHARE = 4  # a cut moves to a line break within 1 / _LINE_SNAP_SHARE of its budget
_BRIDGE_CHARS = 24  # evidence spans this close together are kept as one


def _word_alternatives(words: tuple[str, ...]) -> str:
    """``words`` in lower, Capitalized and UPPER case, grouped by their first character.

    A pattern whose every branch starts with a plain character lets the regex engine skip
    ahead quickly: a 50 MB log is scanned in a fraction of a second, where ``\\b`` and
    IGNORECASE made the same scan take seconds."""
    rests: dict[str, set[str]] = {}
    for word in words:
        for variant in (word, word.capitalize(), word.upper()):
            rests.setdefault(variant[0], set()).add(re.escape(variant[1:]))
    return "|".join(
        f"{re.escape(first)}(?:{'|'.join(sorted(rest, key=len, reverse=True))})"
        for first, rest in sorted(rests.items())
    )


_EVIDENCE_WORDS = (
    "error",
    "exception",
    "exit code",
    "exit status",
    "exited with",
    "fail",
    "fatal",
    "traceback",
    "panic",
    "assert",
)
_COMMAND_EVIDENCE = re.compile(r"\n[ \t]*[$#>] \S|" + _word_alternatives(_EVIDENCE_WORDS))
_WEB_EVIDENCE = re.compile(r"https?://|<(?i:title|h[1-3]|a)\b|\n[ \t]*(?:#{1,6} |(?i:title:))")
_WEB_SPAN = re.compile(
    r"https?://\S+|<title[\s>][^<]{0,300}</title>|<h[1-3][\s>][^<]{0,300}</h[1-3]>"
    r"|<a\s[^>]{0,300}href=[^>]{0,300}>",
    re.IGNORECASE,
)


def _command_evidence(text: str, match: re.Match[str]) -> tuple[int, int] | None:
    """A shell prompt line, or an evidence word that starts a word."""
    start = match.start()
    if text[start] == "\n":
        return start + 1, match.end()
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        return None
    return match.span()


def _web_evidence(text: str, match: re.Match[str]) -> tuple[int, int] | None:
    """A URL, a title or heading line, or an HTML title, heading or link tag."""
    start = match.start()
    if text[start] == "\n":
        return start + 1, match.end()
    whole = _WEB_SPAN.match(text, start)
    return whole.span() if whole is not None else None


_Confirm = Callable[[str, re.Match[str]], "tuple[int, int] | None"]


@dataclass(frozen=True)
class _Evidence:
    """Where a kind's evidence is: a fast search for candidates, and the check that confirms
    one (the span it covers) or rejects it (None)."""

    candidates: re.Pattern[str]
    confirm: _Confirm


_COMMAND = _Evidence(_COMMAND_EVIDENCE, _command_evidence)
_WEB = _Evidence(_WEB_EVIDENCE, _web_evidence)


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


def _read_preview(known: _Known, kind: str, head_chars: int, tail_chars: int) -> Preview:
    if kind == ArtifactKind.COMMAND_OUTPUT:
        return _evidence_preview(known, head_chars, tail_chars, _COMMAND)
    if kind == ArtifactKind.WEB_OR_SEARCH:
        return _evidence_preview(known, head_chars, tail_chars, _WEB)
    return _line_preview(known, head_chars, tail_chars)


@dataclass(frozen=True)
class _Known:
    """What a preview reads of its text: the whole text, or its two ends. Positions are the
    text's own; ``head`` is ``text[:len(head)]`` and ``tail`` is ``text[tail_offset:]``. A
    whole text is its own head and tail. Every cut a preview makes lies within ``head`` or
    within ``tail`` (the budget is shorter than either end)."""

    head: str
    tail: str
    length: int

    @classmethod
    def whole(cls, text: str) -> _Known:
        return cls(head=text, tail=text, length=len(text))

    @classmethod
    def of_ends(cls, ends: TextEnds) -> _Known:
        return cls(head=ends.head, tail=ends.tail, length=ends.length)

    @property
    def tail_offset(self) -> int:
        return self.length - len(self.tail)

    def head_end(self, budget: int, snap_share: int = _LINE_SNAP_SHARE) -> int:
        return _head_end(self.head, 0, budget, snap_share)

    def tail_start(self, budget: int, snap_share: int = _LINE_SNAP_SHARE) -> int:
        offset = self.tail_offset
        return offset + _tail_start(self.tail, len(self.tail), budget, snap_share)

    def slice(self, start: int, end: int) -> str:
        if end <= len(self.head):
            return self.head[start:end]
        offset = self.tail_offset
        assert start >= offset, "a preview never keeps what lies between the known ends"
        return self.tail[start - offset : end - offset]

    def evidence_spans(
        self, start: int, end: int, evidence: _Evidence, budget: int
    ) -> list[tuple[int, int]]:
        """`_evidence_spans` over ``[start, end)``; of a text known by its ends, over the
        whole lines within each end, first the head's, then the tail's."""
        if self.tail_offset == 0:
            return _evidence_spans(self.head, start, end, evidence, budget)
        head_lines_end = self.head.rfind("\n") + 1  # 0: no whole line in the head
        spans = _evidence_spans(self.head, start, min(end, head_lines_end), evidence, budget)
        offset = self.tail_offset
        first_break = self.tail.find("\n")
        if first_break == -1:
            return spans  # no whole line in the tail
        budget -= sum(span_end - span_start for span_start, span_end in spans)
        tail_spans = _evidence_spans(
            self.tail, max(start - offset, first_break), end - offset, evidence, budget
        )
        return spans + [(s + offset, e + offset) for s, e in tail_spans]


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


def _evidence_spans(
    text: str,
    start: int,
    end: int,
    evidence: _Evidence,
    budget: int,
) -> list[tuple[int, int]]:
    """The lines (each with the line break before it) in ``[start, end)`` that match
    the evidence, first come first kept, within ``budget`` code points."""
    spans: list[tuple[int, int]] = []
    used = 0
    position = start
    while position < end and used < budget:
        # From the line break before the region, so a prompt on its first line is found.
        match = evidence.candidates.search(text, max(position - 1, 0), end)
        if match is None:
            break
        found = evidence.confirm(text, match)
        if found is None:
            position = match.end()
            continue
        line_start = text.rfind("\n", start, found[0] + 1)
        line_start = start if line_start == -1 else line_start
        line_end = text.find("\n", found[1], end)
        line_end = end if line_end == -1 else line_end + 1
        span = (line_start, line_end)
        if line_end - line_start > EVIDENCE_LINE_MAX_CHARS:
            span = found
        if spans and span[0] - spans[-1][1] <= _BRIDGE_CHARS:
            # Joined to the previous span: a marker would cost as much as the text it hides.
            span = (spans[-1][0], span[1])
            cost = span[1] - spans[-1][1]
            if cost <= budget - used:
                spans[-1] = span
                used += cost
        elif span[1] - span[0] <= budget - used:
            spans.append(span)
            used += span[1] - span[0]
        position = max(span[1], found[1], position + 1)
    return spans


def _evidence_preview(
    known: _Known, head_chars: int, tail_chars: int, evidence: _Evidence
) -> Preview:
    budget = head_chars + tail_chars
    evidence_budget = budget // _EVIDENCE_SHARE
    length = known.length
    # First the first and last whole lines within a quarter of the budget each, then evidence.
    head_end = known.head_end(head_chars // 2, snap_share=1)
    tail_start = max(known.tail_start(tail_chars // 2, snap_share=1), head_end)
    spans = known.evidence_spans(head_end, tail_start, evidence, evidence_budget)
    if not spans:
        return _line_preview(known, head_chars, tail_chars)
    spare = budget - (head_end + (length - tail_start) + sum(e - s for s, e in spans))
    # What the evidence did not use goes back to the head and tail, never past the evidence;
    # a gap too small to be worth a marker is kept.
    if spans[0][0] - head_end <= min(_BRIDGE_CHARS, spare):
        spare -= spans[0][0] - head_end
        head_end = spans[0][0]
    if tail_start - spans[-1][1] <= min(_BRIDGE_CHARS, spare):
        spare -= tail_start - spans[-1][1]
        tail_start = spans[-1][1]
    grown = known.head_end(head_end + spare // 2, snap_share=1)
    grown = min(max(grown, head_end), spans[0][0])
    spare -= grown - head_end
    head_end = grown
    grown = known.tail_start(length - tail_start + spare, snap_share=1)
    tail_start = max(min(grown, tail_start), spans[-1][1])
    slices = [(0, known.slice(0, head_end))]
    slices += [(s, known.slice(s, e)) for s, e in spans]
    slices.append((tail_start, known.slice(tail_start, length)))
    preview = preview_from_slices(slices, length)
    while preview.kept_chars > budget:  # the snapped cuts may overshoot by a line's length
        preview = preview.recut(budget)
    return preview


# --- JSON skeletons -------------------------------------------------------------------------

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
# Everything up to and including the next bracket outside a string, in one match (possessive,
# so a text that is not JSON never makes it backtrack).
_TO_BRACKET = re.compile(r'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+[\[\]{}]')
_MIN_STRING_CUT = 24
"""A string cut keeps its quotes and at least this many code points between them."""
_MIN_RECURSE = 40
"""Below this many code points, a container that does not fit becomes one marker."""
_SMALL_VALUE = 120
"""What later members of an object are assumed to need when budgeting an earlier one."""


class _NotJson(Exception):
    pass


def _skip_whitespace(text: str, position: int) -> int:
    match = _WHITESPACE.match(text, position)
    assert match is not None
    return match.end()


def _value_end(text: str, position: int) -> int:
    """Where the JSON value starting at ``position`` ends (brackets are matched, not parsed)."""
    first = text[position : position + 1]
    if first == '"':
        match = _STRING.match(text, position)
        if match is None:
            raise _NotJson
        return match.end()
    if first in ("[", "{"):
        depth = 0
        for match in _TO_BRACKET.finditer(text, position):
            depth += 1 if text[match.end() - 1] in "[{" else -1
            if depth == 0:
                return match.end()
        raise _NotJson
    match = _SCALAR.match(text, position)
    if match is None:
        raise _NotJson
    return match.end()


def _content_end(text: str, container_end: int) -> int:
    """The end of a container's last element (before the whitespace and its closing bracket)."""
    position = container_end - 1
    while position > 0 and text[position - 1] in " \t\n\r":
        position -= 1
    return position


@dataclass
class _Skeleton:
    """A walk over a JSON text that decides, within a budget, which ranges are left out."""

    text: str
    elided: list[tuple[int, int, ElisionStyle]] = field(default_factory=list)

    def value(self, start: int, end: int, budget: int) -> int:
        """Keep what fits of the value at ``[start, end)``; returns the code points kept."""
        if end - start <= budget:
            return end - start
        first = self.text[start]
        if first == "{" and budget >= _MIN_RECURSE:
            return self._object(start, end, budget)
        if first == "[" and budget >= _MIN_RECURSE:
            return self._array(start, end, budget)
        if first == '"' and budget >= _MIN_STRING_CUT:
            return self._string(start, end, budget)
        self.elided.append((start, end, ElisionStyle.JSON_VALUE))
        return 0

    def _string(self, start: int, end: int, budget: int) -> int:
        inner = budget - 2
        cut_from = _escape_safe(self.text, start + 1 + inner // 2, start + 1)
        cut_to = _escape_safe(self.text, end - 1 - (inner - inner // 2), start + 1)
        self.elided.append((cut_from, max(cut_to, cut_from + 1), ElisionStyle.PLAIN))
        return (cut_from - start) + (end - max(cut_to, cut_from + 1))

    def _members(self, start: int, end: int) -> Iterator[tuple[int, int, int]]:
        """Each member of the object at ``[start, end)``: (key start, value start, value end)."""
        position = _skip_whitespace(self.text, start + 1)
        while self.text[position] != "}":
            key = _STRING.match(self.text, position)
            if key is None:
                raise _NotJson
            colon = _skip_whitespace(self.text, key.end())
            if self.text[colon : colon + 1] != ":":
                raise _NotJson
            value_start = _skip_whitespace(self.text, colon + 1)
            value_end = _value_end(self.text, value_start)
            yield position, value_start, value_end
            position = _skip_whitespace(self.text, value_end)
            if self.text[position] == ",":
                position = _skip_whitespace(self.text, position + 1)
            if position >= end:
                raise _NotJson

    def _object(self, start: int, end: int, budget: int) -> int:
        members = list(self._members(start, end))
        if not members:
            return end - start
        # The brackets and the whitespace inside them are kept, and each kept member's comma.
        used = (members[0][0] - start) + (end - _content_end(self.text, end))
        needs = [
            (value_start - key) + min(value_end - value_start, _SMALL_VALUE)
            for key, value_start, value_end in members
        ]
        for index, (key, value_start, value_end) in enumerate(members):
            key_cost = value_start - key
            separator = members[index + 1][0] - value_end if index + 1 < len(members) else 0
            if used + key_cost + separator + 1 > budget:
                self.elided.append((key, _content_end(self.text, end), ElisionStyle.JSON_MEMBERS))
                return used
            room = budget - used - key_cost - separator
            share = max(room - sum(needs[index + 1 :]), min(room, 1))
            used += key_cost + separator + self.value(value_start, value_end, share)
        return used

    def _array(self, start: int, end: int, budget: int) -> int:
        content_end = _content_end(self.text, end)
        position = _skip_whitespace(self.text, start + 1)
        used = (position - start) + (end - content_end)
        kept_any = False
        while position < content_end:
            value_end = _value_end(self.text, position)
            after = _skip_whitespace(self.text, value_end)
            if self.text[after : after + 1] == ",":
                after = _skip_whitespace(self.text, after + 1)
            size = value_end - position
            room = budget - used
            if size + (after - value_end) <= room:
                used += after - position
                kept_any = True
                position = after
                continue
            if not kept_any and room >= _MIN_RECURSE:
                used += self.value(position, value_end, room - (after - value_end))
                used += after - value_end
                position = after
            if position < content_end:
                self.elided.append((position, content_end, ElisionStyle.JSON_VALUE))
            return used
        return used


def _escape_safe(text: str, position: int, floor: int) -> int:
    """``position`` moved back, no further than ``floor``, so it does not split an escape."""
    while position > floor:
        run = 0
        while position - run - 1 >= floor and text[position - run - 1] == "\\":
            run += 1
        if run % 2 == 1:
            position -= 1
            continue
        escape = text.rfind("\\u", max(floor, position - 5), position)
        if escape != -1 and position - escape < 6:
            position = escape
            continue
        return position
    return floor


def json_skeleton(text: str, budget: int) -> Preview | None:
    """A valid-JSON preview of ``text`` keeping at most ``budget`` code points, or None when the
    text does not scan as one JSON value or is too long to scan."""
    preview = skeleton_walk(text, budget)
    if preview is None:
        return None
    try:  # The walk keeps JSON valid; a skeleton that is not is never stored.
        json.loads(preview.text)
    except ValueError:
        return None
    return preview


def skeleton_walk(text: str, budget: int) -> Preview | None:
    """The skeleton's walk alone (:func:`json_skeleton` checks its output parses)."""
    if len(text) > JSON_SKELETON_MAX_CHARS or budget < _MIN_RECURSE:
        return None
    start = _skip_whitespace(text, 0)
    end = _content_end(text, len(text) + 1)
    # A container's end is its last character (not scanned for: the walk scans what it keeps,
    # and the kept skeleton is parsed); any other value must fit the budget whole.
    if (text[start : start + 1], text[end - 1 : end]) not in (("{", "}"), ("[", "]")):
        return None
    outside = start + (len(text) - end)
    for attempt in (budget, budget * 3 // 4, budget // 2):
        walk = _Skeleton(text)
        try:
            walk.value(start, end, attempt - outside)
        except (_NotJson, IndexError):
            return None
        preview = _preview_of(text, walk.elided)
        if preview.kept_chars <= budget:
            return preview
    return None


def _preview_of(text: str, elided: list[tuple[int, int, ElisionStyle]]) -> Preview:
    slices = []
    position = 0
    for start, end, _style in sorted(elided):
        slices.append((position, text[position:start]))
        position = end
    slices.append((position, text[position:]))
    styles = {(start, end): style for start, end, style in elided}
    return preview_from_slices(slices, len(text), styles)
