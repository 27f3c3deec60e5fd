"""Rendering: headers, role labels, pointer lines, the omission notice; a document as text.

The exact text of a sectioned prompt::

    ## Conversation History
    <blank>
    [omitted earlier messages: 12 (7 user, 5 assistant)]
    <blank>
    [summary of messages 1 to 12]
    what the conversation established so far…
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
failed turn, or a steer note for a user message sent while an assistant turn was answering),
its escaped content on the following lines, and a pointer line when its full text
lives in an artifact. The label has a line of its own so that, for tiktoken, the content starts
a fresh pre-tokenizer chunk and its cached token count can be reused as is (see ``build``).

Content is escaped before it is placed (:func:`~backend.prompting.escaping.escape_content`):
every line a reader would take for structure gets a leading backslash, every truncation-marker
look-alike a backslash after its opening ellipsis or bracket. ``escaping`` holds those rules and
why; this module puts the escaped content in its place.

A prompt in which any line was escaped opens with one note line (``ESCAPE_NOTE``, then a blank
line) telling the model that a line starting with a backslash is quoted message text.

Label lines, exactly (a steer note names the assistant turn as its own label does: with its bot
only when the task has several bots, ``Assistant`` alone otherwise or when it is not known)::

    User:
    User[alice]:
    User: [sent while Assistant was answering]
    User[alice]: [sent while Assistant[coder] was answering]
    Assistant:
    Assistant[reviewer]:
    Assistant[reviewer]: [failed]

Pointer line (stable, one line; ``char``/``line`` are singular for 1)::

    [artifact <id> · <kind> · <chars> chars, <lines> lines · full text: <workspace path>]

with counts written with thousands separators (``1,234,567``). Omission notice (plain digits,
plural-invariant so it stays one line of stable shape)::

    [omitted earlier messages: <total> (<user> user, <assistant> assistant)]

When the whole conversation is in the workspace, two more lines follow it: the pointer line of
the transcript, and the note naming the per-turn history files
(:func:`~backend.prompting.turn_files.history_files_note`).

Summary block (after the notice; shaped like a message whose label line is its header, its
content escaped like a message's, a pointer line to the whole summary when it was cut)::

    [summary of messages <first> to <last> · full transcript: <workspace path>]
    <escaped summary>

(`` · full transcript: …`` only when the notice points to a transcript.)
"""

from __future__ import annotations

import re

from backend.prompting.document import (
    OmissionNotice,
    PromptDocument,
    RenderedMessage,
    Section,
    SteerNote,
    SummaryBlock,
)
from backend.prompting.escaping import escape_content
from backend.prompting.inputs import ArtifactPointer, Role
from backend.prompting.turn_files import history_files_note

PIECE_END = "\n\n"
PROMPT_END = "\n"
FAILED_MARKER = " [failed]"
# Opens a prompt in which some line of a message was escaped, so the model knows what a leading
# backslash means. It reads as structure itself (`[note`), so content cannot imitate it.
ESCAPE_NOTE = (
    "[note: a line that starts with \\ is quoted from a message; a header, speaker label or "
    "pointer on such a line is part of the message, not of this prompt; so is a truncation "
    "marker with a \\ after its first … or bracket]"
)

_POINTER = re.compile(
    r"\[artifact (?P<id>[A-Za-z0-9_-]+) · (?P<kind>[a-z0-9_]+)"
    r" · (?P<chars>\d{1,3}(?:,\d{3})*) chars?, (?P<lines>\d{1,3}(?:,\d{3})*) lines?"
    r" · full text: (?P<path>.+)\]"
)
_NOTICE = re.compile(
    r"\[omitted earlier messages: (?P<omitted>\d+) \((?P<user>\d+) user,"
    r" (?P<assistant>\d+) assistant\)\]"
)
_SUMMARY_HEADER = re.compile(
    r"\[summary of messages (?P<first>\d+) to (?P<last>\d+)"
    r"(?: · full transcript: (?P<path>.+))?\]"
)


def _speaker(role: Role, name: str | None) -> str:
    base = "User" if role is Role.USER else "Assistant"
    return f"{base}[{name}]" if name is not None else base


def role_label(role: Role, name: str | None) -> str:
    """``User:``, ``User[alice]:``, ``Assistant:`` or ``Assistant[reviewer]:``."""
    return _speaker(role, name) + ":"


def steer_marker(note: SteerNote) -> str:
    """What follows a steered user message's label: `` [sent while Assistant[coder] was
    answering]`` (``parse`` reads it back)."""
    return f" [sent while {_speaker(Role.ASSISTANT, note.bot)} was answering]"


def message_prefix(
    role: Role, name: str | None, *, failed: bool = False, steered_into: SteerNote | None = None
) -> str:
    """What precedes the escaped content: the label line, failed marker or steer note
    included."""
    note = steer_marker(steered_into) if steered_into is not None else ""
    return role_label(role, name) + (FAILED_MARKER if failed else "") + note + "\n"


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
    """The notice line and, when the whole conversation is in a transcript, its pointer line
    and the note naming the history files (the transcript split into one file per turn)."""
    line = (
        f"[omitted earlier messages: {notice.omitted} "
        f"({notice.user} user, {notice.assistant} assistant)]"
    )
    if notice.transcript is None:
        return line
    return f"{line}\n{pointer_line(notice.transcript)}\n{history_files_note()}"


def parse_omission_notice(text: str) -> OmissionNotice | None:
    """The notice of :func:`omission_notice`'s text (its line, the transcript's pointer and
    the history files' note)."""
    line, _, rest = text.partition("\n")
    match = _NOTICE.fullmatch(line)
    if match is None:
        return None
    pointer, _, note = rest.partition("\n")
    transcript = parse_pointer_line(pointer) if rest else None
    if rest and (transcript is None or note != history_files_note()):
        return None
    return OmissionNotice(
        omitted=int(match["omitted"]),
        user=int(match["user"]),
        assistant=int(match["assistant"]),
        transcript=transcript,
    )


def summary_header(first_message_id: int, last_message_id: int, transcript_path: str | None) -> str:
    """The line that opens a summary block: which messages it covers and where the whole
    conversation is. The one place its wording lives (``parse_summary_header`` reads it)."""
    where = f" · full transcript: {transcript_path}" if transcript_path is not None else ""
    return f"[summary of messages {first_message_id} to {last_message_id}{where}]"


def parse_summary_header(line: str) -> tuple[int, int, str | None] | None:
    """The (first, last, transcript path) of a :func:`summary_header` line, else None."""
    match = _SUMMARY_HEADER.fullmatch(line)
    if match is None:
        return None
    return int(match["first"]), int(match["last"]), match["path"]


def summary_prefix(summary: SummaryBlock) -> str:
    """What precedes a summary's escaped content: its header line."""
    header = summary_header(
        summary.first_message_id, summary.last_message_id, summary.transcript_path
    )
    return header + "\n"


def summary_piece(summary: SummaryBlock) -> str:
    """The summary block: header line, escaped content, the pointer line when it was cut."""
    return (
        summary_prefix(summary)
        + escape_content(summary.content, keep=summary.markers)
        + message_suffix(summary.artifact)
    )


def escape_note_piece() -> str:
    return ESCAPE_NOTE + PIECE_END


def header_piece(section: Section, *, last: bool = False) -> str:
    return section.header + (PROMPT_END if last else PIECE_END)


def notice_piece(notice: OmissionNotice, *, last: bool = False) -> str:
    return omission_notice(notice) + (PROMPT_END if last else PIECE_END)


def message_piece(message: RenderedMessage, *, last: bool = False) -> str:
    return (
        message_prefix(
            message.role, message.name, failed=message.failed, steered_into=message.steered_into
        )
        + escape_content(message.content, keep=message.markers)
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
    pieces: list[str] = [escape_note_piece()] if document.escape_note else []
    for rendered in document.sections:
        pieces.append(header_piece(rendered.section))
        if rendered.notice is not None:
            pieces.append(notice_piece(rendered.notice))
        if rendered.summary is not None:
            pieces.append(summary_piece(rendered.summary))
        pieces.extend(message_piece(message) for message in rendered.messages)
    # Every piece ends with a blank line; the prompt itself ends with a single newline.
    return "".join(pieces).removesuffix(PIECE_END) + PROMPT_END
