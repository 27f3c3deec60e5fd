"""Evidence lines: what a cut of each kind of text must keep from its middle.

A cut keeps a text's first and last lines; what lies between is dropped unless it is evidence
the agent needs. Which lines are evidence depends on the text's kind
(:mod:`backend.prompting.kinds`):

* ``command_output`` — every line that carries an error, a failure, a traceback, an exit code
  or a shell prompt. *Strong* lines come first: a traceback's header, an exception line (with
  the frame right above it, where the error was raised), ``panic:``/``fatal:``/``error:`` lines,
  log lines at level ERROR, FATAL or CRITICAL, test failures (``FAILED``, ``E   …``,
  ``N failed``), ``npm ERR!``, ``error[E…]`` and exit codes. Other lines that mention an error
  word, and shell prompt lines, follow.
* ``text`` — strong lines only: a message or a log that does not look like command output as a
  whole (an INFO-heavy log, a question with a traceback pasted in) still keeps its traceback,
  while prose that merely says "fail" is cut like prose.
* ``web_or_search`` — lines that hold a URL or a title (a Markdown heading, a ``Title:`` line,
  an HTML ``<title>``/``<h1>``–``<h3>``, a link tag).
* ``json`` and ``file_or_code`` have no evidence lines (a JSON text keeps its skeleton, code is
  cut on line boundaries).

An :class:`EvidenceLine` spans its line with the line break before it and the one after it, so
the markers around it stand on lines of their own; a line longer than
``EVIDENCE_LINE_MAX_CHARS`` keeps a window of that size around what made it evidence.
:func:`evidence_lines` lists them in the order a cut takes them: strong lines first, then the
rest, each group in the text's order. That order does not depend on the budget, so a cut that
takes the longest prefix of it that fits keeps, with a larger budget, every line it kept with a
smaller one (``previews``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from backend.prompting.kinds import ArtifactKind

EVIDENCE_LINE_MAX_CHARS = 400
_WINDOW_BEFORE = 80
"""A long line's window starts this many code points before what made it evidence."""
_FRAME_LINES = 2
"""Indented lines right above an exception line kept with it: the frame that raised it."""
TRACEBACK_MAX_CHARS = 1_600
"""A traceback's header line keeps its whole block, frames and exception, up to this size."""
_TRACEBACK_HEADER = "Traceback (most recent call last)"

STRONG = 0
OTHER = 1


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
    "critical",
)
# Candidates: a shell prompt line or an evidence word (its Capitalized form also finds exception
# class names: ``ValueError``, ``java.lang.NullPointerException``).
_COMMAND_CANDIDATES = re.compile(r"\n[ \t]*[$#>] \S|" + _word_alternatives(_EVIDENCE_WORDS))
# What makes a line strong, matched at its start.
_STRONG_LINE = re.compile(
    r"[ \t]*(?:"
    r"Traceback \(most recent call last\)"
    r"|(?:[\w$]+[.:])*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?!\w)(?:[:(]|[ \t]*$)"
    r"|Caused by:|Exception in thread "
    r"|(?i:panic|fatal|error|critical)(?:\[\w+\])?:"
    r"|npm ERR!|FAIL(?:ED)?\b|E {2,}\S|=+ .*\b\d+ (?:failed|errors?)\b"
    r"|.*\b(?:ERROR|FATAL|CRITICAL)\b"
    r"|.*\b(?i:exit(?:ed)? (?:code|status|with)|returned non-zero)"
    r")"
)
_WEB_CANDIDATES = re.compile(r"https?://|<(?i:title|h[1-3]|a)\b|\n[ \t]*(?:#{1,6} |(?i:title:))")
_WEB_SPAN = re.compile(
    r"https?://\S+|<title[\s>][^<]{0,300}</title>|<h[1-3][\s>][^<]{0,300}</h[1-3]>"
    r"|<a\s[^>]{0,300}href=[^>]{0,300}>",
    re.IGNORECASE,
)


def _command_match(text: str, match: re.Match[str]) -> tuple[int, int] | None:
    """A shell prompt line, an evidence word that starts a word, or an exception name."""
    start = match.start()
    if text[start] == "\n":
        return start + 1, match.end()
    before = text[start - 1] if start > 0 else ""
    if (before.isalnum() or before == "_") and not (before.islower() and text[start].isupper()):
        return None
    return match.span()


def _web_match(text: str, match: re.Match[str]) -> tuple[int, int] | None:
    """A URL, a title or heading line, or an HTML title, heading or link tag."""
    start = match.start()
    if text[start] == "\n":
        return start + 1, match.end()
    whole = _WEB_SPAN.match(text, start)
    return whole.span() if whole is not None else None


def _command_tier(line: str) -> int:
    return STRONG if _STRONG_LINE.match(line) else OTHER


def _web_tier(line: str) -> int:
    return STRONG


@dataclass(frozen=True)
class _Rules:
    """A kind's evidence: a fast search for candidates, the check that confirms one (the span
    that made it evidence) or rejects it, a line's tier, and the tiers the kind keeps."""

    candidates: re.Pattern[str]
    confirm: Callable[[str, re.Match[str]], tuple[int, int] | None]
    tier: Callable[[str], int]
    keeps: frozenset[int]


_RULES: dict[str, _Rules] = {
    ArtifactKind.COMMAND_OUTPUT: _Rules(
        _COMMAND_CANDIDATES, _command_match, _command_tier, frozenset({STRONG, OTHER})
    ),
    ArtifactKind.TEXT: _Rules(
        _COMMAND_CANDIDATES, _command_match, _command_tier, frozenset({STRONG})
    ),
    ArtifactKind.WEB_OR_SEARCH: _Rules(_WEB_CANDIDATES, _web_match, _web_tier, frozenset({STRONG})),
}


def has_evidence(kind: str) -> bool:
    """Whether texts of ``kind`` have evidence lines at all."""
    return kind in _RULES


@dataclass(frozen=True, slots=True)
class EvidenceLine:
    """One evidence line of a text: ``[start, end)`` in the text, its tier (``STRONG`` first)."""

    start: int
    end: int
    tier: int

    @property
    def size(self) -> int:
        return self.end - self.start


def evidence_lines(text: str, start: int, end: int, kind: str) -> list[EvidenceLine]:
    """The evidence lines of ``text[start:end]`` for ``kind``, in the order a cut takes them.

    A line is clipped to ``[start, end)``: the region's edges are where a cut already ends."""
    rules = _RULES.get(kind)
    if rules is None or start >= end:
        return []
    found: list[EvidenceLine] = []
    last_line = -1
    # From the line break before the region, so a prompt on its first line is found.
    for match in rules.candidates.finditer(text, max(start - 1, 0), end):
        confirmed = rules.confirm(text, match)
        if confirmed is None or confirmed[0] < start:
            continue
        line_start = text.rfind("\n", start, confirmed[0]) + 1 or start
        if line_start == last_line:
            continue  # one entry a line
        last_line = line_start
        line_end = text.find("\n", confirmed[1], end)
        line_end = end if line_end == -1 else line_end
        tier = rules.tier(text[line_start:line_end])
        if tier not in rules.keeps:
            continue
        found.append(_line_span(text, start, end, line_start, line_end, confirmed[0], tier))
    return sorted(found, key=lambda line: (line.tier, line.start))


def _line_span(
    text: str, start: int, end: int, line_start: int, line_end: int, hit: int, tier: int
) -> EvidenceLine:
    """The span a cut keeps of one evidence line: the line with the break before and after it
    (within the region), an exception's frame lines above it, or a window of a long line."""
    if line_end - line_start > EVIDENCE_LINE_MAX_CHARS:
        window = max(line_start, hit - _WINDOW_BEFORE)
        return EvidenceLine(window, min(window + EVIDENCE_LINE_MAX_CHARS, line_end), tier)
    if text.startswith(_TRACEBACK_HEADER, line_start):
        block_end = _traceback_end(text, line_end, end)
        if block_end - line_start <= TRACEBACK_MAX_CHARS:
            return EvidenceLine(max(line_start - 1, start), min(block_end + 1, end), tier)
    first = line_start
    if tier == STRONG and not text[line_start : line_start + 1].isspace():
        # An exception line: the indented lines right above it are the frame that raised it.
        for _ in range(_FRAME_LINES):
            above = text.rfind("\n", start, max(first - 1, start)) + 1 or start
            if above >= first - 1 or not text[above : above + 1].isspace():
                break
            if first - above > EVIDENCE_LINE_MAX_CHARS:
                break
            first = above
    return EvidenceLine(max(first - 1, start), min(line_end + 1, end), tier)


def _traceback_end(text: str, header_end: int, end: int) -> int:
    """Where the traceback whose header line ends at ``header_end`` ends: after its indented
    frame lines, at the end of the exception line that follows them (within ``end``); at
    ``header_end`` when no frame line follows the header."""
    position = header_end
    while position < end:
        line_end = text.find("\n", position + 1, end)
        line_end = end if line_end == -1 else line_end
        framed = text[position + 1 : position + 2] in (" ", "\t") and position + 1 < line_end
        if not framed:
            return header_end if position == header_end else line_end
        position = line_end
    return min(position, end)
