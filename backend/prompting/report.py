"""What a build tells the rest of Baton about the prompt it made — never the prompt text.

The dispatch app stores a :class:`BuildReport` per dispatch as a PromptReport and the admin
draws a budget bar from ``history_tokens`` / ``current_tokens`` / ``previous_result_tokens``. It
holds counts, sizes, ids and flags only (docs/architecture.md, principle 7), and ``to_dict()``
is JSON-safe.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class TruncatedMessage(BaseModel):
    """A history message whose content the model sees cut (head + marker + tail)."""

    model_config = ConfigDict(frozen=True)

    message_id: int
    original_chars: int
    kept_chars: int
    removed_chars: int


class BuildReport(BaseModel):
    """Counts and flags describing one built prompt."""

    model_config = ConfigDict(frozen=True)

    messages_considered: int
    """History turns the context-passing mode put in play (0 when history is not shown)."""
    messages_included: int
    messages_omitted: int
    omitted_user: int
    omitted_assistant: int
    included_message_ids: tuple[int, ...]
    truncated: tuple[TruncatedMessage, ...]
    sections: tuple[str, ...]
    """Titles of the sections present, in order; a verbatim prompt reports "Current Message"."""
    verbatim: bool
    """The prompt is the current message's text alone, without headers or labels."""
    context_passing: str
    chars: int
    bytes: int
    """UTF-8 size of the prompt: what an executor's stdin or a request body must carry."""
    tokens: int
    token_encoding: str
    history_chars: int
    """Characters of the history's messages (labels, content, pointer lines, blank lines)."""
    history_tokens: int
    """Tokens of the Conversation History section: header, omission notice, summary block and
    messages.

    ``history_tokens + current_tokens + previous_result_tokens + note_tokens == tokens`` for the
    encodings in ``SEAM_SAFE_ENCODINGS``; for others ``tokens`` is the exact count of the whole
    prompt and the split is the sum of separately counted pieces.
    """
    current_tokens: int
    previous_result_tokens: int
    note_tokens: int = 0
    """Tokens of the escape note that opens the prompt when a line was escaped (else 0)."""
    summary_included: bool = False
    """The history shows a summary of earlier messages after its omission notice."""
    summary_first_message_id: int | None = None
    summary_last_message_id: int | None = None
    """The messages the included summary covers (None without one)."""
    summary_tokens: int = 0
    """Tokens of the summary block (part of ``history_tokens``)."""
    summary_removed_chars: int = 0
    """Characters of the whole summary the block leaves out (0: shown whole)."""
    artifacts: tuple[str, ...]
    first_user_message_pinned: bool
    current_truncated: bool
    current_removed_chars: int
    previous_result_truncated: bool
    previous_result_removed_chars: int

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
