"""Building one prompt: put the sections together under the caps, in their order, and report.

The contract is docs/architecture.md's "The prompt" and its caps:

1. The Current Message and the Previous Result are fixed: each is cut head + tail at its own
   char cap (``current_message_max_chars``, ``previous_result_max_chars``) and never dropped
   (``fixed``).
2. History messages are selected newest first, up to ``max_messages``. With
   ``keep_first_user_message`` the task's first user message is selected before all others: it
   counts against every cap and is the last thing dropped (``selection``).
3. Each selected message is cut at ``per_message_max_chars`` (a spilled message's stored preview
   is re-cut from its own head and tail, so its marker still counts against the original).
4. Messages are dropped oldest first until the history's messages fit ``max_chars`` and the whole
   prompt fits ``max_tokens``: the walk goes newest first and stops at the first message that
   does not fit, so its cost grows with the budget, not with the history. One omission notice at
   the top of the history counts what was dropped, by role.
5. With messages omitted, the input's summary goes right after the notice, in the room the
   history messages leave: cut at ``summary_max_chars``, cut further to fit ``max_tokens``,
   dropped when nothing of it fits; it never changes which messages are included (``summary``).
6. If the fixed sections alone leave no room under ``max_tokens`` for the history header and its
   notice, the Previous Result and then the Current Message are cut further (in chars, so the
   marker keeps counting code points of the original), and the history then carries only its
   header and notice. (Filling what the cut leaves over would let a larger budget, which cuts
   the fixed sections less, include fewer history messages.)

What ``max_chars`` bounds: the characters of the history's message pieces (labels, content,
markers, pointer lines and the blank line after each), not the section header, the notice or the
summary block (which ``summary_max_chars`` bounds).
What ``max_tokens`` bounds: the whole prompt.

Token counting is exact without encoding the prompt: for seam-safe encodings the pieces' counts
add up (see ``counting``). For other encodings the finished prompt is encoded once to verify,
and the build is redone with the overshoot held back if it exceeded ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.prompting.addressing import WholeText
from backend.prompting.counting import TokenCounter
from backend.prompting.document import PromptDocument, RenderedMessage, RenderedSection, Section
from backend.prompting.escaping import needs_escape
from backend.prompting.fixed import FixedSection, squeeze
from backend.prompting.inputs import ArtifactPointer, PromptInput, Role
from backend.prompting.pieces import SizedPiece
from backend.prompting.policy import ContextPassing, PromptPolicy
from backend.prompting.render import escape_note_piece, header_piece, notice_piece
from backend.prompting.report import BuildReport
from backend.prompting.selection import HistorySection, Selection
from backend.prompting.summary import SummarySection, fit_summary, summary_section
from backend.prompting.tally import tally_build
from backend.prompting.truncate import Preview

_VERIFY_ROUNDS = 4

BUILDER_VERSION = "2026.12.07.1"
"""Names the rendering rules. Change it whenever the same input and policy would render to other
bytes: a PromptReport records it, and a replay under another version says so instead of
claiming the past prompt was different."""


class PromptBudgetError(ValueError):
    """``max_tokens`` cannot hold even the prompt's structure (headers, labels, markers)."""


@dataclass(frozen=True, slots=True)
class PromptBuild:
    """The prompt text, its structure and a report of what went in and what was left out."""

    text: str
    report: BuildReport
    document: PromptDocument
    whole_texts: tuple[WholeText, ...] = ()
    """Cut texts whose pointer lines name their content address rather than a stored
    artifact: whoever sends the prompt stores them first (the report lists their ids too)."""


@dataclass(frozen=True)
class _HistoryPart:
    """The history section of a prompt: the messages selected (oldest first), the summary
    shown, whether the pinned first message held, its tokens, its pieces of text and its
    rendered section (none of each when the prompt shows no history)."""

    selected: list[tuple[int, SizedPiece]] = field(default_factory=list)
    summary: SummarySection | None = None
    pinned: bool = False
    tokens: int = 0
    pieces: list[str] = field(default_factory=list)
    sections: list[RenderedSection] = field(default_factory=list)


class _Builder:
    """One attempt at the prompt, under ``max_tokens`` less ``token_slack``."""

    def __init__(
        self,
        prompt_input: PromptInput,
        policy: PromptPolicy,
        mode: ContextPassing,
        counter: TokenCounter,
        token_slack: int,
    ) -> None:
        self.input = prompt_input
        self.policy = policy
        self.mode = mode
        self.counter = counter
        self.max_tokens = policy.max_tokens - token_slack if policy.max_tokens is not None else None
        self.history = HistorySection(prompt_input, policy, mode, counter)
        self.show_previous = (
            mode.includes_previous_result and prompt_input.previous_result is not None
        )
        self.show_current = mode.includes_current or not self.show_previous

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
        artifact: ArtifactPointer | None = None,
        removed_before: int = 0,
        message_id: int | None = None,
        preview: Preview | None = None,
    ) -> FixedSection:
        tokens = text_tokens if self.counter.cached_counts_apply else None
        return FixedSection(
            section,
            role,
            name,
            text,
            tokens,
            last,
            cap,
            artifact,
            removed_before,
            message_id,
            preview,
        )

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
                    artifact=current.artifact,
                    message_id=current.message_id,
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
                    artifact=self.input.previous_result_artifact,
                    removed_before=self.input.previous_result_removed_chars,
                    message_id=self.input.previous_result_message_id,
                    preview=self.input.previous_result_preview,
                )
            )
        # Verbatim only when no line of the message would read as structure to a model (a
        # forged label in a first message must be escaped like anywhere else), and when it is
        # not cut: a cut needs its pointer line, and only a labelled message has one.
        if (
            not self.history.shown
            and not self.show_previous
            and fixed[0].piece.cut is None
            and not needs_escape(current.text)
        ):
            return self._build_verbatim(fixed[0])
        return self._build_sections(fixed)

    def _build_verbatim(self, fixed: FixedSection) -> PromptBuild:
        if self.max_tokens is not None and not squeeze(
            fixed, self.max_tokens, lambda f: f.verbatim_tokens(self.counter)
        ):
            raise PromptBudgetError(f"max_tokens={self.policy.max_tokens} cannot hold a marker")
        if fixed.piece.cut is not None:
            # Cut to fit max_tokens: a cut needs its pointer line, so the message is labelled.
            fixed.recut(self.policy.current_message_max_chars)
            return self._build_sections([fixed])
        tokens = fixed.verbatim_tokens(self.counter)
        # A verbatim prompt has no label, so its message has no name either.
        message = RenderedMessage(role=Role.USER, name=None, content=fixed.piece.message.content)
        document = PromptDocument(
            sections=(RenderedSection(Section.CURRENT, (message,)),), verbatim=True
        )
        report = tally_build(
            text=message.content,
            tokens=tokens,
            history=self.history,
            selected=[],
            pinned=False,
            history_tokens=0,
            fixed=[fixed],
            fixed_tokens={Section.CURRENT: tokens},
            verbatim=True,
            context_passing=self.mode,
            token_encoding=self.policy.token_encoding,
        )
        return PromptBuild(text=message.content, report=report, document=document)

    def _build_sections(self, fixed: list[FixedSection]) -> PromptBuild:
        # The escape note opens the prompt when a fixed section had a line escaped; the
        # history can call for it too (see `_history_part`).
        note_tokens = self.counter.constant(escape_note_piece())
        reserved = note_tokens if any(_escaped(f.piece) for f in fixed) else 0
        squeezed = self._squeeze_fixed(fixed, reserved=reserved)
        fixed_tokens = {f.section: f.section_tokens(self.counter) for f in fixed}
        token_budget = (
            self.max_tokens - sum(fixed_tokens.values()) - reserved
            if self.max_tokens is not None
            else None
        )
        history = (
            self._history_part(
                fixed,
                fixed_tokens=fixed_tokens,
                token_budget=token_budget,
                reserved=reserved,
                note_tokens=note_tokens,
                squeezed=squeezed,
            )
            if self.history.shown
            else _HistoryPart()
        )
        selected, summary = history.selected, history.summary
        pieces = list(history.pieces)
        sections = list(history.sections)
        for f in fixed:
            pieces.append(header_piece(f.section))
            pieces.append(f.piece.text)
            sections.append(RenderedSection(f.section, (f.piece.message,)))
        escape_note = (
            any(_escaped(f.piece) for f in fixed)
            or any(_escaped(piece) for _, piece in selected)
            or (summary is not None and _escaped(summary.piece))
        )
        if escape_note:
            pieces.insert(0, escape_note_piece())
        used_note_tokens = note_tokens if escape_note else 0
        text = "".join(pieces)
        report = tally_build(
            text=text,
            tokens=history.tokens + sum(fixed_tokens.values()) + used_note_tokens,
            history=self.history,
            selected=selected,
            pinned=history.pinned,
            history_tokens=history.tokens,
            fixed=fixed,
            fixed_tokens=fixed_tokens,
            note_tokens=used_note_tokens,
            summary=summary,
            verbatim=False,
            context_passing=self.mode,
            token_encoding=self.policy.token_encoding,
        )
        document = PromptDocument(tuple(sections), escape_note=escape_note)
        whole_texts = [piece.whole_text for _, piece in selected] + [f.whole_text for f in fixed]
        return PromptBuild(
            text=text,
            report=report,
            document=document,
            whole_texts=_distinct(whole_texts),
        )

    def _squeeze_fixed(self, fixed: list[FixedSection], *, reserved: int) -> bool:
        """Whether the fixed sections had to be cut for the history's header and notice (and
        `reserved` tokens) to fit next to them under ``max_tokens``: then the Previous Result
        is cut first, then the Current Message."""
        history_floor = (self.history.overhead(0, 0) if self.history.shown else 0) + reserved
        if self.max_tokens is None:
            return False
        fixed_total = sum(f.section_tokens(self.counter) for f in fixed)
        if fixed_total + history_floor <= self.max_tokens:
            return False
        for index in range(len(fixed) - 1, -1, -1):
            cut = fixed[index]
            others = sum(f.section_tokens(self.counter) for f in fixed if f is not cut)
            target = self.max_tokens - history_floor - others
            if squeeze(cut, target, lambda f: f.section_tokens(self.counter)):
                return True
        raise PromptBudgetError(
            f"max_tokens={self.policy.max_tokens} cannot hold the prompt's structure"
        )

    def _history_part(
        self,
        fixed: list[FixedSection],
        *,
        fixed_tokens: dict[Section, int],
        token_budget: int | None,
        reserved: int,
        note_tokens: int,
        squeezed: bool,
    ) -> _HistoryPart:
        """The history section, in ``token_budget`` tokens (``reserved`` of them kept for the
        escape note already)."""
        # Once the fixed sections had to be cut, the history keeps only its header and
        # notice: filling the crumbs would let a larger budget include fewer messages.
        selection = Selection(pinned=None) if squeezed else self.history.select(token_budget)
        if (
            token_budget is not None
            and not reserved
            and any(_escaped(piece) for _, piece in selection.oldest_first())
        ):
            # An escaped history message needs the note: select again with its room.
            selection = self.history.select(token_budget - note_tokens)
        selected = selection.oldest_first()
        users = selection.users
        notice = self.history.notice(users, len(selected) - users)
        history_tokens = self.history.overhead(users, len(selected) - users) + sum(
            piece.tokens(self.counter) for _, piece in selected
        )
        noted = any(_escaped(f.piece) for f in fixed) or any(
            _escaped(piece) for _, piece in selected
        )
        summary = None
        if notice is not None and not squeezed:
            used = sum(fixed_tokens.values()) + history_tokens + (note_tokens if noted else 0)
            summary = self._summary(
                room=self.max_tokens - used if self.max_tokens is not None else None,
                note_tokens=0 if noted else note_tokens,
            )
        if summary is not None:
            history_tokens += summary.piece.tokens(self.counter)
        pieces = [header_piece(Section.HISTORY)]
        if notice is not None:
            pieces.append(notice_piece(notice))
        if summary is not None:
            pieces.append(summary.piece.text)
        pieces.extend(piece.text for _, piece in selected)
        section = RenderedSection(
            Section.HISTORY,
            tuple(piece.message for _, piece in selected),
            notice,
            summary.block if summary is not None else None,
        )
        return _HistoryPart(
            selected=selected,
            summary=summary,
            pinned=selection.pin_held,
            tokens=history_tokens,
            pieces=pieces,
            sections=[section],
        )

    def _summary(self, *, room: int | None, note_tokens: int) -> SummarySection | None:
        """The input's summary, cut to fit ``room`` tokens, or None (see ``summary``)."""
        if self.input.summary is None:
            return None
        transcript = self.input.transcript
        section = summary_section(
            self.input.summary,
            cap=self.policy.summary_max_chars,
            transcript_path=transcript.workspace_path if transcript is not None else None,
            counter=self.counter,
        )
        return fit_summary(section, room, note_tokens=note_tokens, counter=self.counter)


def _distinct(whole_texts: list[WholeText | None]) -> tuple[WholeText, ...]:
    """Each (text, turn) once: the same text in two turns is one artifact linked to both."""
    seen: dict[tuple[str, int], WholeText] = {}
    for whole in whole_texts:
        if whole is not None:
            seen.setdefault((whole.pointer.artifact_id, whole.message_id), whole)
    return tuple(seen.values())


def _escaped(piece: SizedPiece) -> bool:
    """Whether rendering escaped a line of the piece's content."""
    return piece.body is not piece.message.content


def build_prompt(
    prompt_input: PromptInput,
    policy: PromptPolicy,
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
            return PromptBuild(
                text=build.text,
                report=report,
                document=build.document,
                whole_texts=build.whole_texts,
            )
        slack += exact - policy.max_tokens
    raise PromptBudgetError(f"could not fit max_tokens={policy.max_tokens} exactly")
