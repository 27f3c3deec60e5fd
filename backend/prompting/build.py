"""Building one prompt: choose what fits, cut what is too long, count it exactly, render it.

The contract is DESIGN.md's "The prompt" and "Caps and the order they apply":

1. The Current Message and the Previous Result are fixed: each is cut head + tail at its own
   char cap (``current_message_max_chars``, ``previous_result_max_chars``) and never dropped.
2. History messages are selected newest first, up to ``max_messages``. With
   ``keep_first_user_message`` the task's first user message is selected before all others: it
   counts against every cap and is the last thing dropped.
3. Each selected message is cut at ``per_message_max_chars`` (a spilled message's stored preview
   is re-cut from its own head and tail, so its marker still counts against the original).
4. Messages are dropped oldest first until the history's messages fit ``max_chars`` and the whole
   prompt fits ``max_tokens``. The walk goes newest first and stops at the first message that
   does not fit, so besides the messages it includes it reads only that one: its cost grows
   with the budget, not with the history, and a larger budget never includes fewer messages.
   (One exception reads a few more: when including every remaining message would remove the
   omission notice and so fit after all, they are all included.) One omission notice at the top
   of the history counts what was dropped, by role.
5. If the fixed sections alone leave no room under ``max_tokens`` for the history header and its
   notice, the Previous Result and then the Current Message are cut further (in chars, so the
   marker keeps counting code points of the original), and the history then carries only its
   header and notice. (Filling what the cut leaves over would let a larger budget, which cuts
   the fixed sections less, include fewer history messages.)

What ``max_chars`` bounds: the characters of the history's message pieces (labels, content,
markers, pointer lines and the blank line after each), not the section header or the notice.
What ``max_tokens`` bounds: the whole prompt.

Token counting is exact without encoding the prompt: for seam-safe encodings the pieces' counts
add up (see ``counting``). For other encodings the finished prompt is encoded once to verify,
and the build is redone with the overshoot held back if it exceeded ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from backend.prompting.counting import TokenCounter
from backend.prompting.document import (
    OmissionNotice,
    PromptDocument,
    RenderedMessage,
    RenderedSection,
    Section,
)
from backend.prompting.fixed import FixedSection, squeeze
from backend.prompting.inputs import HistoryMessage, PromptInput, Role
from backend.prompting.pieces import SizedPiece, cut_chars, sized_piece
from backend.prompting.policy import ContextPassing, HistoryPolicy
from backend.prompting.render import header_piece, notice_piece, starts_with_header_line
from backend.prompting.report import BuildReport, TruncatedMessage

_VERIFY_ROUNDS = 4


class PromptBudgetError(ValueError):
    """``max_tokens`` cannot hold even the prompt's structure (headers, labels, markers)."""


@dataclass(frozen=True, slots=True)
class PromptBuild:
    """The prompt text, its structure and a report of what went in and what was left out."""

    text: str
    report: BuildReport
    document: PromptDocument


@dataclass(slots=True)
class _Selection:
    """The history messages chosen so far, with running totals."""

    pinned: int | None
    parts: list[tuple[int, SizedPiece]] = field(default_factory=list)
    chars: int = 0
    tokens: int = 0
    users: int = 0

    @property
    def count(self) -> int:
        return len(self.parts)

    @property
    def pin_held(self) -> bool:
        return self.pinned is not None and any(index == self.pinned for index, _ in self.parts)

    def add(
        self,
        index: int,
        part: SizedPiece,
        role: Role,
        counter: TokenCounter,
        token_budget: int | None,
    ) -> None:
        self.parts.append((index, part))
        self.chars += part.chars
        if token_budget is not None:
            self.tokens += part.tokens(counter)
        if role is Role.USER:
            self.users += 1

    def oldest_first(self) -> list[tuple[int, SizedPiece]]:
        return sorted(self.parts, key=lambda item: item[0])


class _Builder:
    def __init__(
        self,
        prompt_input: PromptInput,
        policy: HistoryPolicy,
        mode: ContextPassing,
        counter: TokenCounter,
        token_slack: int,
    ) -> None:
        self.input = prompt_input
        self.policy = policy
        self.mode = mode
        self.counter = counter
        self.max_tokens = policy.max_tokens - token_slack if policy.max_tokens is not None else None
        # Read once: they are private attributes of a pydantic model, slow to reach.
        self.user_messages = prompt_input.user_messages
        self.assistant_messages = prompt_input.assistant_messages
        considered = self.user_messages + self.assistant_messages
        self.show_history = policy.enabled and mode.includes_history and considered > 0
        self.considered = considered if self.show_history else 0
        self.show_previous = (
            mode.includes_previous_result and prompt_input.previous_result is not None
        )
        self.show_current = mode.includes_current or not self.show_previous

    # -- fixed sections -------------------------------------------------------------------------

    def _fixed(
        self,
        section: Section,
        role: Role,
        name: str | None,
        text: str,
        text_tokens: int | None,
        cap: int | None,
        *,
        last: bool,
    ) -> FixedSection:
        tokens = text_tokens if self.counter.cached_counts_apply else None
        return FixedSection(section, role, name, text, tokens, last, cap)

    # -- history --------------------------------------------------------------------------------

    def _name_for(self, message: HistoryMessage) -> str | None:
        if message.role is Role.USER:
            return message.sender if self.input.is_group_chat else None
        return message.bot if self.input.multi_bot else None

    def _history_part(self, message: HistoryMessage) -> SizedPiece:
        cap = self.policy.per_message_max_chars
        cached = message.token_count if self.counter.cached_counts_apply else None
        preview = None if message.shows_error else message.preview
        truncated = None
        if preview is not None:
            if cap is not None and preview.kept_chars > cap:
                preview = preview.recut(cap)
                content, cached = preview.text, None
            else:
                content = message.text
            if preview.removed_chars > 0:
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
            cut = cut_chars(source, cap)
            content = source
            if cut is not None:
                content, cached = cut.text, None
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
            artifact=message.artifact,
        )
        return sized_piece(rendered, cached, truncated=truncated)

    def _notice(self, included_user: int, included_assistant: int) -> OmissionNotice | None:
        omitted = self.considered - included_user - included_assistant
        if omitted == 0:
            return None
        return OmissionNotice(
            omitted=omitted,
            user=self.user_messages - included_user,
            assistant=self.assistant_messages - included_assistant,
        )

    def _history_overhead(self, included_user: int, included_assistant: int) -> int:
        """Tokens of the history header and the notice for this selection."""
        notice = self._notice(included_user, included_assistant)
        tokens = self.counter.constant(header_piece(Section.HISTORY))
        if notice is not None:
            tokens += self.counter.constant(notice_piece(notice))
        return tokens

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
        self, selection: _Selection, extra: list[tuple[int, SizedPiece]], token_budget: int | None
    ) -> bool:
        max_chars = self.policy.max_chars
        if max_chars is not None and selection.chars + sum(p.chars for _, p in extra) > max_chars:
            return False
        if token_budget is not None:
            users = selection.users + sum(
                1 for index, _ in extra if self.input.history[index].role is Role.USER
            )
            assistants = selection.count + len(extra) - users
            tokens = selection.tokens + sum(part.tokens(self.counter) for _, part in extra)
            tokens += self.counter.constant(header_piece(Section.HISTORY))
            notice = self._notice(users, assistants)
            if notice is not None:
                text = notice_piece(notice)
                # A token is at least one byte: count the notice only when its size matters.
                if tokens + len(text.encode()) > token_budget:
                    tokens += self.counter.count(text)
            if tokens > token_budget:
                return False
        return True

    def _select_history(self, token_budget: int | None) -> _Selection:
        """Walk newest first (after the pin) and stop at the first message that does not fit."""
        history = self.input.history
        pinned = self.input.first_user_index if self.policy.keep_first_user_message else None
        selection = _Selection(pinned=pinned)
        order = self._walk_order(pinned)
        for index in order:
            part = self._history_part(history[index])
            if self._fits(selection, [(index, part)], token_budget):
                selection.add(index, part, history[index].role, self.counter, token_budget)
                continue
            self._take_all_when_the_notice_was_the_obstacle(
                selection, index, part, order, token_budget
            )
            break
        return selection

    def _take_all_when_the_notice_was_the_obstacle(
        self,
        selection: _Selection,
        index: int,
        part: SizedPiece,
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
        extra = [(index, part)]
        chars, tokens = selection.chars + part.chars, selection.tokens + part.tokens(self.counter)
        for next_index in order:
            if floor + tokens > token_budget or (max_chars is not None and chars > max_chars):
                return
            next_part = self._history_part(self.input.history[next_index])
            extra.append((next_index, next_part))
            chars += next_part.chars
            tokens += next_part.tokens(self.counter)
        if self._fits(selection, extra, token_budget):
            for extra_index, extra_part in extra:
                role = self.input.history[extra_index].role
                selection.add(extra_index, extra_part, role, self.counter, token_budget)

    # -- assembly -------------------------------------------------------------------------------

    def build(self) -> PromptBuild:
        fixed: list[FixedSection] = []
        current = self.input.current
        if self.show_current:
            fixed.append(
                self._fixed(
                    Section.CURRENT,
                    Role.USER,
                    current.sender if self.input.is_group_chat else None,
                    current.text,
                    current.token_count,
                    self.policy.current_message_max_chars,
                    last=not self.show_previous,
                )
            )
        if self.show_previous:
            assert self.input.previous_result is not None
            fixed.append(
                self._fixed(
                    Section.PREVIOUS_RESULT,
                    Role.ASSISTANT,
                    self.input.previous_result_bot if self.input.multi_bot else None,
                    self.input.previous_result,
                    self.input.previous_result_token_count,
                    self.policy.previous_result_max_chars,
                    last=True,
                )
            )
        if (
            not self.show_history
            and not self.show_previous
            and not starts_with_header_line(current.text)
        ):
            return self._build_verbatim(fixed[0])
        return self._build_sections(fixed)

    def _build_verbatim(self, fixed: FixedSection) -> PromptBuild:
        if self.max_tokens is not None and not squeeze(
            fixed, self.max_tokens, lambda f: f.verbatim_tokens(self.counter)
        ):
            raise PromptBudgetError(f"max_tokens={self.policy.max_tokens} cannot hold a marker")
        tokens = fixed.verbatim_tokens(self.counter)
        # A verbatim prompt has no label, so its message has no name either.
        message = RenderedMessage(role=Role.USER, name=None, content=fixed.piece.message.content)
        document = PromptDocument(
            sections=(RenderedSection(Section.CURRENT, (message,)),), verbatim=True
        )
        report = self._report(
            text=message.content,
            tokens=tokens,
            fixed=[fixed],
            fixed_tokens={Section.CURRENT: tokens},
            selected=[],
            pinned=False,
            history_tokens=0,
            verbatim=True,
        )
        return PromptBuild(text=message.content, report=report, document=document)

    def _build_sections(self, fixed: list[FixedSection]) -> PromptBuild:
        history_floor = self._history_overhead(0, 0) if self.show_history else 0
        squeezed = False
        if self.max_tokens is not None:
            fixed_total = sum(f.section_tokens(self.counter) for f in fixed)
            squeezed = fixed_total + history_floor > self.max_tokens
        if squeezed:
            assert self.max_tokens is not None
            # Cut the Previous Result first, then the Current Message, until the history's
            # header and notice fit next to them.
            for index in range(len(fixed) - 1, -1, -1):
                cut = fixed[index]
                others = sum(f.section_tokens(self.counter) for f in fixed if f is not cut)
                target = self.max_tokens - history_floor - others
                if squeeze(cut, target, lambda f: f.section_tokens(self.counter)):
                    break
            else:
                raise PromptBudgetError(
                    f"max_tokens={self.policy.max_tokens} cannot hold the prompt's structure"
                )
        fixed_tokens = {f.section: f.section_tokens(self.counter) for f in fixed}
        token_budget = (
            self.max_tokens - sum(fixed_tokens.values()) if self.max_tokens is not None else None
        )

        selected: list[tuple[int, SizedPiece]] = []
        pinned = False
        history_tokens = 0
        sections: list[RenderedSection] = []
        pieces: list[str] = []
        if self.show_history:
            # Once the fixed sections had to be cut, the history keeps only its header and
            # notice: filling the crumbs would let a larger budget include fewer messages.
            selection = _Selection(pinned=None) if squeezed else self._select_history(token_budget)
            selected, pinned = selection.oldest_first(), selection.pin_held
            users = selection.users
            notice = self._notice(users, len(selected) - users)
            history_tokens = self._history_overhead(users, len(selected) - users) + sum(
                part.tokens(self.counter) for _, part in selected
            )
            pieces.append(header_piece(Section.HISTORY))
            if notice is not None:
                pieces.append(notice_piece(notice))
            pieces.extend(part.text for _, part in selected)
            sections.append(
                RenderedSection(
                    Section.HISTORY, tuple(part.message for _, part in selected), notice
                )
            )
        for f in fixed:
            pieces.append(header_piece(f.section))
            pieces.append(f.piece.text)
            sections.append(RenderedSection(f.section, (f.piece.message,)))
        text = "".join(pieces)
        report = self._report(
            text=text,
            tokens=history_tokens + sum(fixed_tokens.values()),
            fixed=fixed,
            fixed_tokens=fixed_tokens,
            selected=selected,
            pinned=pinned,
            history_tokens=history_tokens,
            verbatim=False,
        )
        return PromptBuild(text=text, report=report, document=PromptDocument(tuple(sections)))

    def _report(
        self,
        *,
        text: str,
        tokens: int,
        fixed: list[FixedSection],
        fixed_tokens: dict[Section, int],
        selected: list[tuple[int, SizedPiece]],
        pinned: bool,
        history_tokens: int,
        verbatim: bool,
    ) -> BuildReport:
        history = self.input.history
        users = sum(1 for i, _ in selected if history[i].role is Role.USER)
        artifacts: list[str] = []
        for _, part in selected:
            artifact = part.message.artifact
            if artifact is not None and artifact.artifact_id not in artifacts:
                artifacts.append(artifact.artifact_id)
        by_section = {f.section: f for f in fixed}
        current = by_section.get(Section.CURRENT)
        previous = by_section.get(Section.PREVIOUS_RESULT)
        sections = [Section.HISTORY.value] if self.show_history else []
        sections += [f.section.value for f in fixed]
        return BuildReport(
            messages_considered=self.considered,
            messages_included=len(selected),
            messages_omitted=self.considered - len(selected),
            omitted_user=(self.user_messages - users) if self.show_history else 0,
            omitted_assistant=(
                self.assistant_messages - (len(selected) - users) if self.show_history else 0
            ),
            included_message_ids=tuple(history[i].message_id for i, _ in selected),
            truncated=tuple(part.truncated for _, part in selected if part.truncated is not None),
            sections=tuple(sections),
            verbatim=verbatim,
            context_passing=self.mode.value,
            chars=len(text),
            bytes=len(text.encode("utf-8", "surrogatepass")),
            tokens=tokens,
            token_encoding=self.policy.token_encoding,
            history_chars=sum(part.chars for _, part in selected),
            history_tokens=history_tokens,
            current_tokens=fixed_tokens.get(Section.CURRENT, 0),
            previous_result_tokens=fixed_tokens.get(Section.PREVIOUS_RESULT, 0),
            artifacts=tuple(artifacts),
            first_user_message_pinned=pinned,
            current_truncated=current is not None and current.piece.cut is not None,
            current_removed_chars=current.removed_chars if current is not None else 0,
            previous_result_truncated=previous is not None and previous.piece.cut is not None,
            previous_result_removed_chars=previous.removed_chars if previous is not None else 0,
        )


def build_prompt(
    prompt_input: PromptInput,
    policy: HistoryPolicy,
    *,
    context_passing: ContextPassing | str | None = None,
) -> PromptBuild:
    """Build the prompt for ``prompt_input`` under ``policy``.

    ``context_passing`` overrides the policy's mode (a pipeline step carries its own).
    """
    mode = (
        ContextPassing(context_passing) if context_passing is not None else policy.context_passing
    )
    counter = TokenCounter(policy.token_encoding, prompt_input.token_count_encoding)
    slack = 0
    for _ in range(_VERIFY_ROUNDS):
        build = _Builder(prompt_input, policy, mode, counter, slack).build()
        if counter.additive:
            return build
        exact = counter.count(build.text)
        if policy.max_tokens is None or exact <= policy.max_tokens:
            report = build.report.model_copy(update={"tokens": exact})
            return PromptBuild(text=build.text, report=report, document=build.document)
        slack += exact - policy.max_tokens
    raise PromptBudgetError(f"could not fit max_tokens={policy.max_tokens} exactly")
