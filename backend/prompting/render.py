"""Rendering: headers, role labels, escaping, pointer lines and the omission notice.

The exact text of a sectioned prompt::

    ## Conversation History
    <blank>
    [omitted earlier messages: 12 (7 user, 5 assistant)]
    <blank>
    User[alice]:
    first line of the content
    more lines…
    [artifact 9f2c4e1a7b3d · command_output · 1,234,567 chars, 20,345 lines · full text: …]
    <blank>
    Assistant[reviewer]: [failed]
    the error message
    <blank>
    ## Current Message
    <blank>
    User[alice]:
    …
    <blank>
    ## Previous Result
    <blank>
    Assistant[coder]:
    …

Every piece — a header, the notice, a message — ends with one blank line (``"\n\n"``), except
the last piece of the prompt, which ends with a single ``"\n"``. A message is its label line
(``User:``, ``User[alice]:``, ``Assistant:`` or ``Assistant[bot]:``, then `` [failed]`` for a
failed turn), its escaped content on the following lines, and a pointer line when its full text
lives in an artifact. The label has a line of its own so that, for tiktoken, the content starts
a fresh pre-tokenizer chunk and its cached token count can be reused as is (see ``build``).

Escaping keeps role boundaries unforgeable. At the start of every line of content (after any of
``\n \r \v \f \x1c \x1d \x1e \x85 U+2028 U+2029``, so a model that breaks lines elsewhere is
covered too), a line that begins with zero or more backslashes followed by something structural —
a section header, ``User:``/``User[``, ``Assistant:``/``Assistant[``, ``[artifact `` or
``[omitted `` — gets one more backslash. Unescaping removes one backslash from lines that begin
with one or more backslashes and then such structure. Lines that do not look structural are never
touched, so the mapping is exactly reversible.

Pointer line (stable, one line; ``char``/``line`` are singular for 1)::

    [artifact <id> · <kind> · <chars> chars, <lines> lines · full text: <workspace path>]

with counts written with thousands separators (``1,234,567``). Omission notice (plain digits,
plural-invariant so it stays one line of stable shape)::

    [omitted earlier messages: <total> (<user> user, <assistant> assistant)]
"""

from __future__ import annotations

import re

from backend.prompting.document import OmissionNotice, PromptDocument, RenderedMessage, Section
from backend.prompting.inputs import ArtifactPointer, Role

PIECE_END = "\n\n"
PROMPT_END = "\n"
FAILED_MARKER = " [failed]"

_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_STRUCTURE = (
    r"(?:## (?:Conversation History|Current Message|Previous Result)"
    r"|(?:User|Assistant)[\[:]"
    r"|\[(?:artifact |omitted ))"
)
_NEEDS_ESCAPE_AT_START = re.compile(rf"\\*{_STRUCTURE}")
_NEEDS_ESCAPE_INSIDE = re.compile(rf"[{_LINE_BREAKS}]\\*{_STRUCTURE}")
_ESCAPE_POSITION = re.compile(rf"(?:\A|(?<=[{_LINE_BREAKS}]))(?=\\*{_STRUCTURE})")
_UNESCAPE_POSITION = re.compile(rf"(?:\A|(?<=[{_LINE_BREAKS}]))\\(?=\\*{_STRUCTURE})")

_POINTER = re.compile(
    r"\[artifact (?P<id>[A-Za-z0-9_-]+) · (?P<kind>[a-z0-9_]+)"
    r" · (?P<chars>\d{1,3}(?:,\d{3})*) chars?, (?P<lines>\d{1,3}(?:,\d{3})*) lines?"
    r" · full text: (?P<path>.+)\]"
)
_NOTICE = re.compile(
    r"\[omitted earlier messages: (?P<omitted>\d+) \((?P<user>\d+) user,"
    r" (?P<assistant>\d+) assistant\)\]"
)


# Every structural prefix contains one of these; plain substring checks are far cheaper than the
# regular expression, and most content contains none of them.
_STRUCTURE_WORDS = ("User", "Assistant", "## ", "[artifact ", "[omitted ")


def needs_escape(content: str) -> bool:
    """Whether any line of ``content`` would read as structure (cheap check before escaping)."""
    if not any(word in content for word in _STRUCTURE_WORDS):
        return False
    return bool(_NEEDS_ESCAPE_AT_START.match(content) or _NEEDS_ESCAPE_INSIDE.search(content))


def escape_content(content: str) -> str:
    """Prefix one backslash to every content line that would read as structure."""
    if not needs_escape(content):
        return content
    return _ESCAPE_POSITION.sub("\\\\", content)


def unescape_content(content: str) -> str:
    """Exact inverse of :func:`escape_content`."""
    if "\\" not in content:
        return content
    return _UNESCAPE_POSITION.sub("", content)


def role_label(role: Role, name: str | None) -> str:
    """``User:``, ``User[alice]:``, ``Assistant:`` or ``Assistant[reviewer]:``."""
    base = "User" if role is Role.USER else "Assistant"
    return f"{base}[{name}]:" if name is not None else f"{base}:"


def message_prefix(role: Role, name: str | None, *, failed: bool = False) -> str:
    """What precedes the escaped content: the label line, failed marker included."""
    return role_label(role, name) + (FAILED_MARKER if failed else "") + "\n"


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def pointer_line(artifact: ArtifactPointer) -> str:
    """The one-line pointer to an artifact's full text in the executor's workspace."""
    return (
        f"[artifact {artifact.artifact_id} · {artifact.kind} · "
        f"{_plural(artifact.total_chars, 'char')}, {_plural(artifact.total_lines, 'line')} · "
        f"full text: {artifact.workspace_path}]"
    )


def parse_pointer_line(line: str) -> ArtifactPointer | None:
    match = _POINTER.fullmatch(line)
    if match is None:
        return None
    return ArtifactPointer(
        artifact_id=match["id"],
        kind=match["kind"],
        total_chars=int(match["chars"].replace(",", "")),
        total_lines=int(match["lines"].replace(",", "")),
        workspace_path=match["path"],
    )


def message_suffix(artifact: ArtifactPointer | None, *, last: bool = False) -> str:
    """What follows the escaped content: the pointer line, if any, and the piece end."""
    end = PROMPT_END if last else PIECE_END
    return f"\n{pointer_line(artifact)}{end}" if artifact is not None else end


def omission_notice(notice: OmissionNotice) -> str:
    return (
        f"[omitted earlier messages: {notice.omitted} "
        f"({notice.user} user, {notice.assistant} assistant)]"
    )


def parse_omission_notice(line: str) -> OmissionNotice | None:
    match = _NOTICE.fullmatch(line)
    if match is None:
        return None
    return OmissionNotice(
        omitted=int(match["omitted"]), user=int(match["user"]), assistant=int(match["assistant"])
    )


def header_piece(section: Section, *, last: bool = False) -> str:
    return section.header + (PROMPT_END if last else PIECE_END)


def notice_piece(notice: OmissionNotice, *, last: bool = False) -> str:
    return omission_notice(notice) + (PROMPT_END if last else PIECE_END)


def message_piece(message: RenderedMessage, *, last: bool = False) -> str:
    return (
        message_prefix(message.role, message.name, failed=message.failed)
        + escape_content(message.content)
        + message_suffix(message.artifact, last=last)
    )


def starts_with_header_line(text: str) -> bool:
    """Whether ``text``'s first line is a section header (then it cannot be sent verbatim)."""
    first_line = text.split("\n", 1)[0]
    return any(first_line == section.header for section in Section)


def render_document(document: PromptDocument) -> str:
    """The prompt text of ``document`` (see the module docstring for the exact shape)."""
    if document.verbatim:
        return document.sections[0].messages[0].content
    pieces: list[str] = []
    for rendered in document.sections:
        pieces.append(header_piece(rendered.section))
        if rendered.notice is not None:
            pieces.append(notice_piece(rendered.notice))
        pieces.extend(message_piece(message) for message in rendered.messages)
    # Every piece ends with a blank line; the prompt itself ends with a single newline.
    return "".join(pieces).removesuffix(PIECE_END) + PROMPT_END
