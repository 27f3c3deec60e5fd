"""Kind classification for artifact text, from a bounded sample of its head and tail.

The kind tells the agent what the pointer leads to (and lets operators see what fills their
histories). Rules, first match wins:

1. `json` — the text came from a result without a `value` (Baton serialized the result), or the
   sample starts with `{` or `[` and ends with `}` or `]` after trimming whitespace.
2. `web_or_search` — HTML (`<!doctype html`, `<html`, `<body`, `<div` near the start), or search
   results: at least three lines that hold an `http://` or `https://` URL and make up at least
   a fifth of the sample's lines.
3. `command_output` — a shell prompt line (`$ ` or `> ` at line start followed by a command), a
   Python traceback, ANSI colour escapes, an `exit code`/`exit status` line, or test-runner
   summaries (`N passed`, `N failed`, `FAILED`, `ERROR:` at line start).
4. `file_or_code` — a unified diff (`diff --git`, `--- a/`, `+++ b/`, `@@ -`), or at least a fifth
   of the non-blank sample lines look like source code (definitions, imports, braces or
   statement endings).
5. `text` — anything else.

Only the first and last `SAMPLE_CHARS` code points are examined, so classifying a 50 MB log
costs the same as a 50 KB one.
"""

from __future__ import annotations

import re
from enum import StrEnum

SAMPLE_CHARS = 8_000


class ArtifactKind(StrEnum):
    """What an artifact's text is; the value appears in pointer lines and on artifact rows."""

    JSON = "json"
    WEB_OR_SEARCH = "web_or_search"
    COMMAND_OUTPUT = "command_output"
    FILE_OR_CODE = "file_or_code"
    TEXT = "text"
    TRANSCRIPT = "transcript"
    """A conversation's transcript (``transcript``): never a classification result."""


_HTML = re.compile(r"<!doctype html|<html[\s>]|<body[\s>]|<div[\s>]|<head[\s>]", re.IGNORECASE)
_URL_LINE = re.compile(r"https?://\S+")
# Command output, matched on the lower-cased sample: a line that opens with a shell prompt, a
# traceback, a test-runner summary or an error tag; an `exit code`/`exit status`; ANSI colours.
# A line start is the sample's start or a "\n" (a literal the regex engine scans for quickly).
_COMMAND_LINE = (
    r"(?:[$>#] \S|traceback \(most recent call last\):|=+ .*\b\d+ (?:passed|failed)\b"
    r"|failed|error:|npm err!|error\[e\d+\])"
)
_COMMAND_FIRST_LINE = re.compile(_COMMAND_LINE)
_COMMAND_LATER_LINE = re.compile("\n" + _COMMAND_LINE)
# Starts with its literal, so the engine scans for "exit " quickly; the word boundary before it
# is checked by hand (a leading \b would make the engine try every position).
_EXIT = re.compile(r"exit (?:code|status)\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DIFF = re.compile(r"^(?:diff --git |--- a/|\+\+\+ b/|@@ -\d)", re.MULTILINE)
_CODE_START = re.compile(
    r"\s*(?:def |class |import |from \S+ import |function |const |let |var |fn |pub |"
    r"func |package |#include|public |private |return\b|if \(|for \(|while \()"
)


def sample_text(text: str) -> str:
    """The head and tail that classification looks at."""
    if len(text) <= 2 * SAMPLE_CHARS:
        return text
    return _sample_of_ends(text, text)


def _sample_of_ends(head: str, tail: str) -> str:
    return head[:SAMPLE_CHARS] + "\n" + tail[-SAMPLE_CHARS:]


def classify_text(text: str, *, serialized_json: bool = False) -> ArtifactKind:
    """The ArtifactKind value for this text (see the module docstring for the rules)."""
    return _classify_sample(sample_text(text), serialized_json=serialized_json)


def classify_ends(head: str, tail: str, *, serialized_json: bool = False) -> ArtifactKind:
    """The kind `classify_text` gives a text longer than 2 * SAMPLE_CHARS, from its first
    code points (`head`) and its last (`tail`), at least SAMPLE_CHARS of each: the rest of
    the text is never looked at."""
    if min(len(head), len(tail)) < SAMPLE_CHARS:
        raise ValueError(f"classify_ends needs at least {SAMPLE_CHARS} code points of each end")
    return _classify_sample(_sample_of_ends(head, tail), serialized_json=serialized_json)


def _classify_sample(sample: str, *, serialized_json: bool) -> ArtifactKind:
    if serialized_json:
        return ArtifactKind.JSON
    stripped = sample.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        return ArtifactKind.JSON
    if _HTML.search(sample[:2_000]):
        return ArtifactKind.WEB_OR_SEARCH
    lines = sample.splitlines()
    if sample.count("http") >= 3:
        url_lines = sum(1 for line in lines if _URL_LINE.search(line))
        if url_lines >= 3 and url_lines * 5 >= len(lines):
            return ArtifactKind.WEB_OR_SEARCH
    if _looks_like_command_output(sample):
        return ArtifactKind.COMMAND_OUTPUT
    if _DIFF.search(sample):
        return ArtifactKind.FILE_OR_CODE
    code_lines = [line for line in lines if line.strip()]
    if code_lines and sum(1 for line in code_lines if _is_code_line(line)) * 5 >= len(code_lines):
        return ArtifactKind.FILE_OR_CODE
    return ArtifactKind.TEXT


def _looks_like_command_output(sample: str) -> bool:
    lowered = sample.lower()
    return bool(
        _COMMAND_FIRST_LINE.match(lowered)
        or _COMMAND_LATER_LINE.search(lowered)
        or _has_exit_status(lowered)
        or ("\x1b[" in sample and _ANSI.search(sample))
    )


def _has_exit_status(lowered: str) -> bool:
    """`exit code` or `exit status` starting a word."""
    for match in _EXIT.finditer(lowered):
        before = lowered[match.start() - 1 : match.start()]
        if not (before.isalnum() or before == "_"):
            return True
    return False


def _is_code_line(line: str) -> bool:
    """A definition, import or control statement opens it, or a brace or semicolon ends it."""
    return line.rstrip()[-1:] in ("{", "}", ";") or _CODE_START.match(line) is not None
