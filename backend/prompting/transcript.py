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
from backend.prompting.document import PromptDocument, RenderedMessage, RenderedSection, Section
from backend.prompting.inputs import ArtifactPointer, HistoryMessage, Role
from backend.prompting.kinds import ArtifactKind
from backend.prompting.render import escape_content, render_document


def render_transcript(
    history: Sequence[HistoryMessage], *, is_group_chat: bool, multi_bot: bool
) -> str:
    """The transcript of ``history`` (oldest first, at least one message)."""
    if not history:
        raise ValueError("a transcript needs at least one message")
    messages = tuple(
        RenderedMessage(
            role=message.role,
            name=_name(message, is_group_chat=is_group_chat, multi_bot=multi_bot),
            content=(message.error or "") if message.shows_error else message.text,
            failed=message.failed,
            artifact=message.artifact if message.preview is not None else None,
            marker=_marker(message),
        )
        for message in history
    )
    escaped = any(
        escape_content(message.content, keep=message.marker) is not message.content
        for message in messages
    )
    document = PromptDocument(
        sections=(RenderedSection(Section.HISTORY, messages),), escape_note=escaped
    )
    return render_document(document)


def transcript_pointer(text: str, *, workspace_path: str) -> ArtifactPointer:
    """The pointer line's content for a transcript stored at ``workspace_path``."""
    return ArtifactPointer(
        artifact_id=artifact_id_for(content_sha256(text)),
        kind=ArtifactKind.TRANSCRIPT,
        total_chars=len(text),
        total_lines=count_lines(text),
        workspace_path=workspace_path,
    )


def _marker(message: HistoryMessage) -> tuple[int, int] | None:
    preview = None if message.shows_error else message.preview
    return preview.marker_span if preview is not None else None


def _name(message: HistoryMessage, *, is_group_chat: bool, multi_bot: bool) -> str | None:
    if message.role is Role.USER:
        return message.sender if is_group_chat else None
    return message.bot if multi_bot else None
