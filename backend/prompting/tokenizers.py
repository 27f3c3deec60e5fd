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

The factors are safe for any text, so for mostly-English prompts they waste room (Claude 3
reads English at about 1.1–1.26× cl100k, not 1.6×). Where a bot's turns report the input tokens
the model really read, :func:`fit_ratio` learns a smaller factor for that bot: a least-squares
line of reported input tokens against counted prompt tokens over its recent full-prompt turns,
whose slope is the ratio and whose intercept the executor's own overhead. The factor it returns
is bounded on the safe side: the slope's upper error bound plus a margin, never below
``floor_per_mille`` (the highest ratio measured for English prose: learning never claims text
is cheaper than that), never above the shipped factor, and high enough that every sample's
reported input stays within what the budget predicts for it (ratio × its counted tokens + the
overhead the budget subtracts). Few samples, too narrow a spread of sizes or a noisy fit (a tool
loop's turn reads the prompt several times) keep the shipped factor.

``cl100k_base`` rather than ``o200k_base`` is the basis because it tracks Claude more closely
across scripts (o200k packs Hindi or Thai into half the tokens Claude needs), and because every
history row already caches its ``cl100k_base`` count, so an estimate costs the builder nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
    floor_per_mille: int | None = None
    """The smallest ``per_mille`` a factor learned from usage may have (None: nothing is
    learned, the count is exact or nothing bounds a learned factor from below)."""
    learned: bool = False
    """``per_mille`` was learned from the bot's usage (:func:`fit_ratio`), not shipped."""

    def with_learned(self, per_mille: int | None) -> TokenCounting:
        """This counting with a bot's learned factor (None: the shipped one), kept within
        ``floor_per_mille`` and the shipped factor whatever was stored."""
        if per_mille is None or self.floor_per_mille is None:
            return self
        bounded = min(max(per_mille, self.floor_per_mille), self.per_mille)
        if bounded == self.per_mille:
            return self
        return replace(self, per_mille=bounded, learned=True)

    def model_tokens(self, counted: int) -> int:
        """At least the model's tokens for text of ``counted`` tokens (exact when not estimated)."""
        return -(-counted * self.per_mille // EXACT)

    def counted_budget(self, model_tokens: int) -> int:
        """The most counted tokens whose :meth:`model_tokens` stays within ``model_tokens``."""
        return model_tokens * EXACT // self.per_mille


COUNTINGS: dict[str, TokenCounting] = {
    Tokenizer.O200K_BASE: TokenCounting(Tokenizer.O200K_BASE, O200K_ENCODING),
    Tokenizer.CL100K_BASE: TokenCounting(Tokenizer.CL100K_BASE, DEFAULT_TOKEN_ENCODING),
    # The floors: the highest ratio measured on English prose for each vocabulary.
    Tokenizer.CLAUDE_3: TokenCounting(
        Tokenizer.CLAUDE_3, DEFAULT_TOKEN_ENCODING, 1600, True, floor_per_mille=1260
    ),
    Tokenizer.CLAUDE_4_7: TokenCounting(
        Tokenizer.CLAUDE_4_7, DEFAULT_TOKEN_ENCODING, 2100, True, floor_per_mille=1830
    ),
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


RATIO_MIN_SAMPLES = 8
"""Fewer full-prompt turns with usage than this keep the shipped factor."""
RATIO_MIN_SPREAD = 2.0
"""The largest sampled prompt must count at least this many times the smallest: a slope is
not measured on prompts of one size."""
RATIO_MAX_SLOPE_ERROR = 0.05
"""A slope whose standard error is above this share of it is noise: the shipped factor stays."""
RATIO_MARGIN = 0.10
"""Added to the slope's upper error bound (two standard errors): the next prompt's text is
not the samples'."""


@dataclass(frozen=True, slots=True)
class RatioFit:
    """What :func:`fit_ratio` found: the line, and the factor a budget may use."""

    per_mille: int
    """Model tokens per 1000 counted: learned and bounded, or the shipped factor."""
    learned: bool
    samples: int
    slope: float | None = None
    intercept: float | None = None


def fit_ratio(
    samples: Sequence[tuple[int, int]], *, counting: TokenCounting, overhead_tokens: int
) -> RatioFit:
    """The factor of ``counting`` learned from ``samples``, (counted prompt tokens, reported
    input tokens) of a bot's full-prompt turns, for a budget that subtracts
    ``overhead_tokens`` for the executor: see the module docstring for its bounds."""
    shipped = RatioFit(per_mille=counting.per_mille, learned=False, samples=len(samples))
    floor = counting.floor_per_mille
    usable = [(x, y) for x, y in samples if x > 0 and y > 0]
    if floor is None or floor >= counting.per_mille or len(usable) < RATIO_MIN_SAMPLES:
        return shipped
    xs = [float(x) for x, _ in usable]
    ys = [float(y) for _, y in usable]
    if max(xs) < RATIO_MIN_SPREAD * min(xs):
        return shipped
    n = len(usable)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    residuals = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    slope_error = math.sqrt(residuals / (n - 2) / sxx)
    if slope <= 0 or slope_error > RATIO_MAX_SLOPE_ERROR * slope:
        return replace(shipped, slope=slope, intercept=intercept)
    upper = (slope + 2 * slope_error) * (1 + RATIO_MARGIN)
    # No sample may read more than the budget would predict for its prompt (in integers: a
    # rounding must not let one through).
    envelope = max(-(-(y - overhead_tokens) * EXACT // x) for x, y in usable)
    per_mille = min(max(math.ceil(upper * EXACT), envelope, floor), counting.per_mille)
    return RatioFit(
        per_mille=per_mille,
        learned=per_mille < counting.per_mille,
        samples=n,
        slope=slope,
        intercept=intercept,
    )
