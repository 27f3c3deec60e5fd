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
from backend.prompting.document import Section
from backend.prompting.inputs import ArtifactPointer, HistoryMessage, Role
from backend.prompting.kinds import ArtifactKind
from backend.prompting.render import (
    PIECE_END,
    PROMPT_END,
    escape_content,
    escape_note_piece,
    header_piece,
    message_prefix,
    message_suffix,
)


def render_transcript(
    history: Sequence[HistoryMessage], *, is_group_chat: bool, multi_bot: bool
) -> str:
    """The transcript of ``history`` (oldest first, at least one message).

    The text is what ``render_document`` makes of one Conversation History section holding
    these messages; each body is escaped once (a long conversation's transcript is its size).
    """
    if not history:
        raise ValueError("a transcript needs at least one message")
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
            )
            + body
            + message_suffix(message.artifact if message.preview is not None else None)
        )
    text = header_piece(Section.HISTORY) + "".join(pieces)
    if escaped:
        text = escape_note_piece() + text
    return text.removesuffix(PIECE_END) + PROMPT_END


def transcript_pointer(text: str, *, workspace_path: str) -> ArtifactPointer:
    """The pointer line's content for a transcript stored at ``workspace_path``."""
    return ArtifactPointer(
        artifact_id=artifact_id_for(content_sha256(text)),
        kind=ArtifactKind.TRANSCRIPT,
        total_chars=len(text),
        total_lines=count_lines(text),
        workspace_path=workspace_path,
    )


def _name(message: HistoryMessage, *, is_group_chat: bool, multi_bot: bool) -> str | None:
    if message.role is Role.USER:
        return message.sender if is_group_chat else None
    return message.bot if multi_bot else None
