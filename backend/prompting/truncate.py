"""Head + tail truncation with an exact marker, in four units.

A cut keeps the beginning and the end of a text and replaces the middle with Codex's marker,
``…N chars truncated…`` or ``…N tokens truncated…``. For ``bytes`` and ``approx_tokens`` the
result is byte-for-byte what OpenAI Codex's ``truncate_text`` produces:

* the budget splits into ``left = budget // 2`` and ``right = budget - left`` (the odd unit goes
  to the tail);
* a code point joins the head only if it *ends* within the first ``left`` bytes, and the tail
  only if it *starts* within the last ``right`` bytes, so no code point is ever split;
* ``bytes`` mode counts removed code points in its marker; ``approx_tokens`` mode (4 bytes per
  token) reports ``ceil((total_bytes - 4 * limit) / 4)`` tokens;
* empty input stays empty, a zero budget leaves the marker alone, and the marker itself is not
  counted against the budget.

``chars`` and ``tokens`` follow the same half/half rule in their own unit and report the exact
number of code points (``chars``) or tokens (``tokens``) removed. In ``tokens`` mode a token
whose bytes straddle a code point at the cut is dropped whole, so no code point is split and the
count stays exact.

Ingestion's bounded previews are the same cut in ``chars``: :func:`make_preview` keeps a head and
a tail, and the rendered preview is ``head + …N chars truncated… + tail`` with N counted against
the original text, so re-cutting a preview later keeps N exact (:meth:`Preview.recut`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backend.prompting.units import (
    APPROX_BYTES_PER_TOKEN,
    DEFAULT_TOKEN_ENCODING,
    Unit,
    approx_token_count,
    load_encoding,
)

_CHARS_WORD = "chars"
_TOKENS_WORD = "tokens"


def truncation_marker(removed: int, word: str = _CHARS_WORD) -> str:
    """``…N chars truncated…`` (or ``tokens``)."""
    return f"…{removed} {word} truncated…"


@dataclass(frozen=True, slots=True)
class Truncation:
    """The outcome of one cut: the text to show and exactly what was removed."""

    text: str
    head: str
    tail: str
    truncated: bool
    removed: int
    """The number printed in the marker, in the marker's unit (0 when nothing was cut)."""
    removed_chars: int
    """Code points removed from the middle (0 when nothing was cut)."""
    marker_word: str = _CHARS_WORD

    @property
    def kept_chars(self) -> int:
        return len(self.head) + len(self.tail)

    @property
    def marker_spans(self) -> tuple[tuple[int, int], ...]:
        """Where the marker sits in ``text`` (empty when nothing was cut)."""
        if not self.truncated:
            return ()
        return ((len(self.head), len(self.text) - len(self.tail)),)


def _unchanged(text: str) -> Truncation:
    return Truncation(text=text, head=text, tail="", truncated=False, removed=0, removed_chars=0)


def _cut(head: str, tail: str, removed: int, removed_chars: int, word: str) -> Truncation:
    return Truncation(
        text=head + truncation_marker(removed, word) + tail,
        head=head,
        tail=tail,
        truncated=True,
        removed=removed,
        removed_chars=removed_chars,
        marker_word=word,
    )


def _split_budget(budget: int) -> tuple[int, int]:
    left = budget // 2
    return left, budget - left


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _split_utf8(data: bytes, left: int, right: int) -> tuple[int, int]:
    """Byte offsets ``(head_end, tail_start)`` on code point boundaries (Codex's rule)."""
    size = len(data)
    head_end = min(left, size)
    while head_end > 0 and head_end < size and _is_continuation(data[head_end]):
        head_end -= 1
    tail_start = max(size - right, 0)
    while tail_start < size and _is_continuation(data[tail_start]):
        tail_start += 1
    return head_end, max(tail_start, head_end)


def _truncate_bytes(text: str, max_bytes: int, *, tokens_marker: bool) -> Truncation:
    data = text.encode("utf-8", "surrogatepass")
    word = _TOKENS_WORD if tokens_marker else _CHARS_WORD
    if max_bytes == 0:
        removed = approx_token_count(len(data)) if tokens_marker else len(text)
        return _cut("", "", removed, len(text), word)
    if len(data) <= max_bytes:
        return _unchanged(text)
    left, right = _split_budget(max_bytes)
    head_end, tail_start = _split_utf8(data, left, right)
    head = data[:head_end].decode("utf-8", "surrogatepass")
    tail = data[tail_start:].decode("utf-8", "surrogatepass")
    removed_chars = len(text) - len(head) - len(tail)
    removed = approx_token_count(len(data) - max_bytes) if tokens_marker else removed_chars
    return _cut(head, tail, removed, removed_chars, word)


def _truncate_chars(text: str, limit: int) -> Truncation:
    if len(text) <= limit:
        return _unchanged(text)
    left, right = _split_budget(limit)
    head = text[:left]
    tail = text[len(text) - right :] if right else ""
    removed = len(text) - limit
    return _cut(head, tail, removed, removed, _CHARS_WORD)


def _truncate_tokens(text: str, limit: int, encoding_name: str) -> Truncation:
    encoding = load_encoding(encoding_name)
    tokens = encoding.encode_ordinary(text)
    if len(tokens) <= limit:
        return _unchanged(text)
    if limit == 0:
        return _cut("", "", len(tokens), len(text), _TOKENS_WORD)
    data = text.encode("utf-8", "surrogatepass")
    size = len(data)
    left, right = _split_budget(limit)

    head_count = left
    head_end = len(encoding.decode_bytes(tokens[:head_count]))
    while head_count and head_end < size and _is_continuation(data[head_end]):
        head_count -= 1
        head_end -= len(encoding.decode_single_token_bytes(tokens[head_count]))

    tail_count = right
    tail_start = size - len(encoding.decode_bytes(tokens[len(tokens) - tail_count :]))
    while tail_count and tail_start < size and _is_continuation(data[tail_start]):
        tail_start += len(encoding.decode_single_token_bytes(tokens[len(tokens) - tail_count]))
        tail_count -= 1

    head = data[:head_end].decode("utf-8", "surrogatepass")
    tail = data[tail_start:].decode("utf-8", "surrogatepass")
    removed = len(tokens) - head_count - tail_count
    return _cut(head, tail, removed, len(text) - len(head) - len(tail), _TOKENS_WORD)


def truncate_middle_with_count(
    text: str,
    limit: int,
    unit: Unit | str,
    *,
    encoding_name: str = DEFAULT_TOKEN_ENCODING,
) -> Truncation:
    """Cut the middle of ``text`` down to ``limit`` units; report exactly what was removed."""
    if limit < 0:
        raise ValueError("limit must be >= 0")
    if not text:
        return _unchanged(text)
    match Unit(unit):
        case Unit.CHARS:
            if limit == 0:
                return _cut("", "", len(text), len(text), _CHARS_WORD)
            return _truncate_chars(text, limit)
        case Unit.BYTES:
            return _truncate_bytes(text, limit, tokens_marker=False)
        case Unit.APPROX_TOKENS:
            return _truncate_bytes(text, limit * APPROX_BYTES_PER_TOKEN, tokens_marker=True)
        case Unit.TOKENS:
            return _truncate_tokens(text, limit, encoding_name)


def truncate_middle(
    text: str,
    limit: int,
    unit: Unit | str,
    *,
    encoding_name: str = DEFAULT_TOKEN_ENCODING,
) -> str:
    """``text`` cut to ``limit`` units as head + marker + tail (unchanged when it fits)."""
    return truncate_middle_with_count(text, limit, unit, encoding_name=encoding_name).text


def render_preview(head: str, tail: str, total_chars: int) -> str:
    """The preview text for a message of ``total_chars`` of which ``head`` and ``tail`` are kept."""
    removed = total_chars - len(head) - len(tail)
    if removed <= 0:
        return head + tail
    return head + truncation_marker(removed) + tail


class ElisionStyle(StrEnum):
    """How an elision's marker is written, so the kept text keeps its syntax."""

    PLAIN = "plain"
    """The bare marker: ``…N chars truncated…``."""
    JSON_VALUE = "json_value"
    """The marker as a JSON string, where a value (or array elements) was left out."""
    JSON_MEMBERS = "json_members"
    """The marker as a JSON object member, ``"…N chars truncated…": null``, where members were
    left out."""


@dataclass(frozen=True, slots=True)
class Elision:
    """``removed`` code points of the original left out at one place of a preview."""

    removed: int
    style: ElisionStyle = ElisionStyle.PLAIN

    def render(self) -> tuple[str, int]:
        """The text that stands for the elision, and where its marker starts in it."""
        marker = truncation_marker(self.removed)
        match self.style:
            case ElisionStyle.PLAIN:
                return marker, 0
            case ElisionStyle.JSON_VALUE:
                return f'"{marker}"', 1
            case ElisionStyle.JSON_MEMBERS:
                return f'"{marker}": null', 1


@dataclass(frozen=True, slots=True)
class Preview:
    """The bounded part of a long text that ingestion keeps (its full size included).

    The kept parts are verbatim slices of the original, in order: ``head``, then each of
    ``middle``, then ``tail``. Between two parts sits one elision. A plain head + tail preview
    has no ``middle`` and no ``elisions``: its one elision (if anything was removed) is plain
    and removes ``total_chars - kept``. A kind-aware preview (:mod:`backend.prompting.previews`)
    lists its ``elisions``, one more than its ``middle`` parts, each removing at least one code
    point, together exactly what the kept parts leave out.
    """

    head: str
    tail: str
    total_chars: int
    middle: tuple[str, ...] = ()
    elisions: tuple[Elision, ...] = ()

    def __post_init__(self) -> None:
        if not self.elisions:
            if self.middle:
                raise ValueError("a preview with middle parts lists its elisions")
            return
        if len(self.elisions) != len(self.middle) + 1:
            raise ValueError("a preview has one elision between each two kept parts")
        if any(elision.removed <= 0 for elision in self.elisions):
            raise ValueError("every elision removes at least one code point")
        if sum(elision.removed for elision in self.elisions) != self.removed_chars:
            raise ValueError("the elisions must remove exactly what the kept parts leave out")

    @property
    def parts(self) -> tuple[str, ...]:
        return (self.head, *self.middle, self.tail)

    @property
    def removed_chars(self) -> int:
        return self.total_chars - self.kept_chars

    @property
    def kept_chars(self) -> int:
        return len(self.head) + sum(len(part) for part in self.middle) + len(self.tail)

    def _elisions(self) -> tuple[Elision, ...]:
        if self.elisions:
            return self.elisions
        return (Elision(self.removed_chars),) if self.removed_chars > 0 else ()

    def _rendered(self) -> tuple[str, tuple[tuple[int, int], ...]]:
        elisions = self._elisions()
        if not elisions:
            return self.head + self.tail, ()
        pieces = [self.head]
        spans = []
        offset = len(self.head)
        for elision, part in zip(elisions, (*self.middle, self.tail), strict=True):
            text, start = elision.render()
            marker_length = len(truncation_marker(elision.removed))
            spans.append((offset + start, offset + start + marker_length))
            pieces += (text, part)
            offset += len(text) + len(part)
        return "".join(pieces), tuple(spans)

    @property
    def text(self) -> str:
        return self._rendered()[0]

    @property
    def marker_spans(self) -> tuple[tuple[int, int], ...]:
        """Where each marker sits in ``text`` (empty when the preview is the whole text)."""
        return self._rendered()[1]

    def layout(self) -> dict[str, list[Any]]:
        """What a stored turn keeps besides its head and tail: ``{}`` for a head + tail preview,
        else ``{"middle": [part, ...], "elisions": [[removed, style], ...]}``."""
        if not self.elisions:
            return {}
        return {
            "middle": list(self.middle),
            "elisions": [[elision.removed, elision.style.value] for elision in self.elisions],
        }

    @classmethod
    def stored(cls, head: str, tail: str, total_chars: int, layout: dict[str, Any]) -> Preview:
        """The preview a turn stored as its head, tail, size and :meth:`layout`."""
        return cls(
            head=head,
            tail=tail,
            total_chars=total_chars,
            **layout_fields(layout),
        )

    def slices(self) -> list[tuple[int, str]]:
        """The kept parts as ``(offset in the original, text)``, empty ones left out."""
        elisions = self._elisions()
        slices = []
        offset = 0
        for index, part in enumerate(self.parts):
            if part:
                slices.append((offset, part))
            offset += len(part)
            if index < len(elisions):
                offset += elisions[index].removed
        return slices

    def _styles(self) -> dict[tuple[int, int], ElisionStyle]:
        """Each explicit elision's style, keyed by the range of the original it removes."""
        styles = {}
        offset = 0
        for part, elision in zip(self.parts, self.elisions, strict=False):
            offset += len(part)
            styles[(offset, offset + elision.removed)] = elision.style
            offset += elision.removed
        return styles

    def recut(self, limit: int) -> Preview:
        """Keep at most ``limit`` code points, half from the start and half from the end.

        For a head + tail preview this matches ``truncate_middle(original, limit, "chars")``
        whenever the stored head and tail are at least half the limit each; the marker's N stays
        relative to the original text. A kind-aware preview spends each half on its parts in
        order from its own end, and what lies between becomes one plain elision (an elision
        kept whole between two kept parts keeps its style).
        """
        if self.kept_chars <= limit:
            return self
        left, right = _split_budget(limit)
        if not self.elisions:
            head = self.head[:left]
            tail = self.tail[max(len(self.tail) - right, 0) :] if right else ""
            return Preview(head=head, tail=tail, total_chars=self.total_chars)
        slices = self.slices()
        front: list[tuple[int, str]] = []
        budget = left
        for offset, text in slices:
            if budget <= 0:
                break
            front.append((offset, text[:budget]))
            budget -= len(front[-1][1])
        back: list[tuple[int, str]] = []
        budget = right
        for offset, text in reversed(slices):
            if budget <= 0:
                break
            kept = text[max(len(text) - budget, 0) :]
            back.append((offset + len(text) - len(kept), kept))
            budget -= len(kept)
        return preview_from_slices(front + back[::-1], self.total_chars, self._styles())


def layout_fields(layout: dict[str, Any]) -> dict[str, Any]:
    """A stored :meth:`Preview.layout` as the ``middle`` and ``elisions`` of a Preview."""
    return {
        "middle": tuple(layout.get("middle", ())),
        "elisions": tuple(
            Elision(removed, ElisionStyle(style)) for removed, style in layout.get("elisions", ())
        ),
    }


def preview_from_slices(
    slices: list[tuple[int, str]],
    total_chars: int,
    styles: dict[tuple[int, int], ElisionStyle] | None = None,
) -> Preview:
    """The preview that keeps ``slices`` (``(offset, text)`` of the original, in order, not
    overlapping) of a text of ``total_chars`` code points; each elision is plain unless
    ``styles`` names the range it removes. Touching slices merge."""
    styles = styles or {}
    merged: list[tuple[int, str]] = []
    for offset, text in slices:
        if not text:
            continue
        if merged and merged[-1][0] + len(merged[-1][1]) == offset:
            merged[-1] = (merged[-1][0], merged[-1][1] + text)
        else:
            merged.append((offset, text))
    if not merged or merged[0][0] > 0:
        merged.insert(0, (0, ""))
    if len(merged) == 1 or merged[-1][0] + len(merged[-1][1]) < total_chars:
        merged.append((total_chars, ""))
    elisions = []
    for (offset, text), (next_offset, _) in zip(merged, merged[1:], strict=False):
        end = offset + len(text)
        style = styles.get((end, next_offset), ElisionStyle.PLAIN)
        elisions.append(Elision(next_offset - end, style))
    if len(merged) == 2 and elisions[0].style is ElisionStyle.PLAIN:
        return Preview(head=merged[0][1], tail=merged[1][1], total_chars=total_chars)
    return Preview(
        head=merged[0][1],
        tail=merged[-1][1],
        total_chars=total_chars,
        middle=tuple(text for _, text in merged[1:-1]),
        elisions=tuple(elisions),
    )


def make_preview(text: str, *, head_chars: int, tail_chars: int) -> Preview:
    """The preview ingestion stores for ``text``: its first ``head_chars`` and last ``tail_chars``.

    Text that fits in ``head_chars + tail_chars`` is kept whole (``head`` is the text, ``tail``
    is empty and the rendered preview equals the text).
    """
    if head_chars < 0 or tail_chars < 0:
        raise ValueError("head_chars and tail_chars must be >= 0")
    if len(text) <= head_chars + tail_chars:
        return Preview(head=text, tail="", total_chars=len(text))
    tail = text[len(text) - tail_chars :] if tail_chars else ""
    return Preview(head=text[:head_chars], tail=tail, total_chars=len(text))
