"""Tallying a build into its :class:`BuildReport`: what went in, what was left out, what was cut.

The builder hands over the pieces it chose; this module only counts them, so the report says
exactly what the prompt holds. Invariants kept here: the report carries counts, sizes, ids and
flags and never prompt text; ``messages_included + messages_omitted == messages_considered``;
the omitted counts by role are those of the omission notice; and each section's token count is
the one the builder budgeted, so for seam-safe encodings they add up to ``tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backend.prompting.document import Section
from backend.prompting.fixed import FixedSection
from backend.prompting.inputs import Role
from backend.prompting.pieces import SizedPiece
from backend.prompting.policy import ContextPassing
from backend.prompting.report import BuildReport
from backend.prompting.selection import HistorySection
from backend.prompting.summary import SummarySection


def tally_build(
    *,
    text: str,
    tokens: int,
    history: HistorySection,
    selected: Sequence[tuple[int, SizedPiece]],
    pinned: bool,
    history_tokens: int,
    fixed: Sequence[FixedSection],
    fixed_tokens: Mapping[Section, int],
    note_tokens: int = 0,
    summary: SummarySection | None = None,
    verbatim: bool,
    context_passing: ContextPassing,
    token_encoding: str,
) -> BuildReport:
    """The report of a prompt ``text`` built from ``selected`` history pieces and ``fixed``."""
    messages = history.input.history
    users = sum(1 for i, _ in selected if messages[i].role is Role.USER)
    artifacts: list[str] = []
    notice = history.notice(users, len(selected) - users) if history.shown else None
    if notice is not None and notice.transcript is not None:
        artifacts.append(notice.transcript.artifact_id)
    summary_pieces = [summary.piece] if summary is not None else []
    for piece in summary_pieces + [piece for _, piece in selected] + [f.piece for f in fixed]:
        artifact = piece.message.artifact
        if artifact is not None and artifact.artifact_id not in artifacts:
            artifacts.append(artifact.artifact_id)
    by_section = {f.section: f for f in fixed}
    current = by_section.get(Section.CURRENT)
    previous = by_section.get(Section.PREVIOUS_RESULT)
    sections = [Section.HISTORY.value] if history.shown else []
    sections += [f.section.value for f in fixed]
    return BuildReport(
        messages_considered=history.considered,
        messages_included=len(selected),
        messages_omitted=history.considered - len(selected),
        omitted_user=(history.user_messages - users) if history.shown else 0,
        omitted_assistant=(
            history.assistant_messages - (len(selected) - users) if history.shown else 0
        ),
        included_message_ids=tuple(messages[i].message_id for i, _ in selected),
        truncated=tuple(piece.truncated for _, piece in selected if piece.truncated is not None),
        sections=tuple(sections),
        verbatim=verbatim,
        context_passing=context_passing.value,
        chars=len(text),
        bytes=len(text.encode("utf-8", "surrogatepass")),
        tokens=tokens,
        token_encoding=token_encoding,
        history_chars=sum(piece.chars for _, piece in selected),
        history_tokens=history_tokens,
        current_tokens=fixed_tokens.get(Section.CURRENT, 0),
        previous_result_tokens=fixed_tokens.get(Section.PREVIOUS_RESULT, 0),
        note_tokens=note_tokens,
        summary_included=summary is not None,
        summary_first_message_id=summary.first_message_id if summary is not None else None,
        summary_last_message_id=summary.last_message_id if summary is not None else None,
        summary_tokens=summary.piece.tokens(history.counter) if summary is not None else 0,
        summary_removed_chars=summary.removed_chars if summary is not None else 0,
        artifacts=tuple(artifacts),
        first_user_message_pinned=pinned,
        current_truncated=current is not None and current.truncated,
        current_removed_chars=current.removed_chars if current is not None else 0,
        previous_result_truncated=previous is not None and previous.truncated,
        previous_result_removed_chars=previous.removed_chars if previous is not None else 0,
    )
