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
    def marker_span(self) -> tuple[int, int] | None:
        """Where the marker sits in ``text`` (None when nothing was cut)."""
        if not self.truncated:
            return None
        return len(self.head), len(self.text) - len(self.tail)


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


@dataclass(frozen=True, slots=True)
class Preview:
    """The bounded head + tail that ingestion keeps for a long text (its full size included)."""

    head: str
    tail: str
    total_chars: int

    @property
    def removed_chars(self) -> int:
        return self.total_chars - len(self.head) - len(self.tail)

    @property
    def kept_chars(self) -> int:
        return len(self.head) + len(self.tail)

    @property
    def text(self) -> str:
        return render_preview(self.head, self.tail, self.total_chars)

    @property
    def marker_span(self) -> tuple[int, int] | None:
        """Where the marker sits in ``text`` (None when the preview is the whole text)."""
        if self.removed_chars <= 0:
            return None
        return len(self.head), len(self.head) + len(truncation_marker(self.removed_chars))

    def recut(self, limit: int) -> Preview:
        """Keep at most ``limit`` code points, half from the head and half from the tail.

        Matches ``truncate_middle(original, limit, "chars")`` whenever the stored head and tail
        are at least half the limit each; the marker's N stays relative to the original text.
        """
        if self.kept_chars <= limit:
            return self
        left, right = _split_budget(limit)
        head = self.head[:left]
        tail = self.tail[max(len(self.tail) - right, 0) :] if right else ""
        return Preview(head=head, tail=tail, total_chars=self.total_chars)


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
