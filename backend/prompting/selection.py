"""History selection: which messages of the task's history the prompt includes, and the notice.

The history's part of docs/architecture.md's "Caps, in order":

* Messages are selected newest first, up to ``max_messages``. With ``keep_first_user_message``
  the task's first user message is selected before all others: it counts against every cap and
  is the last thing dropped.
* Each selected message is cut at ``per_message_max_chars`` the way its kind needs (``previews``;
  a spilled message's stored preview is cut again from its own parts, so its markers still
  count against the original).
* Messages are dropped oldest first until the history's messages fit ``max_chars`` and, with the
  section's header and notice, the token budget the fixed sections leave. One omission notice at
  the top of the history counts what was dropped, by role.
* The window keeps whole rounds: it never opens with an assistant answer whose question was
  dropped (its pipeline's other answers included).

Invariants kept here: a selection never exceeds ``max_chars`` or its token budget. The walk goes
newest first and stops at the first message that does not fit, so besides the messages it
includes it reads only that one: its cost grows with the budget, not with the history, and a
larger budget never includes fewer messages. (One exception reads a few more: when including
every remaining message would remove the omission notice and so fit after all, they are all
included.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from backend.prompting.addressing import pointer_to_whole
from backend.prompting.counting import TokenCounter
from backend.prompting.document import OmissionNotice, RenderedMessage, Section, SteerNote
from backend.prompting.inputs import HistoryMessage, PromptInput, Role
from backend.prompting.pieces import SizedPiece, sized_piece
from backend.prompting.policy import ContextPassing, PromptPolicy
from backend.prompting.previews import cut_preview, recut_preview
from backend.prompting.render import header_piece, notice_piece
from backend.prompting.report import TruncatedMessage


@dataclass(slots=True)
class Selection:
    """The history messages chosen so far, with running totals."""

    pinned: int | None
    pieces: list[tuple[int, SizedPiece]] = field(default_factory=list)
    chars: int = 0
    tokens: int = 0
    users: int = 0

    @property
    def count(self) -> int:
        return len(self.pieces)

    @property
    def pin_held(self) -> bool:
        return self.pinned is not None and any(index == self.pinned for index, _ in self.pieces)

    def add(
        self,
        index: int,
        piece: SizedPiece,
        role: Role,
        counter: TokenCounter,
        token_budget: int | None,
    ) -> None:
        self.pieces.append((index, piece))
        self.chars += piece.chars
        if token_budget is not None:
            self.tokens += piece.tokens(counter)
        if role is Role.USER:
            self.users += 1

    def remove(
        self, index: int, role: Role, counter: TokenCounter, token_budget: int | None
    ) -> None:
        piece = next(piece for chosen, piece in self.pieces if chosen == index)
        self.pieces = [(chosen, kept) for chosen, kept in self.pieces if chosen != index]
        self.chars -= piece.chars
        if token_budget is not None:
            self.tokens -= piece.tokens(counter)
        if role is Role.USER:
            self.users -= 1

    def oldest_first(self) -> list[tuple[int, SizedPiece]]:
        return sorted(self.pieces, key=lambda item: item[0])


class HistorySection:
    """The Conversation History of one build: what it considers, selects and omits."""

    def __init__(
        self,
        prompt_input: PromptInput,
        policy: PromptPolicy,
        mode: ContextPassing,
        counter: TokenCounter,
    ) -> None:
        self.input = prompt_input
        self.policy = policy
        self.counter = counter
        # Read once: they are private attributes of a pydantic model, slow to reach.
        self.user_messages = prompt_input.user_messages
        self.assistant_messages = prompt_input.assistant_messages
        considered = self.user_messages + self.assistant_messages
        self.shown = policy.enabled and mode.includes_history and considered > 0
        self.considered = considered if self.shown else 0

    def notice(self, included_user: int, included_assistant: int) -> OmissionNotice | None:
        omitted = self.considered - included_user - included_assistant
        if omitted == 0:
            return None
        return OmissionNotice(
            omitted=omitted,
            user=self.user_messages - included_user,
            assistant=self.assistant_messages - included_assistant,
            transcript=self.input.transcript,
        )

    def overhead(self, included_user: int, included_assistant: int) -> int:
        """Tokens of the history header and the notice for this selection."""
        notice = self.notice(included_user, included_assistant)
        tokens = self.counter.constant(header_piece(Section.HISTORY))
        if notice is not None:
            tokens += self.counter.constant(notice_piece(notice))
        return tokens

    def select(self, token_budget: int | None) -> Selection:
        """Walk newest first (after the pin) and stop at the first message that does not fit."""
        history = self.input.history
        pinned = self.input.first_user_index if self.policy.keep_first_user_message else None
        selection = Selection(pinned=pinned)
        order = self._walk_order(pinned)
        for index in order:
            piece = self._piece(history[index])
            if self._fits(selection, [(index, piece)], token_budget):
                selection.add(index, piece, history[index].role, self.counter, token_budget)
                continue
            self._take_all_when_the_notice_was_the_obstacle(
                selection, index, piece, order, token_budget
            )
            break
        self._keep_whole_rounds(selection, token_budget)
        return selection

    def _keep_whole_rounds(self, selection: Selection, token_budget: int | None) -> None:
        """The window never opens with an answer whose question was left out.

        Assistant messages at the old end of the window (the pinned first message aside) whose
        preceding message is not included are dropped, as a whole round would be. Dropping only
        frees room, except that the omission notice grows by a digit or appears; should the
        history then no longer fit, the oldest message goes too, and the rule applies again.
        """
        history = self.input.history
        unloaded = self.input.earlier_user_messages + self.input.earlier_assistant_messages
        while selection.pieces:
            chosen = {index for index, _ in selection.pieces}
            window = sorted(index for index in chosen if index != selection.pinned)
            oldest = window[0] if window else None
            if (
                oldest is not None
                and history[oldest].role is Role.ASSISTANT
                and (oldest > 0 or unloaded > 0)  # it has a predecessor ...
                and oldest - 1 not in chosen  # ... that was left out
            ):
                selection.remove(oldest, Role.ASSISTANT, self.counter, token_budget)
            elif not self._fits(selection, [], token_budget):
                drop = oldest if oldest is not None else min(chosen)
                selection.remove(drop, history[drop].role, self.counter, token_budget)
            else:
                return

    def _name_for(self, message: HistoryMessage) -> str | None:
        if message.role is Role.USER:
            return message.sender if self.input.is_group_chat else None
        return message.bot if self.input.multi_bot else None

    def _steer_note(self, message: HistoryMessage) -> SteerNote | None:
        """A steered user message's note, naming the turn it was given to as that turn's
        label does."""
        if message.steered_into_message_id is None:
            return None
        return SteerNote(message.steered_into_bot if self.input.multi_bot else None)

    def _piece(self, message: HistoryMessage) -> SizedPiece:
        cap = self.policy.per_message_max_chars
        cached = message.token_count if self.counter.cached_counts_apply else None
        preview = None if message.shows_error else message.preview
        truncated = None
        # Only a cut shows a pointer: to the stored artifact, else to the content address of
        # the whole text (which dispatch then stores). A spilled message is always cut.
        pointer, whole = None, None
        markers: tuple[tuple[int, int], ...] = ()
        kind = message.artifact.kind if message.artifact is not None else None
        if preview is not None:
            if cap is not None and preview.kept_chars > cap:
                assert kind is not None  # a spilled message has its artifact
                preview = recut_preview(preview, cap, kind)
                content, cached = preview.text, None
            else:
                content = message.text
            if preview.removed_chars > 0:
                pointer, markers = message.artifact, preview.marker_spans
                truncated = TruncatedMessage(
                    message_id=message.message_id,
                    original_chars=preview.total_chars,
                    kept_chars=preview.kept_chars,
                    removed_chars=preview.removed_chars,
                )
        else:
            source = message.error if message.shows_error else message.text
            assert source is not None
            if message.shows_error:
                cached = None
            cut = cut_preview(source, cap, None if message.shows_error else kind)
            content = source
            if cut is not None:
                content, cached, markers = cut.text, None, cut.marker_spans
                # A failed turn's error is not the turn's stored text: it has no artifact.
                pointer, whole = pointer_to_whole(
                    source,
                    None if message.shows_error else message.message_id,
                    None if message.shows_error else message.artifact,
                )
                truncated = TruncatedMessage(
                    message_id=message.message_id,
                    original_chars=len(source),
                    kept_chars=cut.kept_chars,
                    removed_chars=cut.removed_chars,
                )
        rendered = RenderedMessage(
            role=message.role,
            name=self._name_for(message),
            content=content,
            failed=message.failed,
            artifact=pointer,
            markers=markers,
            steered_into=self._steer_note(message),
        )
        return sized_piece(rendered, cached, truncated=truncated, whole_text=whole)

    def _walk_order(self, pinned: int | None) -> Iterator[int]:
        """History indices in the order they are considered: the pin, then newest first."""
        history = self.input.history
        limit = self.policy.max_messages if self.policy.max_messages is not None else len(history)
        produced = 0
        if pinned is not None and limit > 0:
            yield pinned
            produced += 1
        for index in range(len(history) - 1, -1, -1):
            if produced >= limit:
                return
            if index != pinned:
                yield index
                produced += 1

    def _fits(
        self, selection: Selection, extra: list[tuple[int, SizedPiece]], token_budget: int | None
    ) -> bool:
        max_chars = self.policy.max_chars
        if max_chars is not None and selection.chars + sum(p.chars for _, p in extra) > max_chars:
            return False
        if token_budget is not None:
            users = selection.users + sum(
                1 for index, _ in extra if self.input.history[index].role is Role.USER
            )
            assistants = selection.count + len(extra) - users
            tokens = selection.tokens + sum(piece.tokens(self.counter) for _, piece in extra)
            tokens += self.counter.constant(header_piece(Section.HISTORY))
            notice = self.notice(users, assistants)
            if notice is not None:
                text = notice_piece(notice)
                # A token is at least one byte: count the notice only when its size matters.
                if tokens + len(text.encode()) > token_budget:
                    tokens += self.counter.count(text)
            if tokens > token_budget:
                return False
        return True

    def _take_all_when_the_notice_was_the_obstacle(
        self,
        selection: Selection,
        index: int,
        piece: SizedPiece,
        order: Iterator[int],
        token_budget: int | None,
    ) -> None:
        """Include every remaining message when that removes the notice and so fits after all.

        Dropping oldest-first stops at the first selection that fits. The selection of *all*
        messages needs no omission notice, so it can fit where a shorter one did not, when the
        remaining messages are together smaller than the notice. Only then is this reached past
        the first few remaining messages, so the work stays bounded by the notice's size.
        """
        if token_budget is None or self.considered != len(self.input.history):
            return
        max_messages = self.policy.max_messages
        if max_messages is not None and max_messages < len(self.input.history):
            return
        floor = self.counter.constant(header_piece(Section.HISTORY))
        max_chars = self.policy.max_chars
        extra = [(index, piece)]
        chars, tokens = selection.chars + piece.chars, selection.tokens + piece.tokens(self.counter)
        for next_index in order:
            if floor + tokens > token_budget or (max_chars is not None and chars > max_chars):
                return
            next_piece = self._piece(self.input.history[next_index])
            extra.append((next_index, next_piece))
            chars += next_piece.chars
            tokens += next_piece.tokens(self.counter)
        if self._fits(selection, extra, token_budget):
            for extra_index, extra_piece in extra:
                role = self.input.history[extra_index].role
                selection.add(extra_index, extra_piece, role, self.counter, token_budget)
