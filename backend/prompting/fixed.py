"""The fixed sections: the Current Message and the Previous Result, never dropped, only cut.

Each is cut at its own char cap the way its kind needs (``previews``: a log keeps its
traceback, JSON keeps a skeleton that parses, code is cut on line boundaries). When the fixed
sections alone leave no room under ``max_tokens`` for the history's header and notice,
:func:`squeeze` cuts one of them further, still in chars.

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
from backend.prompting.kinds import classify_text
from backend.prompting.pieces import SizedPiece, sized_piece
from backend.prompting.previews import cut_preview, recut_preview
from backend.prompting.render import header_piece
from backend.prompting.truncate import Preview


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
    """The stored preview ``original`` renders (a spilled text): cuts are made from its parts,
    so every marker keeps counting against the whole text."""
    kind: str | None = None
    """The text's kind when it is stored (its artifact's), else it is classified when cut."""
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
            kind = self._stored_kind() or classify_text(self.original)
            shown: Preview | None = recut_preview(self.preview, cap, kind)
            tokens = self.original_tokens if shown is self.preview else None
        else:
            shown = cut_preview(self.original, cap, self._stored_kind())
            tokens = self.original_tokens if shown is None else None
        self.shown = shown
        content = shown.text if shown is not None else self.original
        markers = shown.marker_spans if shown is not None else ()
        pointer, self.whole_text = self._pointer() if self.truncated else (None, None)
        message = RenderedMessage(
            role=self.role, name=self.name, content=content, artifact=pointer, markers=markers
        )
        cut = shown if self.preview is None else None
        self.piece = self._render(message, tokens, cut)

    def _stored_kind(self) -> str | None:
        if self.kind is not None:
            return self.kind
        return self.artifact.kind if self.artifact is not None else None

    def _render(
        self, message: RenderedMessage, tokens: int | None, cut: Preview | None
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
        return self.shown.kept_chars if self.shown is not None else len(self.original)

    @property
    def removed_chars(self) -> int:
        if self.preview is not None:
            assert self.shown is not None
            return self.shown.removed_chars
        cut = self.shown.removed_chars if self.shown is not None else 0
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
