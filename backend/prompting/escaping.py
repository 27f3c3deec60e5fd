"""Escaping: which lines of content a reader would take for prompt structure, and their escapes.

Role boundaries are unforgeable as a reader sees them, not merely as the parser does: content
that a model would read as a section header, a speaker label, a pointer or notice line, or a
truncation marker is escaped, however it is spelled. ``render`` escapes each message's and
summary's content with :func:`escape_content`; ``parse`` undoes it with
:func:`unescape_with_markers`.

A line of content "looks structural" when, after its leading backslashes, it reads as a
section header, a speaker label, a pointer or notice line once each character is read as
``confusables.reading`` says (:func:`model_eye`): Unicode's UTS #39 confusables table maps
every look-alike to its prototype (Cherokee ``Ꭺ``, Cyrillic ``г``, Armenian ``Ս``, colon-like
``⁚``), compatibility forms decompose, format and other invisible characters and combining
marks are dropped, case is folded and leading whitespace is skipped; a line is read a second
time with symbols that look like letters (``×``) read as blanks. On that folded line, structure
is ``#``-headers naming a section (``### current message``, ``## Current_Message``), a header
name alone on its line in any markup (``**Current Message**``, ``=== Previous Result ===``,
``<current_message>``, a setext heading's name line), a speaker label with an optional
bracketed name and a colon (``user:``, ``Human:``, ``System [x] :``, ``**Assistant:**``), or a
line opening with ``[artifact``, ``[omitted``, ``[note`` or ``[summary``. Each letter of those
words also accepts what its look-alikes read as (a look-alike of ``m`` reads ``rn``, of ``I``
``l``). Plain ASCII reads as itself, lower-cased.

Lines start after any of ``\\n \\r \\v \\f \\x1c \\x1d \\x1e \\x85 U+2028 U+2029``, so a model
that breaks lines elsewhere is covered too. Every line that looks structural gets one more
leading backslash; unescaping removes one backslash from every line that starts with one and
looks structural. Whether a line looks structural does not depend on its leading backslashes,
and other lines are never touched, so the mapping is exactly reversible.

Text that, folded the same way, reads as a truncation marker (Codex's ``…N chars
truncated…``: an ellipsis, a count, a unit, "truncated", an ellipsis) gets one backslash right
after its opening ellipsis (:func:`typed_markers`, :class:`MarkerLike`), except the real
markers of Baton's own cuts, whose spans the caller passes as ``keep``; a real marker never
has that backslash, so unescaping tells the two apart and returns the spans it kept.

Most text is plain ASCII and takes the fast path: one scan of the lower-cased text. Other text
is folded only on lines whose first visible character can open structure; which characters
can, and which read as a dot or a digit (the marker prefilters), is derived from Unicode's data
once per process, on first use.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from backend.prompting import confusables
from backend.prompting.document import Section

_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"

# What a speaker label, a section header or a pointer/notice line looks like once `model_eye`
# has folded a line (lower case, look-alikes read as what they imitate, nothing invisible, no
# leading blanks). Each letter of a structure word also accepts what its look-alikes read as
# (`confusables.letter_forms`: a look-alike of ``m`` reads as ``rn``, one of ``I`` as ``l``).
# Blanks within one line. Possessive, like the other runs of the scan (nothing that follows
# one starts with what it takes): lines of code open with many blanks.
_SPACE = rf"[^\S{_LINE_BREAKS}]*+"
_ROLE_WORDS = ("user", "assistant", "human", "system", "developer", "ai", "bot")
_POINTER_WORDS = ("artifact", "omitted", "note", "summary")
_SECTION_WORDS = tuple(tuple(section.value.lower().split()) for section in Section)
# Markup a header name can wear (``**Current Message**``, ``=== Previous Result ===``,
# ``<current_message>``), and what can join its two words.
_DECORATION = "#=*_\\-:<>/"
_DECOR = rf"(?:[^\S{_LINE_BREAKS}]|[{_DECORATION}])"
_JOIN = rf"(?:[^\S{_LINE_BREAKS}]|[_-])*+"


def _word(word: str) -> str:
    """A pattern for ``word`` (ASCII letters) as a folded line reads it."""
    letters = []
    for letter in word:
        forms = confusables.letter_forms(letter)
        pattern = "|".join(map(re.escape, forms))
        letters.append(pattern if len(forms) == 1 else f"(?:{pattern})")
    return "".join(letters)


def _alternatives(words: tuple[str, ...]) -> str:
    return "(?:" + "|".join(map(_word, words)) + ")"


_NAME = (
    "(?:"
    + "|".join(f"{_word(first)}{_JOIN}{_word(second)}" for first, second in _SECTION_WORDS)
    + ")"
)
_FOLDED_STRUCTURE = (
    rf"(?:[*_]++{_SPACE})?(?:"
    rf"#++{_SPACE}{_NAME}"
    rf"|{_alternatives(_ROLE_WORDS)}{_SPACE}"
    rf"(?:\[[^\]{_LINE_BREAKS}]*\]{_SPACE})?(?:[*_]+{_SPACE})?:"
    rf"|\[{_SPACE}{_alternatives(_POINTER_WORDS)}(?![a-z])"
    r")"
    # A header name alone on its line, in any markup (a setext heading's name line too).
    rf"|{_DECOR}*+{_NAME}{_DECOR}*+(?![^{_LINE_BREAKS}])"
)
_LOOKS_STRUCTURAL = re.compile(_FOLDED_STRUCTURE)
# What a folded line opens with when it is structure: markup, a bracket, or the first letters
# of a structure word. A line opening otherwise is ruled out before it is folded whole.
_OPENING_WORDS = tuple(word[:4] for word in (*_ROLE_WORDS, *(s[0] for s in _SECTION_WORDS)))
_STRUCTURE_OPENING = re.compile(rf"[{_DECORATION}\[]|{_alternatives(_OPENING_WORDS)}")
# The longest folded text an opening alternative can need: a shorter opening decides nothing.
_OPENING_CHARS = max(
    sum(max(map(len, confusables.letter_forms(letter))) for letter in word)
    for word in _OPENING_WORDS
)
_STRUCTURE_STARTS = frozenset(
    _DECORATION.replace("\\", "")
    + "["
    + "".join(form[0] for word in _OPENING_WORDS for form in confusables.letter_forms(word[0]))
)
# ASCII characters a reader does not see (control characters that are not blanks).
_ASCII_HIDDEN_CLASS = "".join(
    re.escape(chr(code)) for code in range(0x80) if confusables.reading(chr(code)) == ""
)
_ASCII_HIDDEN = re.compile(f"[{_ASCII_HIDDEN_CLASS}]")
_LEADING = rf"(?:\\|[^\S{_LINE_BREAKS}])*+"
# Plain ASCII needs no folding beyond case and leading blanks (its reading is itself, lower
# case): one scan of the lower-cased text finds the structural lines.
_ASCII_FIRST_LINE = re.compile(rf"\\*+{_SPACE}(?:{_FOLDED_STRUCTURE})")
_ASCII_LATER_LINE = re.compile(rf"[{_LINE_BREAKS}](?=\\*+{_SPACE}(?:{_FOLDED_STRUCTURE}))")
_LINE_END = re.compile(rf"[{_LINE_BREAKS}]")
# Every structural line holds one of these once lower-cased (a label its colon, a pointer its
# bracket, a header its name's last word, as written or as a look-alike reads): a plain ASCII
# text with none of them is skipped without a scan.
_ASCII_MUST_HOLD = (
    ":",
    "[",
    *(
        "".join(letters)
        for _, second in _SECTION_WORDS
        for letters in itertools.product(*map(confusables.letter_forms, second))
    ),
)


@functools.lru_cache(maxsize=4)
def _plain_ascii(content: str) -> bool:
    """ASCII without hidden controls: its reading is itself, lower-cased. (Cached: escaping
    asks it of the same text for its lines and for its markers.)"""
    return content.isascii() and _ASCII_HIDDEN.search(content) is None


# What a model could take for a truncation marker (Codex's ``…N chars truncated…``), on folded
# text: an ellipsis (``…``, ``...``, ``⋯``, any character named an ellipsis, three middle
# dots), a count, a unit, "truncated", an ellipsis, in any spacing. Escaping puts a backslash
# right after the opening ellipsis (``escapes``), which a real marker never has.
_ELLIPSIS = r"(?:\.\.\.|···)"
_MARKER_UNITS = ("chars", "characters", "tokens", "bytes", "lines")
_FOLDED_MARKER = re.compile(
    rf"{_ELLIPSIS}(?P<escapes>\\*){_SPACE}[0-9][0-9,]*{_SPACE}"
    rf"(?:{'|'.join(_word(unit[:-1]) + 's?' for unit in _MARKER_UNITS)}){_SPACE}"
    rf"{_word('truncated')}{_SPACE}{_ELLIPSIS}"
)
_ASCII_MARKER_WORD = "truncated"  # every ASCII marker-like holds it (its letters read as is)


def model_eye(line: str) -> str:
    """``line`` as a reader takes it in: what ``_FOLDED_STRUCTURE`` is matched against.

    Each character is read as :func:`confusables.reading` says (compatibility forms
    decomposed, invisible characters and combining marks dropped, unassigned and private-use
    code points read as a blank, look-alikes as their UTS #39 prototype, case folded), and
    leading blanks are skipped.
    """
    return "".join(map(confusables.reading, line)).lstrip()


def looks_structural(line: str) -> bool:
    """Whether a model would read ``line`` (one line of content) as prompt structure."""
    visible = line.lstrip("\\").lstrip()
    if not visible:
        return False
    if visible.isascii() and _ASCII_HIDDEN.search(visible) is None:
        return _LOOKS_STRUCTURAL.match(visible.lower()) is not None
    if not _may_start_structure(visible[0]):
        return False
    return any(_reads_as_structure(visible, read) for read in _READINGS)


# A line is read twice: with symbols that look like letters read as letters, and as blanks.
_READINGS = (confusables.reading, confusables.blind_reading)


def _reads_as_structure(visible: str, read: Callable[[str], str]) -> bool:
    # The first few letters rule out most lines before the whole prefix is folded.
    opening = "".join(map(read, visible[:16])).lstrip()
    if len(opening) >= _OPENING_CHARS and _STRUCTURE_OPENING.match(opening) is None:
        return False
    folded = "".join(map(read, visible[:_FOLD_PREFIX_CHARS])).lstrip()
    if len(visible) > _FOLD_PREFIX_CHARS and (
        len(folded) < _FOLDED_PREFIX_CHARS or _MAY_BE_A_NAME_LINE.fullmatch(folded)
    ):
        folded = "".join(map(read, visible)).lstrip()  # invisible padding, or a name line
    return _LOOKS_STRUCTURAL.match(folded) is not None


# Structure is matched at the start of a line, so folding a bounded prefix decides; a prefix this
# long holds any label a reader would take in at a glance, invisible padding included. Only a
# header name alone on its line is judged on the whole line, when the prefix could be one.
_FOLD_PREFIX_CHARS = 512
_FOLDED_PREFIX_CHARS = 128
_NAME_LETTERS = "".join(sorted({char for char in _NAME if char.isalpha()}))
_MAY_BE_A_NAME_LINE = re.compile(rf"[\s{_DECORATION}{_NAME_LETTERS}]*")


@functools.lru_cache(maxsize=1 << 14)
def _may_start_structure(char: str) -> bool:
    """Whether a line whose first visible character is ``char`` can fold into structure."""
    return _opens_structure(*(read(char) for read in _READINGS))


def _opens_structure(*readings: str) -> bool:
    """Whether a line can be structure when its first visible character reads as one of
    ``readings``. An invisible first character says nothing: what follows it decides."""
    return any(not read.lstrip() or read.lstrip()[0] in _STRUCTURE_STARTS for read in readings)


_BMP_END = 0x10000


def warm_up() -> None:
    """Derive now what the first non-ASCII line would derive (a scan of Unicode's data, a few
    tenths of a second): a server process calls it before it takes requests, so no dispatch
    pays for it."""
    _candidates()
    _marker_prefilters()


@functools.cache
def _derived_classes() -> tuple[str, ...]:
    """From one scan of Unicode's data: the non-ASCII characters of the BMP that are plain
    (their reading is visible and opens no structure), that read as a dot, as a digit.

    Only the BMP: a class with ranges above it is matched range by range, many times slower.
    Above it, no character is taken for plain, and every one passes the marker prefilters.
    """
    return confusables.non_ascii_classes(
        lambda char, read: not _opens_structure(read, confusables.blinded(char, read)),
        lambda _, read: "." in read or "·" in read,
        lambda _, read: any("0" <= digit <= "9" for digit in read),
        limit=_BMP_END,
    )


@functools.cache
def _candidates() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The scans for lines worth folding: the first line, and a line after a break.

    A line is worth folding when its first visible character opens an ASCII structure word or
    markup (in any case), is an ASCII control character, starts an ASCII letter run that a
    non-ASCII or hidden character interrupts, or is a non-ASCII character that is not plain.
    Plain characters (their reading is visible and opens no structure) are derived from
    Unicode's data once, on first use; above ``confusables.SCANNED_LIMIT`` none is.
    """
    plain = _derived_classes()[0]
    letters = "".join(sorted(char for char in _STRUCTURE_STARTS if char.isalpha()))
    candidate = (
        rf"(?:(?i:{_STRUCTURE_OPENING.pattern})|[{_ASCII_HIDDEN_CLASS}]"
        rf"|(?i:[{letters}][a-z]*)(?:[{_ASCII_HIDDEN_CLASS}]|[^\x00-\x7f])"
        rf"|(?![\x00-\x7f])[^{plain}])"
    )
    return (
        re.compile(rf"{_LEADING}{candidate}"),
        re.compile(rf"[{_LINE_BREAKS}](?={_LEADING}{candidate})"),
    )


def _candidate_line_starts(content: str) -> Iterator[int]:
    first_line, later_line = _candidates()
    if first_line.match(content):
        yield 0
    for match in later_line.finditer(content):
        yield match.start() + 1


def _structural_line_starts(content: str) -> list[int]:
    """Offsets of the lines of ``content`` that look structural, in order."""
    if _plain_ascii(content):
        lowered = content.lower()
        if not any(word in lowered for word in _ASCII_MUST_HOLD):
            return []
        starts = [0] if _ASCII_FIRST_LINE.match(lowered) else []
        starts.extend(match.start() + 1 for match in _ASCII_LATER_LINE.finditer(lowered))
        return starts
    starts = []
    for start in _candidate_line_starts(content):
        end = _LINE_END.search(content, start)
        if looks_structural(content[start : end.start() if end else len(content)]):
            starts.append(start)
    return starts


@dataclass(frozen=True, slots=True)
class MarkerLike:
    """Text a model could take for a truncation marker: its span in the content, where
    escaping puts its backslash (right after the opening ellipsis), and whether one is there."""

    start: int
    end: int
    escape_at: int
    escaped: bool

    def span(self) -> tuple[int, int]:
        return self.start, self.end


@functools.cache
def _marker_prefilters() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Content without both a character that reads as a dot and one that reads as a digit
    holds no marker-like text (derived from Unicode's data on first use)."""
    _, dots, digits = _derived_classes()
    astral = f"{chr(_BMP_END)}-{chr(0x10FFFF)}"
    return re.compile(f"[.·{dots}{astral}]"), re.compile(f"[0-9{digits}{astral}]")


def typed_markers(content: str, keep: tuple[tuple[int, int], ...] = ()) -> list[MarkerLike]:
    """The truncation-marker look-alikes in ``content``, but the real markers at ``keep``."""
    if _plain_ascii(content):
        lowered = content.lower()
        if _ASCII_MARKER_WORD not in lowered:
            return []
        return [
            MarkerLike(*match.span(), match.start("escapes"), bool(match["escapes"]))
            for match in _FOLDED_MARKER.finditer(lowered)
            if match.span() not in keep
        ]
    if any(prefilter.search(content) is None for prefilter in _marker_prefilters()):
        return []
    readings = list(map(confusables.reading, content))
    folded = "".join(readings)
    if "truncated" not in folded and _FOLDED_MARKER.search(folded) is None:
        return []
    # starts[i]: where the reading of content[i] begins in the folded text.
    starts = [0, *itertools.accumulate(map(len, readings))]
    found = []
    for match in _FOLDED_MARKER.finditer(folded):
        start = bisect.bisect_right(starts, match.start()) - 1
        end = bisect.bisect_right(starts, match.end() - 1)
        escape_at = bisect.bisect_left(starts, match.start("escapes"))
        if starts[escape_at] != match.start("escapes"):
            continue  # the ellipsis ends inside a character (U+152F reads as "·4"): no place
        if (start, end) not in keep:
            found.append(MarkerLike(start, end, escape_at, content.startswith("\\", escape_at)))
    return found


def needs_escape(content: str) -> bool:
    """Whether any line of ``content`` would read as structure to a model, or any part of it
    as a truncation marker."""
    return bool(_structural_line_starts(content)) or bool(typed_markers(content))


def escape_content(content: str, *, keep: tuple[tuple[int, int], ...] = ()) -> str:
    """Prefix one backslash to every content line that would read as structure, and put one
    after the opening ellipsis of every truncation-marker look-alike, except the real markers
    of cuts at ``keep`` (their spans in ``content``). Returns ``content`` itself when
    unchanged."""
    markers = typed_markers(content, keep)
    if markers:
        content = _insert_backslashes(content, [marker.escape_at for marker in markers])
    starts = _structural_line_starts(content)
    return _insert_backslashes(content, starts) if starts else content


def _insert_backslashes(content: str, offsets: list[int]) -> str:
    pieces = []
    previous = 0
    for offset in offsets:
        pieces.append(content[previous:offset])
        pieces.append("\\")
        previous = offset
    pieces.append(content[previous:])
    return "".join(pieces)


def unescape_content(content: str) -> str:
    """Exact inverse of :func:`escape_content`."""
    return unescape_with_markers(content)[0]


def unescape_with_markers(content: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The inverse of :func:`escape_content`, and the spans of the real markers it kept (the
    marker-like texts without a backslash after their ellipsis)."""
    if "\\" in content:
        pieces: list[str] = []
        previous = 0
        for start in _structural_line_starts(content):
            if content.startswith("\\", start):
                pieces.append(content[previous:start])
                previous = start + 1
        pieces.append(content[previous:])
        content = "".join(pieces)
    markers = typed_markers(content)
    if not markers:
        return content, ()
    pieces = []
    previous = 0
    removed = 0
    kept: list[tuple[int, int]] = []
    for marker in markers:
        if marker.escaped:
            pieces.append(content[previous : marker.escape_at])
            previous = marker.escape_at + 1
            removed += 1
        else:
            kept.append((marker.start - removed, marker.end - removed))
    pieces.append(content[previous:])
    return "".join(pieces), tuple(kept)
