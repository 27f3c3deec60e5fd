"""The history window: what prompt building reads from the database for one ASSISTANT turn.

It turns rows into the pure core's inputs (`backend.prompting.PromptInput`) with a constant
number of queries, reading only the bounded fields ingestion stored (history text or preview,
token counts, artifact pointer) and never a turn's full `prompt` or `result`, except the
current user message itself, which is bounded by the message size limit. So a build costs the
same whether the task's results were 1 KB or 1 GB each.

Which rows: the task's COMPLETED and FAILED turns older than the user message being answered,
newest first up to the policy's `max_messages`, plus the task's first user message when the
policy pins it. Older turns are only counted (by role) so the omission notice stays exact.
"""

from __future__ import annotations

from django.db.models import Count, Q
from django.db.models.functions import Length

from backend.artifacts.models import Artifact, workspace_path
from backend.prompting.inputs import (
    ArtifactPointer,
    CurrentMessage,
    HistoryMessage,
    PromptInput,
)
from backend.prompting.inputs import Role as PromptRole
from backend.prompting.policy import HistoryPolicy
from backend.prompting.units import DEFAULT_TOKEN_ENCODING
from backend.tasks.models import Role, Subtask, SubtaskStatus, Task

HISTORY_STATUSES = (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED)

# A task's first turn is always its first user message (create_task allocates from 1).
FIRST_USER_MESSAGE_ID = 1

_HISTORY_FIELDS = (
    "id",
    "message_id",
    "role",
    "status",
    "sender",
    "bot",
    "history_text",
    "history_text_tokens",
    "history_chars",
    "preview_head",
    "preview_tail",
    "artifact__id",
    "artifact__kind",
    "artifact__size_chars",
    "artifact__size_lines",
)


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


def history_message(turn: Subtask) -> HistoryMessage:
    """One stored turn as the prompt builder's input."""
    spilled = turn.artifact_id is not None
    return HistoryMessage(
        message_id=turn.message_id,
        role=PromptRole.USER if turn.role == Role.USER else PromptRole.ASSISTANT,
        text=turn.history_text,
        sender=_name(turn.sender) if turn.role == Role.USER else None,
        bot=_name(turn.bot) if turn.role == Role.ASSISTANT else None,
        failed=turn.status == SubtaskStatus.FAILED,
        token_count=turn.history_text_tokens,
        total_chars=turn.history_chars,
        preview_head=turn.preview_head if spilled else None,
        preview_tail=turn.preview_tail if spilled else None,
        artifact=_pointer(turn.artifact) if spilled else None,
    )


def _window_size(*, task_id: int, before: int, policy: HistoryPolicy) -> int | None:
    """How many newest history turns can matter under the policy (None: all of them).

    With `max_messages` set that is the answer. Without it, walk the turns' sizes newest first
    (ids and lengths only, no text) until `max_chars` is used up, so an unlimited message count
    still reads only the texts that can fit.
    """
    if policy.max_messages is not None:
        return policy.max_messages
    if policy.max_chars is None:
        return None
    cap = policy.per_message_max_chars
    used = 0
    count = 0
    sizes = (
        Subtask.objects.filter(task_id=task_id, message_id__lt=before, status__in=HISTORY_STATUSES)
        .order_by("-message_id")
        .annotate(size=Length("history_text"))
        .values_list("size", flat=True)
        .iterator(chunk_size=500)
    )
    for size in sizes:
        used += min(size, cap) if cap is not None else size
        count += 1
        if used > policy.max_chars:
            break
    return count


def prompt_input_for(*, subtask: Subtask, task: Task, policy: HistoryPolicy) -> PromptInput:
    """The builder's input for an ASSISTANT turn (a constant number of queries)."""
    if subtask.role != Role.ASSISTANT or subtask.parent_message_id is None:
        raise HistoryUnavailable(f"turn {subtask.pk} is not an ASSISTANT turn answering a message")
    current_id = subtask.parent_message_id
    step = subtask.pipeline_step or 0
    # The user message being answered and, for a later pipeline step, the step before it
    # (steps are numbered right after their user message).
    wanted = [current_id] + ([current_id + step] if step > 0 else [])
    anchors = {
        turn.message_id: turn
        for turn in Subtask.objects.filter(task_id=task.pk, message_id__in=wanted)
        .select_related("artifact")
        .only(*_HISTORY_FIELDS, "prompt", "parent_message_id")
    }
    user_turn = anchors.get(current_id)
    if user_turn is None or user_turn.role != Role.USER:
        raise HistoryUnavailable(f"message {current_id} of task {task.pk} is not a user message")
    previous_turn = anchors.get(current_id + step) if step > 0 else None

    history: list[HistoryMessage] = []
    earlier_user = earlier_assistant = 0
    if policy.enabled:
        history_rows = Subtask.objects.filter(
            task_id=task.pk, message_id__lt=current_id, status__in=HISTORY_STATUSES
        )
        window = _window_size(task_id=task.pk, before=current_id, policy=policy)
        rows = (
            history_rows.order_by("-message_id").select_related("artifact").only(*_HISTORY_FIELDS)
        )
        newest = list(rows[:window] if window is not None else rows)
        if (
            policy.keep_first_user_message
            and newest
            and newest[-1].message_id > FIRST_USER_MESSAGE_ID
        ):
            pinned = rows.filter(message_id=FIRST_USER_MESSAGE_ID, role=Role.USER).first()
            if pinned is not None:
                newest.append(pinned)
        newest.reverse()
        history = [history_message(turn) for turn in newest]
        totals = history_rows.aggregate(
            users=Count("id", filter=Q(role=Role.USER)),
            assistants=Count("id", filter=Q(role=Role.ASSISTANT)),
        )
        loaded_users = sum(1 for turn in newest if turn.role == Role.USER)
        earlier_user = totals["users"] - loaded_users
        earlier_assistant = totals["assistants"] - (len(newest) - loaded_users)

    return PromptInput(
        history=tuple(history),
        current=CurrentMessage(
            message_id=current_id,
            text=user_turn.prompt,
            sender=_name(user_turn.sender),
            token_count=None if user_turn.artifact_id else user_turn.history_text_tokens,
        ),
        previous_result=previous_turn.history_text if previous_turn is not None else None,
        previous_result_bot=_name(previous_turn.bot) if previous_turn is not None else None,
        previous_result_token_count=(
            previous_turn.history_text_tokens if previous_turn is not None else None
        ),
        is_group_chat=task.is_group_chat,
        multi_bot=task.is_multi_bot,
        first_user_message_id=FIRST_USER_MESSAGE_ID if policy.keep_first_user_message else None,
        earlier_user_messages=earlier_user,
        earlier_assistant_messages=earlier_assistant,
        token_count_encoding=DEFAULT_TOKEN_ENCODING,
    )
