"""The transcript: the whole conversation before the current message, in the prompt's own format.

When a prompt's history leaves messages out, its omission notice points to this text, which the
executor finds in its workspace (``.baton/history/task-<id>.md``), so an agent can read what was
dropped — the way a summarizing agent keeps its full thread on disk. It is a Conversation History
section with nothing dropped and nothing cut by a cap: each message as its turn stored it (a
spilled text as its preview, ending with the pointer to its artifact), every content line that
would read as structure escaped, and the escape note first when one was. ``parse_prompt`` reads
it back. It is addressed by its content, so an unchanged transcript is not sent again.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.prompting.addressing import artifact_id_for, content_sha256, count_lines
from backend.prompting.document import Section, SteerNote
from backend.prompting.escaping import escape_content
from backend.prompting.inputs import ArtifactPointer, HistoryMessage, Role
from backend.prompting.kinds import ArtifactKind
from backend.prompting.render import (
    PIECE_END,
    PROMPT_END,
    escape_note_piece,
    header_piece,
    message_prefix,
    message_suffix,
)


def render_transcript(
    history: Sequence[HistoryMessage],
    *,
    is_group_chat: bool,
    multi_bot: bool,
    escape_note: bool = False,
) -> str:
    """The transcript of ``history`` (oldest first, at least one message).

    The text is what ``render_document`` makes of one Conversation History section holding
    these messages; each body is escaped once (a long conversation's transcript is its size).
    The escape note opens it when a line was escaped, or always with ``escape_note`` (the form
    of a transcript rendered in parts, which is exactly the concatenation of its parts).
    """
    if not history:
        raise ValueError("a transcript needs at least one message")
    body, escaped = _pieces(history, is_group_chat=is_group_chat, multi_bot=multi_bot)
    text = _opening(escape_note=escaped or escape_note) + body
    return text.removesuffix(PIECE_END) + PROMPT_END


def render_transcript_part(
    history: Sequence[HistoryMessage], *, opens: bool, is_group_chat: bool, multi_bot: bool
) -> str:
    """One sealed part of a transcript rendered in parts: its messages, each ending as one
    that more messages follow. The first part (``opens``) starts with the escape note, always
    (a later part may escape a line, and a sealed part never changes), and the header.

    The parts in order, then ``render_transcript_tail`` of the messages after them, are
    ``render_transcript(..., escape_note=True)`` of all the messages.
    """
    if not history:
        raise ValueError("a transcript part needs at least one message")
    body, _ = _pieces(history, is_group_chat=is_group_chat, multi_bot=multi_bot)
    return (_opening(escape_note=True) if opens else "") + body


def render_transcript_tail(
    history: Sequence[HistoryMessage], *, is_group_chat: bool, multi_bot: bool
) -> str:
    """The messages after a transcript's sealed parts, the last one ending the transcript."""
    if not history:
        raise ValueError("a transcript's tail needs at least one message")
    body, _ = _pieces(history, is_group_chat=is_group_chat, multi_bot=multi_bot)
    return body.removesuffix(PIECE_END) + PROMPT_END


def _opening(*, escape_note: bool) -> str:
    return (escape_note_piece() if escape_note else "") + header_piece(Section.HISTORY)


def _pieces(
    history: Sequence[HistoryMessage], *, is_group_chat: bool, multi_bot: bool
) -> tuple[str, bool]:
    """The messages' pieces, each ending with ``PIECE_END``, and whether a line was escaped."""
    pieces: list[str] = []
    escaped = False
    for message in history:
        content = (message.error or "") if message.shows_error else message.text
        preview = None if message.shows_error else message.preview
        body = escape_content(content, keep=preview.marker_spans if preview else ())
        escaped = escaped or body is not content
        pieces.append(
            message_prefix(
                message.role,
                _name(message, is_group_chat=is_group_chat, multi_bot=multi_bot),
                failed=message.failed,
                steered_into=_steer_note(message, multi_bot=multi_bot),
            )
            + body
            + message_suffix(message.artifact if message.preview is not None else None)
        )
    return "".join(pieces), escaped


def transcript_pointer(text: str, *, workspace_path: str) -> ArtifactPointer:
    """The pointer line's content for a transcript stored at ``workspace_path``."""
    return ArtifactPointer(
        artifact_id=artifact_id_for(content_sha256(text)),
        kind=ArtifactKind.TRANSCRIPT,
        total_chars=len(text),
        total_lines=count_lines(text),
        workspace_path=workspace_path,
    )


def _steer_note(message: HistoryMessage, *, multi_bot: bool) -> SteerNote | None:
    if message.steered_into_message_id is None:
        return None
    return SteerNote(message.steered_into_bot if multi_bot else None)


def _name(message: HistoryMessage, *, is_group_chat: bool, multi_bot: bool) -> str | None:
    if message.role is Role.USER:
        return message.sender if is_group_chat else None
    return message.bot if multi_bot else None
