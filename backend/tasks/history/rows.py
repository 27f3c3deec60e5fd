"""A history's rows as the prompt core's inputs: which turns a history shows, the fields read
of them, and how a row becomes a `HistoryMessage`, a `HistorySummary`, a `CurrentMessage` and,
with the rest, a `PromptInput` (for dispatch, for replay and for summary jobs alike)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery

from backend.artifacts.models import Artifact
from backend.prompting import Role
from backend.prompting.addressing import workspace_path
from backend.prompting.inputs import (
    ArtifactPointer,
    CurrentMessage,
    HistoryMessage,
    HistorySummary,
    PromptInput,
)
from backend.prompting.summary import summary_request
from backend.prompting.truncate import layout_fields
from backend.prompting.units import DEFAULT_TOKEN_ENCODING, O200K_ENCODING
from backend.tasks.models import Subtask, SubtaskKind, SubtaskStatus

# The turns the conversation shows: finished ones, and those a newer message interrupted (with
# what they had written); cancelled and rolled-back turns are no part of it.
HISTORY_STATUSES = (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED, SubtaskStatus.INTERRUPTED)

# A task's first turn is always its first user message (create_task allocates from 1).
FIRST_USER_MESSAGE_ID = 1

HISTORY_FIELDS = (
    "id",
    "message_id",
    "role",
    "status",
    "sender",
    "bot",
    "history_text",
    "history_text_tokens",
    "history_text_tokens_o200k",
    "history_chars",
    "preview_head",
    "preview_tail",
    "preview_layout",
    "artifact__id",
    "artifact__kind",
    "artifact__size_chars",
    "artifact__size_lines",
    "history_is_preview",
    "steered_into_message_id",
)
# A stored summary: its text as a history text, and the range it covers.
SUMMARY_FIELDS = (
    *HISTORY_FIELDS,
    "kind",
    "summary_first_message_id",
    "summary_last_message_id",
)


STEERED_INTO_BOT = "steered_into_bot"
"""What a history row is annotated with (`with_steered_into_bot`): the bot of the turn a
steered USER turn was given to, read with the row (None when there is none)."""


def with_steered_into_bot(turns: QuerySet[Subtask]) -> QuerySet[Subtask]:
    """`turns` annotated with `STEERED_INTO_BOT`: found among the task's turns by message_id
    in the same query (the task's message_id index), so a steered turn's label names its
    target's bot whichever turns the window holds."""
    target = Subtask.objects.filter(
        task_id=OuterRef("task_id"), message_id=OuterRef("steered_into_message_id")
    )
    return turns.annotate(**{STEERED_INTO_BOT: Subquery(target.values("bot")[:1])})


class HistoryUnavailable(RuntimeError):
    """The turn cannot be prompted (not an ASSISTANT turn, or its inputs are missing)."""


def _pointer(artifact: Artifact | None) -> ArtifactPointer | None:
    if artifact is None:
        return None
    return ArtifactPointer(
        artifact_id=artifact.id,
        kind=artifact.kind,
        total_chars=artifact.size_chars,
        total_lines=artifact.size_lines,
        workspace_path=workspace_path(artifact.id),
    )


def _name(value: str) -> str | None:
    return value or None


def _preview_removed_chars(turn: Subtask) -> int:
    """Characters a spilled turn's stored preview leaves out of its whole text (else 0)."""
    if not turn.history_is_preview or turn.history_chars is None:
        return 0
    kept = len(turn.preview_head) + len(turn.preview_tail)
    kept += sum(map(len, turn.preview_layout.get("middle", ())))
    return max(turn.history_chars - kept, 0)


def _preview_parts(turn: Subtask | None) -> dict[str, Any]:
    """A spilled turn's kind-aware preview parts (its middle and elisions), else nothing."""
    if turn is None or not turn.history_is_preview:
        return {}
    return layout_fields(turn.preview_layout)


CACHED_TOKEN_COUNTS = {
    DEFAULT_TOKEN_ENCODING: "history_text_tokens",
    O200K_ENCODING: "history_text_tokens_o200k",
}
"""The encodings ingestion counts every history text in, and the column each count is in."""


def cached_counts_encoding(encoding: str) -> str:
    """The encoding of the cached counts a prompt counted with `encoding` gets: its own when
    ingestion caches it (the builder then reuses the counts), else the default's."""
    return encoding if encoding in CACHED_TOKEN_COUNTS else DEFAULT_TOKEN_ENCODING


def _cached_tokens(turn: Subtask, encoding: str) -> int | None:
    column = CACHED_TOKEN_COUNTS.get(encoding)
    count: int | None = getattr(turn, column) if column is not None else None
    return count


def history_message(turn: Subtask, encoding: str = DEFAULT_TOKEN_ENCODING) -> HistoryMessage:
    """One stored turn as the prompt builder's input: its history text (or, when it spilled,
    its preview), its cached token count under `encoding` (see `cached_counts_encoding`),
    when stored the artifact a cut of it points to and, for a steered USER turn, the turn it
    was given to (its bot as `with_steered_into_bot` read it; not known without it)."""
    spilled = turn.history_is_preview
    steered_into = turn.steered_into_message_id if turn.role == Role.USER else None
    steered_into_bot = getattr(turn, STEERED_INTO_BOT, None)
    return HistoryMessage(
        message_id=turn.message_id,
        role=Role(turn.role),
        text=turn.history_text,
        sender=_name(turn.sender) if turn.role == Role.USER else None,
        bot=_name(turn.bot) if turn.role == Role.ASSISTANT else None,
        failed=turn.status == SubtaskStatus.FAILED,
        token_count=_cached_tokens(turn, encoding),
        total_chars=turn.history_chars,
        preview_head=turn.preview_head if spilled else None,
        preview_tail=turn.preview_tail if spilled else None,
        **{f"preview_{name}": value for name, value in _preview_parts(turn).items()},
        artifact=_pointer(turn.artifact),
        steered_into_message_id=steered_into,
        steered_into_bot=_name(steered_into_bot or "") if steered_into is not None else None,
    )


def history_summary(row: Subtask) -> HistorySummary | None:
    """A completed summary job's stored summary as the builder's input (None when it has no
    text or no artifact to point to)."""
    pointer = _pointer(row.artifact)
    if (
        row.kind != SubtaskKind.SUMMARY
        or row.status != SubtaskStatus.COMPLETED
        or not row.history_text
        or pointer is None
        or row.summary_first_message_id is None
        or row.summary_last_message_id is None
    ):
        return None
    spilled = row.history_is_preview
    return HistorySummary(
        message_id=row.message_id,
        first_message_id=row.summary_first_message_id,
        last_message_id=row.summary_last_message_id,
        text=row.history_text,
        token_count=row.history_text_tokens,
        total_chars=row.history_chars,
        preview_head=row.preview_head if spilled else None,
        preview_tail=row.preview_tail if spilled else None,
        **{f"preview_{name}": value for name, value in _preview_parts(row).items()},
        artifact=pointer,
    )


def current_message(user_turn: Subtask, encoding: str) -> CurrentMessage:
    return CurrentMessage(
        message_id=user_turn.message_id,
        text=user_turn.message,
        sender=_name(user_turn.sender),
        token_count=None if user_turn.history_is_preview else _cached_tokens(user_turn, encoding),
        artifact=_pointer(user_turn.artifact),
    )


def summary_request_message(job: Subtask, previous: Subtask | None) -> CurrentMessage:
    """A summary job's Current Message: the request to write its summary."""
    assert job.summary_first_message_id is not None and job.summary_last_message_id is not None
    return CurrentMessage(
        message_id=job.message_id,
        text=summary_request(
            first_message_id=job.summary_first_message_id,
            last_message_id=job.summary_last_message_id,
            folds=previous.summary_last_message_id if previous is not None else None,
        ),
    )


def prompt_input_of(
    *,
    history: Sequence[Subtask],
    current: CurrentMessage,
    previous_turn: Subtask | None,
    summary_turn: Subtask | None = None,
    **fields: Any,
) -> PromptInput:
    """The builder input from the rows it is made of: the one place rows become an input,
    for dispatch and for replay (of turns and of summary jobs)."""
    encoding = fields.get("token_count_encoding", DEFAULT_TOKEN_ENCODING)
    return PromptInput(
        history=tuple(history_message(turn, encoding) for turn in history),
        current=current,
        summary=history_summary(summary_turn) if summary_turn is not None else None,
        previous_result=previous_turn.history_text if previous_turn is not None else None,
        previous_result_bot=_name(previous_turn.bot) if previous_turn is not None else None,
        previous_result_token_count=(
            _cached_tokens(previous_turn, encoding) if previous_turn is not None else None
        ),
        previous_result_artifact=(
            _pointer(previous_turn.artifact) if previous_turn is not None else None
        ),
        previous_result_removed_chars=(
            _preview_removed_chars(previous_turn) if previous_turn is not None else 0
        ),
        previous_result_preview_head=(
            previous_turn.preview_head
            if previous_turn is not None and previous_turn.history_is_preview
            else None
        ),
        previous_result_preview_tail=(
            previous_turn.preview_tail
            if previous_turn is not None and previous_turn.history_is_preview
            else None
        ),
        **{
            f"previous_result_preview_{name}": value
            for name, value in _preview_parts(previous_turn).items()
        },
        previous_result_message_id=previous_turn.message_id if previous_turn else None,
        **fields,
    )
