"""The builder inputs of ASSISTANT turns: each turn's selected rows (`selection`) assembled into
a `PromptInput` (`rows`)."""

from __future__ import annotations

from collections.abc import Sequence

from backend.prompting import Role
from backend.prompting.inputs import PromptInput
from backend.prompting.policy import PromptPolicy
from backend.tasks.history.rows import (
    FIRST_USER_MESSAGE_ID,
    HistoryUnavailable,
    cached_counts_encoding,
    current_message,
    prompt_input_of,
)
from backend.tasks.history.selection import HistoryRequest, Selection, select_turns
from backend.tasks.models import Subtask, SubtaskKind, Task


def prompt_inputs_for(
    *, requests: Sequence[tuple[Subtask, Task, PromptPolicy]]
) -> dict[int, PromptInput]:
    """Builder inputs for several ASSISTANT turns at once, keyed by subtask id.

    The same number of queries whatever the batch's size and the length of the histories
    (`select_turns`: one statement on PostgreSQL): each window is cut per task's policy in the
    database, with per-role totals, and read with the anchors. Dispatching ten turns costs
    what one does.
    """
    batch = [HistoryRequest(subtask, task, policy) for subtask, task, policy in requests]
    for request in batch:
        if request.subtask.role != Role.ASSISTANT or request.subtask.parent_message_id is None:
            raise HistoryUnavailable(
                f"subtask {request.subtask.pk} is not an ASSISTANT turn answering a message"
            )
    if not batch:
        return {}
    selection = select_turns(batch)
    anchors = {(turn.task_id, turn.message_id): turn for turn in selection.anchors}
    windows = _history_windows(
        [request for request in batch if request.wants_history], selection, anchors
    )
    summaries = {turn.pk: turn for turn in selection.anchors if turn.kind == SubtaskKind.SUMMARY}
    return {
        request.subtask.pk: _prompt_input(
            request,
            anchors=anchors,
            newest=windows.get(request.subtask.pk, []),
            totals=selection.totals.get(request.task.pk, (0, 0)),
            summary=summaries.get(request.summary_id) if request.summary_id is not None else None,
        )
        for request in batch
    }


def prompt_input_for(*, subtask: Subtask, task: Task, policy: PromptPolicy) -> PromptInput:
    """The builder's input for one ASSISTANT turn."""
    return prompt_inputs_for(requests=[(subtask, task, policy)])[subtask.pk]


def _prompt_input(
    request: HistoryRequest,
    *,
    anchors: dict[tuple[int, int], Subtask],
    newest: list[Subtask],
    totals: tuple[int, int],
    summary: Subtask | None,
) -> PromptInput:
    """One request's input from its rows: its window `newest` (oldest first), its history's
    (user, assistant) `totals`, its anchors and the task's latest summary."""
    task = request.task
    user_turn = anchors.get((task.pk, request.current_id))
    if user_turn is None or user_turn.role != Role.USER:
        raise HistoryUnavailable(
            f"message {request.current_id} of task {task.pk} is not a user message"
        )
    previous_turn = (
        anchors.get((task.pk, request.previous_step_id)) if request.previous_step_id else None
    )
    if summary is not None and (summary.summary_last_message_id or 0) >= request.current_id:
        summary = None  # a summary of later turns (a prompt built again for an older turn)
    users, assistants = totals
    loaded_users = sum(1 for turn in newest if turn.role == Role.USER)
    encoding = cached_counts_encoding(request.policy.token_encoding)
    return prompt_input_of(
        history=newest,
        current=current_message(user_turn, encoding),
        previous_turn=previous_turn,
        summary_turn=summary,
        is_group_chat=task.is_group_chat,
        multi_bot=task.is_multi_bot,
        first_user_message_id=(
            FIRST_USER_MESSAGE_ID if request.policy.keep_first_user_message else None
        ),
        earlier_user_messages=users - loaded_users,
        earlier_assistant_messages=assistants - (len(newest) - loaded_users),
        token_count_encoding=encoding,
    )


def _history_windows(
    batch: list[HistoryRequest],
    selection: Selection,
    anchors: dict[tuple[int, int], Subtask],
) -> dict[int, list[Subtask]]:
    """Per subtask id: its window of history turns, oldest first, its pinned first message
    included (the selection's window rows are newest first per task)."""
    by_task: dict[int, list[Subtask]] = {}
    for turn in selection.window:
        by_task.setdefault(turn.task_id, []).append(turn)
    windows: dict[int, list[Subtask]] = {}
    for request in batch:
        newest = by_task.get(request.task.pk, [])
        first = anchors.get((request.task.pk, FIRST_USER_MESSAGE_ID))
        if (
            request.policy.keep_first_user_message
            and first is not None
            and newest
            and newest[-1].message_id > FIRST_USER_MESSAGE_ID
        ):
            newest = [*newest, first]
        windows[request.subtask.pk] = list(reversed(newest))
    return windows
