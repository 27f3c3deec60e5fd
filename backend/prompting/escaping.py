"""Escaping: which lines of content a reader would take for prompt structure, and their escapes.

Role boundaries are unforgeable as a reader sees them, not merely as the parser does: content
that a model would read as a section header, a speaker label, a pointer or notice line, or a
truncation marker is escaped, however it is spelled. ``render`` escapes each message's and
summary's content with :func:`escape_content`; ``parse`` undoes it with
:func:`unescape_with_markers`.

Why escape and not quote every line. Making structure unforgeable by construction (every
content line indented or prefixed, so no content line can start where structure starts) would
change the bytes of every content line: the token counts Baton keeps from ingestion could no
longer be reused, and each line would pay for its prefix. Escaping touches only the lines a
reader could misread, so the rules below judge lines by *families* (a shape over classes of
characters that Unicode's own data defines), never by a list of spellings; when in doubt they
escape, since an escape is reversible and costs one backslash.

How a line is read. After its leading backslashes, a line is folded as ``confusables.fold``
says (:func:`model_eye`): Unicode's UTS #39 confusables table maps every look-alike to its
prototype (Cherokee ``Ꭺ``, Cyrillic ``г``, colon-like ``⁚``), compatibility forms decompose,
format and other invisible characters and combining marks are dropped, case is folded and
leading whitespace is skipped; a line is read a second time with symbols that look like
letters (``×``) read as blanks. Each letter of a structure word also accepts what its
look-alikes read as (a look-alike of ``m`` reads ``rn``, of ``I`` ``l``). Plain ASCII reads as
itself, lower-cased. On the folded line, *decoration* is any character that is not a letter or
a digit (every bracket, quote, dash, markup sign and punctuation mark of every script), and
*numbering* is up to nine digits and ``.`` or ``)``. A line is structure when it

* is a **speaker label**: decoration and numbering, a role word (``user``, ``assistant``,
  ``human``, ``system``, ``developer``, ``ai``, ``bot``, ``model``, ``tool``: the roles of the
  chat formats models are trained on) that no letter or digit continues, then within
  ``_LABEL_REACH`` characters (any name, in any brackets, after any separator) a *colon-like
  mark*: ``:``, ``;``, any non-ASCII character of category Po (other punctuation: ``፡``
  ETHIOPIC WORDSPACE, ``·``, ``।``, whatever the confusables table does not identify with an
  ASCII mark) or any braille pattern (dots: ``⠆``). Sentence marks the table reads as ASCII
  ``.``, ``,``, ``!``, ``?`` and currency signs (``₡``) are not colon-like;
* names a **section** (``conversation history``, ``current message``, ``previous result``,
  words joined by blanks, ``_`` or ``-``): after decoration or numbering, anywhere within
  ``_SECTION_REACH`` characters (``## 1. Current Message``, ``## Updated Current Message``,
  ``**Current Message** (continued)``, ``<current_message id="2">``); or bare, after optional
  numbering, when only decoration or the line's end follows it (``Current Message``, a setext
  heading's name line, ``Previous Result: 5 passed``), not prose (``Current messages are
  queued``, ``the previous result was fine``);
* opens like a **pointer or notice**: after decoration, the word ``artifact``, ``omitted``,
  ``note`` or ``summary`` (``[artifact``, ``(artifact``, ``【note``); or bare, one of those
  words and, within ``_POINTER_REACH`` characters, ``full text`` or ``full transcript``.

Lines start after any of ``\\n \\r \\v \\f \\x1c \\x1d \\x1e \\x85 U+2028 U+2029``, so a model
that breaks lines elsewhere is covered too. Every line that looks structural gets one more
leading backslash; unescaping removes one backslash from every line that starts with one and
looks structural. Whether a line looks structural does not depend on its leading backslashes,
and other lines are never touched, so the mapping is exactly reversible.

Text that, folded the same way, reads as a **truncation marker** (Codex's ``…N chars
truncated…`` and its family: an opening ellipsis or any opening bracket (Ps, Pi, ``<``), a
count whose digits (any Nd) are grouped by any separator, up to three words (a unit, ``were``),
a word that reads as a past participle (``truncated``, ``omitted``, ``elided``, ``hidden``,
``shown``) or ``cut``/``out``, and optionally a closing ellipsis or bracket) gets one backslash
right after its opener (:func:`typed_markers`, :class:`MarkerLike`), except the real markers of
Baton's own cuts, whose spans the caller passes as ``keep``; a real marker never has that
backslash, so unescaping tells the two apart and returns the spans it kept.

Most text is plain ASCII and takes the fast path: one scan of the lower-cased text. Other text
is folded only on lines whose first visible character can open structure, and for markers only
when a character that can end an opener is followed by one that reads as a digit; which
characters those are is derived from Unicode's data once per process, on first use.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from backend.prompting import confusables
from backend.prompting.document import Section

_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"

# Blanks within one line. Possessive, like the other runs of the scan (nothing that follows
# one starts with what it takes): lines of code open with many blanks.
_SPACE = rf"[^\S{_LINE_BREAKS}]*+"
_ROLE_WORDS = ("user", "assistant", "human", "system", "developer", "ai", "bot", "model", "tool")
_POINTER_WORDS = ("artifact", "omitted", "note", "summary")
_SECTION_WORDS = tuple(tuple(section.value.lower().split()) for section in Section)
# How far a label's colon-like mark, a decorated section name and a bare pointer's "full text"
# may sit from where they start: a name in brackets, a qualifier, an id and a size.
_LABEL_REACH = 40
_SECTION_REACH = 32
_POINTER_REACH = 200
# Decoration: anything on a line but a letter or a digit. Numbering: ``1.``, ``12)``.
_DECORATION = rf"(?:[^\w{_LINE_BREAKS}]|_)"
_NUMBERING = r"\d{1,9}[.)]"
_LEAD = rf"(?:[^\w{_LINE_BREAKS}]|_|\d++[.)])*+"
_MARKUP = rf"(?:[^\w\s]|_|{_NUMBERING})"
_WORD_ENDS = r"(?![^\W_])"
_JOIN = rf"(?:[^\S{_LINE_BREAKS}]|[_-])*+"
_LINE_ENDS = rf"(?![^{_LINE_BREAKS}])"
# The colon-like marks of plain ASCII (the rest are derived from Unicode's data, on first use).
_ASCII_COLON_LIKE = ":;"


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


def _structure(colon_like: str) -> str:
    """What a folded line opens with when it is structure (see the module docstring), with
    ``colon_like`` the body of the character class of colon-like marks."""
    return (
        rf"{_LEAD}{_alternatives(_ROLE_WORDS)}{_WORD_ENDS}"
        rf"[^{_LINE_BREAKS}]{{0,{_LABEL_REACH}}}?[{colon_like}]"
        rf"|{_MARKUP}{_LEAD}(?:[^{_LINE_BREAKS}]{{0,{_SECTION_REACH}}}?{_NAME}"
        rf"|{_alternatives(_POINTER_WORDS)}{_WORD_ENDS})"
        rf"|(?:{_NUMBERING}{_SPACE})?{_NAME}{_WORD_ENDS}{_SPACE}(?:{_DECORATION}|{_LINE_ENDS})"
        rf"|{_alternatives(_POINTER_WORDS)}{_WORD_ENDS}[^{_LINE_BREAKS}]{{0,{_POINTER_REACH}}}?"
        rf"{_word('full')}{_SPACE}(?:{_word('text')}|{_word('transcript')})"
    )


# Plain ASCII needs no folding beyond case and leading blanks (its reading is itself, lower
# case): one scan of the lower-cased text finds the structural lines.
_ASCII_STRUCTURE = _structure(_ASCII_COLON_LIKE)
_LOOKS_STRUCTURAL_ASCII = re.compile(_ASCII_STRUCTURE)
_ASCII_FIRST_LINE = re.compile(rf"\\*+{_SPACE}(?:{_ASCII_STRUCTURE})")
_ASCII_LATER_LINE = re.compile(rf"[{_LINE_BREAKS}](?=\\*+{_SPACE}(?:{_ASCII_STRUCTURE}))")
_LINE_END = re.compile(rf"[{_LINE_BREAKS}]")
# Every structural ASCII line holds one of these once lower-cased (a label its colon-like mark,
# a header its name's last word, a pointer its word, as written or as a look-alike reads): a
# plain ASCII text with none of them is skipped without a scan.
_ASCII_MUST_HOLD = (
    *_ASCII_COLON_LIKE,
    *(
        "".join(letters)
        for word in (*(second for _, second in _SECTION_WORDS), *_POINTER_WORDS)
        for letters in itertools.product(*map(confusables.letter_forms, word))
    ),
)


@functools.cache
def colon_like_class() -> str:
    """The body of a character class of every colon-like mark of a folded line: ``:``, ``;``,
    every non-ASCII code point of category Po, every braille pattern (derived from Unicode's
    data; no Po character or braille pattern lies above ``confusables.SCANNED_LIMIT``)."""
    ranges: list[list[int]] = []
    for code in range(0x80, confusables.SCANNED_LIMIT):
        char = chr(code)
        if unicodedata.category(char) == "Po" or unicodedata.name(char, "").startswith(
            "BRAILLE PATTERN"
        ):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return _ASCII_COLON_LIKE + "".join(map(confusables.class_range, ranges))


@functools.cache
def _looks_structural_folded() -> re.Pattern[str]:
    return re.compile(_structure(colon_like_class()))


# What a folded line opens with when it is structure: decoration, numbering, or the first
# letters of a structure word. A line opening otherwise is ruled out before it is folded whole.
_OPENING_WORDS = tuple(
    word[:4] for word in (*_ROLE_WORDS, *(s[0] for s in _SECTION_WORDS), *_POINTER_WORDS)
)
_STRUCTURE_OPENING = re.compile(rf"{_DECORATION}|\d|{_alternatives(_OPENING_WORDS)}")
# The longest folded text an opening alternative can need: a shorter opening decides nothing.
_OPENING_CHARS = max(
    sum(max(map(len, confusables.letter_forms(letter))) for letter in word)
    for word in _OPENING_WORDS
)
_OPENING_LETTERS = "".join(
    sorted({form[0] for word in _OPENING_WORDS for form in confusables.letter_forms(word[0])})
)
_OPENING_CHAR = re.compile(rf"[^\w]|[_\d{_OPENING_LETTERS}]")
# ASCII characters a reader does not see (control characters that are not blanks).
_ASCII_HIDDEN_CLASS = "".join(
    re.escape(chr(code)) for code in range(0x80) if confusables.reading(chr(code)) == ""
)
_ASCII_HIDDEN = re.compile(f"[{_ASCII_HIDDEN_CLASS}]")
_LEADING = rf"(?:\\|[^\S{_LINE_BREAKS}])*+"


@functools.lru_cache(maxsize=4)
def _plain_ascii(content: str) -> bool:
    """ASCII without hidden controls: its reading is itself, lower-cased. (Cached: escaping
    asks it of the same text for its lines and for its markers.)"""
    return content.isascii() and _ASCII_HIDDEN.search(content) is None


# What a model could take for a truncation marker, on folded text (see the module docstring).
# Escaping puts a backslash right after the opener (``escapes``), which a real marker never has.
_ELLIPSIS = r"(?:\.\.\.|···)"
_ASCII_OPENERS = "([{<"
_ASCII_CLOSERS = ")]}>"
# A count's digits, grouped by any one mark but a backslash (``4,812``, ``4 812``, ``4_812``).
_COUNT = rf"\d++(?:(?:[^\w\\{_LINE_BREAKS}]|_)\d++)*+"
# A unit or verb is read as folded, where a letter may read as a symbol (``ð`` as ``∂``): a
# word is any run of marks but blanks, digits, backslashes, brackets and punctuation.
_MARKER_WORD = r"""[^\s\d\\()\[\]{}<>.,;:!?"']"""
_MARKER_VERB = rf"(?:{_MARKER_WORD}*?(?:ed|en|wn)|cut|out)"


def _marker(openers: str, closers: str) -> re.Pattern[str]:
    return re.compile(
        rf"(?:{_ELLIPSIS}|[{openers}])(?P<escapes>\\*){_SPACE}{_COUNT}{_SPACE}"
        rf"(?:{_MARKER_WORD}{{1,24}}+{_SPACE}){{0,3}}?{_MARKER_VERB}{_WORD_ENDS}"
        rf"(?:{_SPACE}(?:{_ELLIPSIS}|[{closers}]))?"
    )


_ASCII_MARKER = _marker(re.escape(_ASCII_OPENERS), re.escape(_ASCII_CLOSERS))
# Every ASCII marker-like holds an opener and, after it and any backslashes and blanks, a digit.
_ASCII_MARKER_OPENING = re.compile(rf"(?:\.\.\.|[{re.escape(_ASCII_OPENERS)}])\\*{_SPACE}\d")
# Unicode's brackets that open and close (and initial and final quotes), for markers.
_OPENING_CATEGORIES = frozenset({"Ps", "Pi"})
_CLOSING_CATEGORIES = frozenset({"Pe", "Pf"})


@functools.cache
def _brackets() -> tuple[str, str]:
    """The bodies of character classes of the brackets (and quotes) Unicode says open, and
    those it says close: ASCII ``( [ { <`` and ``) ] } >``, every other Ps and Pi, Pe and Pf
    (all lie in the BMP)."""
    found: tuple[list[list[int]], list[list[int]]] = ([], [])
    for code in range(0x80, _BMP_END):
        category = unicodedata.category(chr(code))
        for ranges, wanted in zip(found, (_OPENING_CATEGORIES, _CLOSING_CATEGORIES), strict=True):
            if category not in wanted:
                continue
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    openers, closers = ("".join(map(confusables.class_range, ranges)) for ranges in found)
    return re.escape(_ASCII_OPENERS) + openers, re.escape(_ASCII_CLOSERS) + closers


@functools.cache
def _folded_marker() -> re.Pattern[str]:
    """The marker pattern for folded text, with every bracket Unicode says opens or closes."""
    return _marker(*_brackets())


def model_eye(line: str) -> str:
    """``line`` as a reader takes it in: what the structure patterns are matched against.

    Each character is read as :func:`confusables.reading` says (compatibility forms
    decomposed, invisible characters and combining marks dropped, unassigned and private-use
    code points read as a blank, look-alikes as their UTS #39 prototype, case folded), and
    leading blanks are skipped.
    """
    return confusables.fold(line).lstrip()


def looks_structural(line: str) -> bool:
    """Whether a model would read ``line`` (one line of content) as prompt structure."""
    visible = line.lstrip("\\").lstrip()
    if not visible:
        return False
    if visible.isascii() and _ASCII_HIDDEN.search(visible) is None:
        return _LOOKS_STRUCTURAL_ASCII.match(visible.lower()) is not None
    if not _may_start_structure(visible[0]):
        return False
    return any(_reads_as_structure(visible, fold) for fold in _FOLDS)


# A line is read twice: with symbols that look like letters read as letters, and as blanks.
_READINGS = (confusables.reading, confusables.blind_reading)
_FOLDS = (confusables.fold, confusables.blind_fold)


def _reads_as_structure(visible: str, fold: Callable[[str], str]) -> bool:
    # The first few letters rule out most lines before the whole prefix is folded.
    opening = fold(visible[:16]).lstrip()
    if len(opening) >= _OPENING_CHARS and _STRUCTURE_OPENING.match(opening) is None:
        return False
    folded = fold(visible[:_FOLD_PREFIX_CHARS]).lstrip()
    if len(visible) > _FOLD_PREFIX_CHARS and _MAY_NEED_THE_WHOLE_LINE.fullmatch(folded):
        folded = fold(visible).lstrip()  # invisible padding, long decoration, or a name line
    return _looks_structural_folded().match(folded) is not None


# Structure is matched at the start of a line, so folding a bounded prefix decides; a prefix this
# long holds any label a reader would take in at a glance, invisible padding included. The whole
# line is folded only when the folded prefix could still become structure further on: it is
# decoration, then less than ``_REACHES`` characters, or a bare section name then blanks.
_FOLD_PREFIX_CHARS = 512
_REACHES = 320
_MAY_NEED_THE_WHOLE_LINE = re.compile(
    rf"{_LEAD}(?:[^{_LINE_BREAKS}]{{0,{_REACHES}}}|(?:{_NUMBERING}{_SPACE})?{_NAME}{_SPACE})"
)


@functools.lru_cache(maxsize=1 << 14)
def _may_start_structure(char: str) -> bool:
    """Whether a line whose first visible character is ``char`` can fold into structure."""
    return _opens_structure(*(read(char) for read in _READINGS))


def _opens_structure(*readings: str) -> bool:
    """Whether a line can be structure when its first visible character reads as one of
    ``readings``. An invisible first character says nothing: what follows it decides."""
    return any(
        not read.lstrip() or _OPENING_CHAR.match(read.lstrip()) is not None for read in readings
    )


_BMP_END = 0x10000


def warm_up() -> None:
    """Derive now what the first non-ASCII line would derive (a scan of Unicode's data, a few
    tenths of a second): a server process calls it before it takes requests, so no dispatch
    pays for it."""
    _candidates()
    _looks_structural_folded()
    _folded_marker()
    _marker_prefilter()


@functools.cache
def _derived_classes() -> tuple[str, ...]:
    """From one scan of Unicode's data: the non-ASCII characters of the BMP that are plain
    (their reading is visible and opens no structure), and, for the marker prefilter, those
    whose reading holds a dot, two dots, an opener, a digit, or a digit and a dot or an
    opener, and those that read as nothing or as blanks.

    Only the BMP: a class with ranges above it is matched range by range, many times slower.
    Above it, no character is taken for plain, and every one passes the marker prefilter.
    """
    opener = re.compile(f"[{_brackets()[0]}]").search
    digit = re.compile(r"\d").search
    return confusables.non_ascii_classes(
        lambda char, read: not _opens_structure(read, confusables.blinded(char, read)),
        lambda _, read: _dots(read) >= 1,
        lambda _, read: _dots(read) >= 2,
        lambda _, read: opener(read) is not None,
        lambda _, read: digit(read) is not None,
        lambda _, read: digit(read) is not None and (_dots(read) >= 1 or opener(read) is not None),
        lambda _, read: not read.strip(),
        limit=_BMP_END,
    )


def _dots(read: str) -> int:
    return read.count(".") + read.count("·")


@functools.cache
def _candidates() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The scans for lines worth folding: the first line, and a line after a break.

    A line is worth folding when its first visible character is decoration or a digit, opens
    an ASCII structure word (in any case), is an ASCII control character, starts an ASCII
    letter run that a non-ASCII or hidden character interrupts, or is a non-ASCII character
    that is not plain. Plain characters (their reading is visible and opens no structure) are
    derived from Unicode's data once, on first use; above the BMP none is.
    """
    plain = _derived_classes()[0]
    letters = "".join(sorted(char for char in _OPENING_LETTERS if char.isalpha()))
    candidate = (
        rf"(?:{_DECORATION}|\d|(?i:{_alternatives(_OPENING_WORDS)})|[{_ASCII_HIDDEN_CLASS}]"
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
    escaping puts its backslash (right after the opener), and whether one is there."""

    start: int
    end: int
    escape_at: int
    escaped: bool

    def span(self) -> tuple[int, int]:
        return self.start, self.end


@functools.cache
def _marker_prefilter() -> re.Pattern[str]:
    """A marker's folded text has an opener (an ellipsis's last two dots, or a bracket) and,
    after backslashes and blanks, a digit: content without what reads so holds no marker-like
    text. Derived from Unicode's data on first use; above the BMP, every character is taken
    for any of them."""
    _, dot, dots, opener, digit, both, gap = _derived_classes()
    astral = f"{chr(_BMP_END)}-{chr(0x10FFFF)}"
    dot, dots = rf"[.{dot}{astral}]", rf"[{dots}{astral}]"
    opener = rf"[{re.escape(_ASCII_OPENERS)}{opener}{astral}]"
    digit, both = rf"[0-9{digit}{astral}]", rf"[{both}]"
    gap = rf"[\s\\{_ASCII_HIDDEN_CLASS}{gap}{astral}]*"  # not possessive: astral is all
    return re.compile(rf"(?:{dot}{gap}{dot}|{dots}|{opener}){gap}{digit}|{both}")


def typed_markers(content: str, keep: tuple[tuple[int, int], ...] = ()) -> list[MarkerLike]:
    """The truncation-marker look-alikes in ``content``, but the real markers at ``keep``."""
    if _plain_ascii(content):
        lowered = content.lower()
        if _ASCII_MARKER_OPENING.search(lowered) is None:
            return []
        return [
            MarkerLike(*match.span(), match.start("escapes"), bool(match["escapes"]))
            for match in _ASCII_MARKER.finditer(lowered)
            if match.span() not in keep
        ]
    if _marker_prefilter().search(content) is None:
        return []
    offsets = _FoldedOffsets(content)
    found = []
    for match in _folded_marker().finditer(offsets.folded):
        start = offsets.last_reading_at(match.start())
        end = offsets.last_reading_at(match.end() - 1) + 1
        escape_at, escape_read_at = offsets.first_reading_from(match.start("escapes"))
        if escape_read_at != match.start("escapes"):
            continue  # the opener ends inside a character (U+152F reads as "·4"): no place
        if (start, end) not in keep:
            found.append(MarkerLike(start, end, escape_at, content.startswith("\\", escape_at)))
    return found


class _FoldedOffsets:
    """``content`` folded, and where the reading of each of its characters starts in the fold.

    The fold is made a chunk at a time (``str.translate``); a character's offset is computed
    only in the chunk a marker falls in, so a text pays per character only near its markers.
    ``starts(i)`` below stands for where the reading of ``content[i]`` starts (``i`` up to
    ``len(content)``); it never decreases.
    """

    _CHUNK = 128

    def __init__(self, content: str) -> None:
        self.content = content
        self.bounds: list[int] = [*range(0, len(content), self._CHUNK), len(content)]
        folds = [
            confusables.fold(content[start:end]) for start, end in itertools.pairwise(self.bounds)
        ]
        self.folded = "".join(folds)
        self.chunk_starts = list(itertools.accumulate(map(len, folds), initial=0))

    def _starts(self, chunk: int) -> list[int]:
        """``starts(i)`` for every ``i`` from the chunk's first character to the next chunk's."""
        text = self.content[self.bounds[chunk] : self.bounds[chunk + 1]]
        lengths = map(len, map(confusables.reading, text))
        return list(itertools.accumulate(lengths, initial=self.chunk_starts[chunk]))

    def last_reading_at(self, position: int) -> int:
        """The last ``i`` with ``starts(i) <= position``."""
        chunk = min(bisect.bisect_right(self.chunk_starts, position), len(self.bounds) - 1) - 1
        index: int = bisect.bisect_right(self._starts(chunk), position) - 1
        return self.bounds[chunk] + index

    def first_reading_from(self, position: int) -> tuple[int, int]:
        """The first ``i`` with ``starts(i) >= position``, and ``starts(i)``."""
        chunk = max(bisect.bisect_left(self.chunk_starts, position) - 1, 0)
        starts = self._starts(chunk)
        index = bisect.bisect_left(starts, position)
        return self.bounds[chunk] + index, starts[index]


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
