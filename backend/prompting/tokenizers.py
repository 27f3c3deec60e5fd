"""Counting in a model's own tokens: exactly where its encoding ships offline, else a safe estimate.

A model reads tokens of its own tokenizer. Baton counts every prompt exactly with a tiktoken
encoding it has offline (``units``) and converts: a :class:`TokenCounting` says which encoding
to count with and how many of the model's tokens one counted token may become at most
(``per_mille`` / 1000). For OpenAI's models the encoding *is* theirs (``o200k_base``), so the
count is exact. Claude's tokenizer is not published; its prompts are counted with
``cl100k_base`` and multiplied by a factor measured to overcount:

* The reference is ``ctok`` 1.3.0, an offline reconstruction of Claude's token counts that
  matches Anthropic's ``count_tokens`` exactly on its published corpora (2.3 million texts, no
  under-count). It has two vocabularies: Claude 3 through Opus 4.6 (:attr:`Tokenizer.CLAUDE_3`)
  and Opus 4.7 onwards (:attr:`Tokenizer.CLAUDE_4_7`, 1.0–1.35× the tokens of the first by
  Anthropic's own account, more on English).
* Measured per text (a message's content, without the request's frame), Claude tokens per
  ``cl100k_base`` token were, for the 3 and 4.7 vocabularies: English prose and READMEs up to
  1.26 and 1.83; Python, JavaScript and HTML up to 1.53 and 1.97 (deeply indented code is the
  worst: every run of indentation costs more); JSON up to 1.39 and 1.69; Chinese, Japanese and
  Korean up to 1.28 and 1.60; Russian, Arabic, Hindi, Thai and other scripts up to 1.29 and
  1.76; logs, hex digests, base64 and random printable ASCII up to 1.22 and 1.33.
* The factors, 1.6 and 2.1, sit above every one of those. Two kinds of text can still exceed
  them, and a budget fraction below 1 is what absorbs them: text mostly in capitals (2.3× on
  the 4.7 vocabulary) and lines of nothing but blanks (3×).

``cl100k_base`` rather than ``o200k_base`` is the basis because it tracks Claude more closely
across scripts (o200k packs Hindi or Thai into half the tokens Claude needs), and because every
history row already caches its ``cl100k_base`` count, so an estimate costs the builder nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from backend.prompting.units import DEFAULT_TOKEN_ENCODING, O200K_ENCODING

EXACT = 1000
"""``per_mille`` of an exact count: one counted token is one of the model's tokens."""


class Tokenizer(StrEnum):
    """The tokenizer a model reads with (the model table's ``tokenizer`` column)."""

    O200K_BASE = "o200k_base"
    CL100K_BASE = "cl100k_base"
    CLAUDE_3 = "claude_3"
    CLAUDE_4_7 = "claude_4_7"


@dataclass(frozen=True, slots=True)
class TokenCounting:
    """How to count a model's tokens: an offline encoding, and model tokens per 1000 counted."""

    tokenizer: str
    encoding: str
    per_mille: int = EXACT
    estimated: bool = False
    """The count is not in the model's own tokens: an estimate, on the safe side when
    ``per_mille`` says so."""

    def model_tokens(self, counted: int) -> int:
        """At least the model's tokens for text of ``counted`` tokens (exact when not estimated)."""
        return -(-counted * self.per_mille // EXACT)

    def counted_budget(self, model_tokens: int) -> int:
        """The most counted tokens whose :meth:`model_tokens` stays within ``model_tokens``."""
        return model_tokens * EXACT // self.per_mille


COUNTINGS: dict[str, TokenCounting] = {
    Tokenizer.O200K_BASE: TokenCounting(Tokenizer.O200K_BASE, O200K_ENCODING),
    Tokenizer.CL100K_BASE: TokenCounting(Tokenizer.CL100K_BASE, DEFAULT_TOKEN_ENCODING),
    Tokenizer.CLAUDE_3: TokenCounting(Tokenizer.CLAUDE_3, DEFAULT_TOKEN_ENCODING, 1600, True),
    Tokenizer.CLAUDE_4_7: TokenCounting(Tokenizer.CLAUDE_4_7, DEFAULT_TOKEN_ENCODING, 2100, True),
}

UNKNOWN_TOKENIZER = "unknown"


def unknown_counting(encoding: str) -> TokenCounting:
    """A model the table does not list: counted with ``encoding`` (the policy's), and reported
    as an estimate, since nothing says that encoding is the model's."""
    return TokenCounting(UNKNOWN_TOKENIZER, encoding, EXACT, True)


def counting_for(tokenizer: str) -> TokenCounting:
    """How Baton counts the tokens of a model that reads with ``tokenizer``."""
    try:
        return COUNTINGS[tokenizer]
    except KeyError:
        raise ValueError(
            f"unknown tokenizer {tokenizer!r} (known: {', '.join(COUNTINGS)})"
        ) from None
