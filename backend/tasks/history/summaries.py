"""A summary job's own input: the turns it summarises (after the summary it folds in), that
summary, and the turns the summary covers counted by role."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from django.db.models import Count, Q

from backend.prompting import Role
from backend.prompting.inputs import PromptInput
from backend.prompting.units import DEFAULT_TOKEN_ENCODING
from backend.tasks.history.rows import (
    HISTORY_STATUSES,
    SUMMARY_FIELDS,
    prompt_input_of,
    summary_request_message,
    with_steered_into_bot,
)
from backend.tasks.history.selection import any_of
from backend.tasks.models import TURNS, Subtask, SubtaskKind, Task


def summary_job_inputs_for(
    *, jobs: Sequence[Subtask], tasks: Mapping[int, Task]
) -> dict[int, PromptInput]:
    """Builder inputs for summary jobs, keyed by subtask id: each job's turns (the ones after
    the summary it folds in, up to the last message it covers), that summary, and the turns it
    covers counted by role for the omission notice. Two queries for the batch (one without a
    previous summary), whatever the jobs and however long the histories."""
    if not jobs:
        return {}
    conditions = []
    for job in jobs:
        previous_last = _previous_last(job)
        conditions.append(
            TURNS
            & Q(
                task_id=job.task_id,
                message_id__gt=previous_last,
                message_id__lte=job.summary_last_message_id,
                status__in=HISTORY_STATUSES,
            )
        )
        if job.summary_previous_id is not None:
            conditions.append(Q(pk=job.summary_previous_id))
    rows = list(
        with_steered_into_bot(Subtask.objects.filter(any_of(conditions)))
        .select_related("artifact")
        .only(*SUMMARY_FIELDS, "task_id")
        .order_by("task_id", "message_id")
    )
    earlier = _covered_by_role([job for job in jobs if job.summary_previous_id is not None])
    inputs: dict[int, PromptInput] = {}
    for job in jobs:
        previous = next((row for row in rows if row.pk == job.summary_previous_id), None)
        turns = [
            row
            for row in rows
            if row.task_id == job.task_id
            and row.kind == SubtaskKind.TURN
            and _previous_last(job) < row.message_id <= (job.summary_last_message_id or 0)
        ]
        users, assistants = earlier.get(job.pk, (0, 0))
        task = tasks[job.task_id]
        inputs[job.pk] = prompt_input_of(
            history=turns,
            current=summary_request_message(job, previous),
            previous_turn=None,
            summary_turn=previous,
            is_group_chat=task.is_group_chat,
            multi_bot=task.is_multi_bot,
            first_user_message_id=None,
            earlier_user_messages=users,
            earlier_assistant_messages=assistants,
            token_count_encoding=DEFAULT_TOKEN_ENCODING,
        )
    return inputs


def _previous_last(job: Subtask) -> int:
    """The last message the summary a job folds in covers (0: a first summary). Callers load
    jobs with their `summary_previous` (select_related), so this costs no query."""
    previous = job.summary_previous
    if previous is None or previous.summary_last_message_id is None:
        return 0
    return previous.summary_last_message_id


def _covered_by_role(jobs: Sequence[Subtask]) -> dict[int, tuple[int, int]]:
    """Per job id: the (user, assistant) turns its folded summary covers (one query)."""
    if not jobs:
        return {}
    ends = {job.task_id: (job.pk, _previous_last(job)) for job in jobs}
    counted = (
        Subtask.objects.filter(
            any_of(
                [Q(task_id=task_id, message_id__lte=last) for task_id, (_, last) in ends.items()]
            ),
            TURNS,
            status__in=HISTORY_STATUSES,
        )
        .values("task_id")
        .annotate(
            users=Count("id", filter=Q(role=Role.USER)),
            assistants=Count("id", filter=Q(role=Role.ASSISTANT)),
        )
    )
    return {ends[row["task_id"]][0]: (row["users"], row["assistants"]) for row in counted}
