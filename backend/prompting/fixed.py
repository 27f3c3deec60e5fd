"""The fixed sections: the Current Message and the Previous Result, never dropped, only cut.

Each is cut head + tail at its own char cap. When the fixed sections alone leave no room under
``max_tokens`` for the history's header and notice, :func:`squeeze` cuts one of them further,
still in chars.

Invariants kept here: every cut, the first and each squeeze, is made from the original text, so
the marker counts the code points removed from the original and not from an earlier cut; and a
squeeze keeps fewer code points each round (at least one fewer), so it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from backend.prompting.addressing import WholeText, pointer_to_whole
from backend.prompting.counting import TokenCounter
from backend.prompting.document import RenderedMessage, Section
from backend.prompting.inputs import ArtifactPointer, Role
from backend.prompting.pieces import SizedPiece, cut_chars, sized_piece
from backend.prompting.render import header_piece
from backend.prompting.truncate import Preview, Truncation


@dataclass(slots=True)
class FixedSection:
    """The Current Message or the Previous Result: its full text and its rendered piece."""

    section: Section
    role: Role
    name: str | None
    original: str
    original_tokens: int | None
    """Cached count of ``original``, if any and if it was computed with the policy's encoding."""
    last: bool
    cap: int | None
    artifact: ArtifactPointer | None = None
    """Where the whole text is, if stored: every cut shows a pointer line to it."""
    removed_before: int = 0
    """Characters already left out of ``original`` (a stored preview), before any cut here."""
    message_id: int | None = None
    """The turn whose text ``original`` is: a cut of unstored text points to its content
    address, and dispatch stores it there."""
    preview: Preview | None = None
    """The stored preview ``original`` renders (a spilled text): cuts are made from its head
    and tail, so the one marker keeps counting against the whole text."""
    piece: SizedPiece = field(init=False)
    shown: Preview | None = field(init=False, default=None)
    whole_text: WholeText | None = field(init=False, default=None)
    _addressed: tuple[ArtifactPointer | None, WholeText | None] | None = field(
        init=False, default=None
    )

    def __post_init__(self) -> None:
        self.recut(self.cap)

    def recut(self, cap: int | None) -> None:
        self.cap = cap
        if self.preview is not None:
            shown = self.preview
            if cap is not None and shown.kept_chars > cap:
                shown = shown.recut(cap)
            self.shown = shown
            content, markers, cut = shown.text, shown.marker_spans, None
            tokens = self.original_tokens if shown is self.preview else None
            partial = shown.removed_chars > 0
        else:
            cut = cut_chars(self.original, cap)
            content = cut.text if cut is not None else self.original
            markers = cut.marker_spans if cut is not None else ()
            tokens = self.original_tokens if cut is None else None
            partial = cut is not None or self.removed_before > 0
        pointer, self.whole_text = self._pointer() if partial else (None, None)
        message = RenderedMessage(
            role=self.role, name=self.name, content=content, artifact=pointer, markers=markers
        )
        self.piece = self._render(message, tokens, cut)

    def _render(
        self, message: RenderedMessage, tokens: int | None, cut: Truncation | None
    ) -> SizedPiece:
        """The piece for ``message`` (its cached count ``tokens``): a labelled message."""
        return sized_piece(message, tokens, last=self.last, cut=cut, whole_text=self.whole_text)

    def _pointer(self) -> tuple[ArtifactPointer | None, WholeText | None]:
        # Computed once (a squeeze recuts several times); a stored preview is never addressed
        # as if it were the whole text.
        if self._addressed is None:
            spilled = self.removed_before > 0 or self.preview is not None
            message_id = None if spilled else self.message_id
            self._addressed = pointer_to_whole(self.original, message_id, self.artifact)
        return self._addressed

    @property
    def kept_chars(self) -> int:
        if self.shown is not None:
            return self.shown.kept_chars
        return self.piece.cut.kept_chars if self.piece.cut is not None else len(self.original)

    @property
    def removed_chars(self) -> int:
        if self.shown is not None:
            return self.shown.removed_chars
        cut = self.piece.cut.removed_chars if self.piece.cut is not None else 0
        return self.removed_before + cut

    @property
    def truncated(self) -> bool:
        """Whether the model sees less than the whole text (a stored preview, or a cut here)."""
        return self.removed_chars > 0

    def section_tokens(self, counter: TokenCounter) -> int:
        return counter.constant(header_piece(self.section)) + self.piece.tokens(counter)

    def verbatim_tokens(self, counter: TokenCounter) -> int:
        if self.piece.cut is None and self.original_tokens is not None:
            return self.original_tokens
        return counter.count(self.piece.message.content)


def squeeze(
    fixed: FixedSection, target_tokens: int, measure: Callable[[FixedSection], int]
) -> bool:
    """Cut ``fixed`` further, in chars, until ``measure(fixed)`` fits ``target_tokens``.

    The new limit shrinks in proportion to the overshoot (and by at least one code point), so a
    few encodes of the bounded text suffice. Returns False when even the marker alone is too big.
    """
    limit = fixed.kept_chars
    while (tokens := measure(fixed)) > target_tokens:
        if limit == 0:
            return False
        limit = min(limit - 1, limit * max(target_tokens, 0) // tokens)
        fixed.recut(limit)
    return True
