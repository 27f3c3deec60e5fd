"""JSON skeletons: a cut of a JSON text that is itself valid JSON.

Objects keep every key they can (values that do not fit are cut inside, or become
``"…N chars truncated…"``), arrays keep their first elements and then one
``"…N chars truncated…"`` element for the rest, members that do not fit at all become one
``"…N chars truncated…": null`` member, and long strings keep their two ends. Every kept
character is the original's and every marker's N is exact
(:class:`~backend.prompting.truncate.Preview`). Text that does not scan as JSON, or longer than
``JSON_SKELETON_MAX_CHARS``, has no skeleton (its cut is the line preview, ``previews``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from backend.prompting.truncate import ElisionStyle, Preview, preview_from_slices

JSON_SKELETON_MAX_CHARS = 8_000_000


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
