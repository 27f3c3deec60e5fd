"""A message piece ready to be budgeted: its rendered text and its size.

History selection, the fixed sections and the summary block budget the same unit, one rendered
message: its label line (a summary's header line), its escaped content and its suffix (pointer
line, blank line). :class:`SizedPiece` keeps these three apart so the counter can reuse the
content's cached token count at the seams, and counts the piece's tokens once, when first asked.

Invariant kept here: a cached count goes with a piece only while it counts the exact body that is
rendered. Escaping that changes the content drops it here; a caller that cuts the content passes
none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.prompting.addressing import WholeText
from backend.prompting.counting import TokenCounter
from backend.prompting.document import RenderedMessage
from backend.prompting.escaping import escape_content
from backend.prompting.render import message_prefix, message_suffix
from backend.prompting.report import TruncatedMessage
from backend.prompting.truncate import Preview


@dataclass(slots=True)
class SizedPiece:
    """One message piece, rendered, with its size."""

    message: RenderedMessage
    text: str
    prefix: str
    body: str
    suffix: str
    cached_tokens: int | None
    cut: Preview | None = None
    """How the content was cut from the whole text here (None: not cut, or a stored preview)."""
    truncated: TruncatedMessage | None = None
    whole_text: WholeText | None = None
    """The unstored whole text the piece's pointer line addresses (dispatch stores it)."""
    _tokens: int | None = field(default=None)

    @property
    def chars(self) -> int:
        return len(self.text)

    def tokens(self, counter: TokenCounter) -> int:
        if self._tokens is None:
            self._tokens = counter.piece(self.prefix, self.body, self.suffix, self.cached_tokens)
        return self._tokens


def sized_piece(
    message: RenderedMessage,
    content_tokens: int | None,
    *,
    last: bool = False,
    cut: Preview | None = None,
    truncated: TruncatedMessage | None = None,
    whole_text: WholeText | None = None,
    prefix: str | None = None,
) -> SizedPiece:
    """Render ``message`` as a piece; ``content_tokens`` is the cached count of its content.

    ``prefix`` replaces the label line (a summary block's header line; it ends with a newline).
    """
    body = escape_content(message.content, keep=message.markers)
    if body is not message.content:
        content_tokens = None  # escaping changed the text the cached count was for
    if prefix is None:
        prefix = message_prefix(
            message.role, message.name, failed=message.failed, steered_into=message.steered_into
        )
    suffix = message_suffix(message.artifact, last=last)
    return SizedPiece(
        message=message,
        text=prefix + body + suffix,
        prefix=prefix,
        body=body,
        suffix=suffix,
        cached_tokens=content_tokens,
        cut=cut,
        truncated=truncated,
        whole_text=whole_text,
    )
