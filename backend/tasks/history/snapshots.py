"""What a prompt report keeps of a build's input (`input_snapshot`), and the input read again
from it (`prompt_input_from_snapshot`): a replay rebuilds the same prompt from the task's turns,
which do not change once recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backend.prompting.inputs import PromptInput
from backend.prompting.units import DEFAULT_TOKEN_ENCODING
from backend.tasks.history.rows import (
    SUMMARY_FIELDS,
    HistoryUnavailable,
    current_message,
    history_summary,
    prompt_input_of,
    summary_request_message,
    with_steered_into_bot,
)
from backend.tasks.models import Subtask

# What a PromptReport keeps of a build's input to rebuild it: ids, counts and flags only (the
# texts are read again from the turns, which do not change once recorded).
_SNAPSHOT_FIELDS = (
    "is_group_chat",
    "multi_bot",
    "first_user_message_id",
    "earlier_user_messages",
    "earlier_assistant_messages",
    "token_count_encoding",
)


def input_snapshot(prompt_input: PromptInput, *, summary_job: bool = False) -> dict[str, Any]:
    """The ids, counts and flags that rebuild `prompt_input` from the task's turns: its summary
    named by its summary job's message id and, for a summary job's own prompt, that job's."""
    summary = prompt_input.summary
    return {
        "history": [message.message_id for message in prompt_input.history],
        "current": prompt_input.current.message_id,
        "previous_result": prompt_input.previous_result_message_id,
        "summary": summary.message_id if summary is not None else None,
        "summary_job": summary_job,
        **{name: getattr(prompt_input, name) for name in _SNAPSHOT_FIELDS},
    }


def prompt_input_from_snapshot(*, task_id: int, snapshot: Mapping[str, Any]) -> PromptInput:
    """The builder input an `input_snapshot` was taken of, read again from the task's turns
    (one query). Raises HistoryUnavailable when a turn it names is gone."""
    history_ids: list[int] = list(snapshot["history"])
    previous_id: int | None = snapshot["previous_result"]
    summary_id: int | None = snapshot.get("summary")
    wanted = {
        *history_ids,
        snapshot["current"],
        *([previous_id] if previous_id else []),
        *([summary_id] if summary_id else []),
    }
    rows = {
        turn.message_id: turn
        for turn in with_steered_into_bot(
            Subtask.objects.filter(task_id=task_id, message_id__in=wanted)
        )
        .select_related("artifact")
        .only(*SUMMARY_FIELDS, "task_id", "message", "parent_message_id")
    }
    missing = sorted(wanted - rows.keys())
    if missing:
        raise HistoryUnavailable(f"turns {missing} of task {task_id} no longer exist")
    summary_turn = rows[summary_id] if summary_id else None
    if summary_id and history_summary(rows[summary_id]) is None:
        raise HistoryUnavailable(f"summary {summary_id} of task {task_id} is not usable")
    current_row = rows[snapshot["current"]]
    current = (
        summary_request_message(current_row, summary_turn)
        if snapshot.get("summary_job")
        else current_message(
            current_row, snapshot.get("token_count_encoding", DEFAULT_TOKEN_ENCODING)
        )
    )
    return prompt_input_of(
        history=[rows[message_id] for message_id in history_ids],
        current=current,
        previous_turn=rows[previous_id] if previous_id else None,
        summary_turn=summary_turn,
        **{name: snapshot[name] for name in _SNAPSHOT_FIELDS},
    )
