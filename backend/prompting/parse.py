"""Reading a prompt back into its structure.

:func:`parse_prompt` is the inverse of rendering: for every prompt Baton builds,
``parse_prompt(build.text) == build.document``. It is how tests prove that content cannot forge
a role boundary, and how tools can show a stored prompt message by message.

Rules it relies on (see ``render`` and ``escaping``): a prompt may open with the escape note; a
prompt whose first line is neither that note nor a section header is a verbatim first-turn
prompt (one user message, no label). Otherwise boundaries are lines that
are exactly a section header or a role label line (``Assistant[bot]: [failed]`` for a failed
turn); content lines that would look like either are escaped, so every such line is real
structure; a user message's label line may end with its steer note (``User[alice]: [sent
while Assistant[coder] was answering]``). Every piece ends with a blank line except the last,
which ends with a single newline. The last line of a message is its artifact pointer when it
parses as one. After the history's omission notice (which never holds a blank line) may come a
summary block: its header line, its escaped content and, when it was cut, its pointer line, up
to the next boundary.
"""

from __future__ import annotations

import re

from backend.prompting.document import (
    OmissionNotice,
    PromptDocument,
    RenderedMessage,
    RenderedSection,
    Section,
    SteerNote,
    SummaryBlock,
)
from backend.prompting.escaping import unescape_with_markers
from backend.prompting.inputs import ArtifactPointer, Role
from backend.prompting.render import (
    PIECE_END,
    PROMPT_END,
    escape_note_piece,
    parse_omission_notice,
    parse_pointer_line,
    parse_summary_header,
    starts_with_header_line,
)

_BOUNDARY = re.compile(
    r"^(?:## (?P<section>Conversation History|Current Message|Previous Result)$"
    r"|(?P<role>User|Assistant)(?:\[(?P<name>[^\[\]\n]+)\])?:(?P<failed> \[failed\])?"
    r"(?P<steered> \[sent while Assistant(?:\[(?P<steered_into>[^\[\]\n]+)\])?"
    r" was answering\])?\n)",
    re.MULTILINE,
)
_ORDER = (Section.HISTORY, Section.CURRENT, Section.PREVIOUS_RESULT)


class PromptParseError(ValueError):
    """The text is not a prompt Baton renders."""


def _body(raw: str) -> tuple[str, tuple[tuple[int, int], ...], ArtifactPointer | None]:
    """A message's or summary's content, its markers' spans and its ending pointer line."""
    artifact: ArtifactPointer | None = None
    last_break = raw.rfind("\n")
    if last_break != -1:
        artifact = parse_pointer_line(raw[last_break + 1 :])
        if artifact is not None:
            raw = raw[:last_break]
    content, markers = unescape_with_markers(raw)
    return content, markers, artifact


def _message(
    role: str, name: str | None, failed: bool, steered_into: SteerNote | None, raw: str
) -> RenderedMessage:
    content, markers, artifact = _body(raw)
    return RenderedMessage(
        role=Role.USER if role == "User" else Role.ASSISTANT,
        name=name,
        content=content,
        failed=failed,
        artifact=artifact,
        markers=markers,
        steered_into=steered_into,
    )


def _notice(section: Section, rest: str) -> tuple[OmissionNotice | None, SummaryBlock | None]:
    """The notice and the summary block between a section's header and its first message."""
    if not rest:
        return None, None
    notice, summary = None, None
    if section is Section.HISTORY and rest.endswith(PIECE_END):
        notice_text, _, summary_text = rest[: -len(PIECE_END)].partition(PIECE_END)
        notice = parse_omission_notice(notice_text)
        if notice is not None and summary_text:
            summary = _summary(summary_text)
            if summary is None:
                notice = None
    if notice is None:
        raise PromptParseError(f"unexpected text after the {section.value!r} header")
    return notice, summary


def _summary(text: str) -> SummaryBlock | None:
    header, newline, raw = text.partition("\n")
    parsed = parse_summary_header(header)
    if parsed is None or not newline:
        return None
    first, last, transcript_path = parsed
    content, markers, artifact = _body(raw)
    return SummaryBlock(
        first_message_id=first,
        last_message_id=last,
        content=content,
        transcript_path=transcript_path,
        artifact=artifact,
        markers=markers,
    )


def parse_prompt(text: str) -> PromptDocument:
    """The sections, notice and messages of ``text`` exactly as they were rendered."""
    escape_note = text.startswith(escape_note_piece())
    if escape_note:
        text = text[len(escape_note_piece()) :]
        if not starts_with_header_line(text):
            raise PromptParseError("the escape note is followed by a section header")
    if not starts_with_header_line(text):
        message = RenderedMessage(role=Role.USER, name=None, content=text)
        return PromptDocument(
            sections=(RenderedSection(Section.CURRENT, (message,)),), verbatim=True
        )
    if not text.endswith(PROMPT_END):
        raise PromptParseError("a sectioned prompt ends with a newline")
    # With one more newline, every piece (the last one included) ends with a blank line.
    body = text + PIECE_END[len(PROMPT_END) :]
    boundaries = list(_BOUNDARY.finditer(body))

    sections: list[RenderedSection] = []
    current: Section | None = None
    notice: OmissionNotice | None = None
    summary: SummaryBlock | None = None
    messages: list[RenderedMessage] = []

    def close() -> None:
        if current is not None:
            if not messages and notice is None:
                raise PromptParseError(f"empty {current.value!r} section")
            sections.append(RenderedSection(current, tuple(messages), notice, summary))

    for position, boundary in enumerate(boundaries):
        end = boundaries[position + 1].start() if position + 1 < len(boundaries) else len(body)
        chunk = body[boundary.end() : end]
        if boundary["section"] is not None:
            close()
            section = Section(boundary["section"])
            previous_rank = _ORDER.index(current) if current is not None else -1
            if _ORDER.index(section) <= previous_rank:
                raise PromptParseError(f"section {section.value!r} out of order")
            if not chunk.startswith(PIECE_END):
                raise PromptParseError(f"{section.value!r} header must be followed by a blank line")
            notice, summary = _notice(section, chunk[len(PIECE_END) :])
            current, messages = section, []
            continue
        if current is None or not chunk.endswith(PIECE_END):
            raise PromptParseError("a message must sit in a section and end with a blank line")
        failed = boundary["failed"] is not None
        if failed and boundary["role"] != "Assistant":
            raise PromptParseError("only assistant turns can be failed")
        steered_into = None
        if boundary["steered"] is not None:
            if boundary["role"] != "User":
                raise PromptParseError("only user messages are steered into a running turn")
            steered_into = SteerNote(boundary["steered_into"])
        raw = chunk[: -len(PIECE_END)]
        messages.append(_message(boundary["role"], boundary["name"], failed, steered_into, raw))
    close()
    return PromptDocument(sections=tuple(sections), escape_note=escape_note)
