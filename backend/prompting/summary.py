"""Summaries of omitted history: the block a prompt shows, and the prompt of a summary job.

The block. When the history omits messages and the input carries a summary (the task's latest
finished one), the block sits right after the omission notice: a header line that says which
messages it covers and where the whole conversation is, the summary escaped like any message,
and a pointer line to the whole summary when it was cut. Its budget, in this order:

1. It is shown only with the notice (nothing omitted: nothing to summarize), and not when the
   fixed sections had to be squeezed (the history then keeps only its header and notice).
2. It is budgeted after the history messages: it stands for the oldest messages, so like them it
   gives way first, and a build includes exactly the messages it would include without it.
3. It is cut head + tail at ``summary_max_chars`` (the marker counts code points of the whole
   summary, even when its stored text is a preview), then cut further, in chars, until it fits
   the tokens the rest of the prompt leaves under ``max_tokens`` (with the escape note when it
   is the only piece that needs one), and dropped when not one code point of it fits.
   ``max_chars`` bounds the history's messages only, as before: the summary has its own cap.

The job. A summary job folds the previous summary (if any) and the turns after it into one
rolling summary, so no job re-reads the whole conversation. Its prompt is built by the same
builder: the history holds the job's turns (each cut at the per-message cap, none dropped), the
omission notice counts the turns the previous summary covers and the block shows it, and the
Current Message is :func:`summary_request`. A job reads a bounded span of turns (dispatch caps
it and summarizes a longer one in chunks, each folding in the one before).
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.prompting.counting import TokenCounter
from backend.prompting.document import RenderedMessage, Section, SummaryBlock
from backend.prompting.fixed import FixedSection, squeeze
from backend.prompting.inputs import HistorySummary, Role
from backend.prompting.pieces import SizedPiece, sized_piece
from backend.prompting.policy import ContextPassing, PromptPolicy
from backend.prompting.render import summary_header
from backend.prompting.truncate import Preview

JOB_PER_MESSAGE_MAX_CHARS = 4_000
"""Each turn a summary job reads is cut here when the task's policy has no per-message cap."""

SUMMARY_REQUEST_OPENING = "[Baton summary request]"
"""How a summary job's Current Message starts (the stand-in model answers it with a summary)."""


@dataclass(slots=True)
class SummarySection(FixedSection):
    """The summary block of one build: cut like a fixed section, but with its header line in
    place of a label, and dropped when it does not fit."""

    first_message_id: int = 0
    last_message_id: int = 0
    transcript_path: str | None = None

    def _render(
        self, message: RenderedMessage, tokens: int | None, cut: Preview | None
    ) -> SizedPiece:
        header = summary_header(self.first_message_id, self.last_message_id, self.transcript_path)
        return sized_piece(message, tokens, cut=cut, prefix=header + "\n")

    @property
    def block(self) -> SummaryBlock:
        message = self.piece.message
        return SummaryBlock(
            first_message_id=self.first_message_id,
            last_message_id=self.last_message_id,
            content=message.content,
            transcript_path=self.transcript_path,
            artifact=message.artifact,
            markers=message.markers,
        )


def summary_section(
    summary: HistorySummary,
    *,
    cap: int | None,
    transcript_path: str | None,
    counter: TokenCounter,
) -> SummarySection:
    """The summary cut at ``cap``, ready to be squeezed into what the prompt leaves."""
    return SummarySection(
        section=Section.HISTORY,
        role=Role.ASSISTANT,
        name=None,
        original=summary.text,
        original_tokens=summary.token_count if counter.cached_counts_apply else None,
        last=False,
        cap=cap,
        artifact=summary.artifact,
        preview=summary.preview,
        first_message_id=summary.first_message_id,
        last_message_id=summary.last_message_id,
        transcript_path=transcript_path,
    )


def fit_summary(
    section: SummarySection, room: int | None, *, note_tokens: int, counter: TokenCounter
) -> SummarySection | None:
    """``section`` cut to fit ``room`` tokens, or None when not one code point of it fits.

    ``note_tokens`` is what the escape note costs if the summary is the first piece to need it
    (0 when the prompt has the note anyway).
    """
    if room is None:
        return section

    def measure(fitted: FixedSection) -> int:
        escaped = fitted.piece.body is not fitted.piece.message.content
        return fitted.piece.tokens(counter) + (note_tokens if escaped else 0)

    if not squeeze(section, room, measure) or section.kept_chars == 0:
        return None
    return section


def summary_job_policy(policy: PromptPolicy) -> PromptPolicy:
    """The policy a summary job's prompt is built under, from its task's: every turn of the
    job shown (cut at the per-message cap), the previous summary at the task's summary cap."""
    values = policy.model_dump()
    values.update(
        enabled=True,
        max_messages=None,
        max_chars=None,
        per_message_max_chars=policy.per_message_max_chars or JOB_PER_MESSAGE_MAX_CHARS,
        max_tokens=None,
        keep_first_user_message=False,
        current_message_max_chars=None,
        context_passing=ContextPassing.ORIGINAL_USER,
        resume_native_sessions=False,
        summaries_enabled=False,
    )
    return PromptPolicy.model_validate(values)


def summary_request(*, first_message_id: int, last_message_id: int, folds: int | None) -> str:
    """The Current Message of a summary job; ``folds`` is the last message the previous summary
    covers (shown above the job's turns), None for a first summary."""
    span = f"messages {first_message_id} to {last_message_id}"
    if folds is None:
        opening = (
            f"Write a summary of this conversation's {span}, all shown above, for an agent that "
            "will continue the task without them."
        )
    else:
        opening = (
            f"Write a rolling summary of this conversation's {span}, for an agent that will "
            f"continue the task without them: fold the summary above (messages "
            f"{first_message_id} to {folds}) and the messages after it into one summary that "
            "replaces it."
        )
    return (
        f"{SUMMARY_REQUEST_OPENING} {opening} Keep what a later turn needs: the user's goals "
        "and constraints, decisions and their reasons, facts established, files, commands and "
        "results that matter, what is done and what is still open. Leave out pleasantries and "
        "anything superseded. Answer with the summary only, in plain prose or short lists."
    )
