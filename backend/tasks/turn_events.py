"""What the product's webhooks hear when assistant turns end (completed, failed, cancelled).

The tasks services call these inside the transaction that ends the turns, so the deliveries
(`backend.webhooks`) are committed or rolled back with the turns' new state. Summary jobs are
not turns and are never announced. The turns are read only when an endpoint of the task's
owner hears the task: for an owner without webhooks this costs one indexed query.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

from backend.prompting import Role
from backend.tasks.models import TURNS, Subtask, SubtaskStatus, Task
from backend.webhooks.services import EndedTurn, enqueue_turn_events


def announce_ended_turns(*, task: Task, turns: Iterable[Subtask], occurred_at: datetime) -> None:
    """Announce `turns` (a list, or a query read only if an endpoint listens), which have just
    ended."""
    enqueue_turn_events(
        owner_id=task.owner_id,
        task_id=task.pk,
        turns=_ended(turns),
        occurred_at=occurred_at,
    )


def announce_turn_outcome(*, task: Task, subtask: Subtask, occurred_at: datetime) -> None:
    """Announce a recorded outcome; a failed turn fails the later steps of its round with it,
    and those are announced too (the only FAILED later steps a round can have: a later step
    runs only after this one completed)."""
    turns: Iterable[Subtask] = [subtask]
    if subtask.status == SubtaskStatus.FAILED and subtask.pipeline_step is not None:
        turns = _with_later_failed_steps(task=task, subtask=subtask)
    announce_ended_turns(task=task, turns=turns, occurred_at=occurred_at)


def cancelled_turns(*, task: Task, cancelled_at: datetime) -> Iterable[Subtask]:
    """The task's turns a cancel that stamped them `cancelled_at` ended (a query, read only
    when an endpoint listens)."""
    return task.subtasks.filter(
        TURNS, role=Role.ASSISTANT, status=SubtaskStatus.CANCELLED, finished_at=cancelled_at
    )


def _with_later_failed_steps(*, task: Task, subtask: Subtask) -> Iterator[Subtask]:
    yield subtask
    yield from Subtask.objects.filter(
        task_id=task.pk,
        parent_message_id=subtask.parent_message_id,
        role=Role.ASSISTANT,
        status=SubtaskStatus.FAILED,
        pipeline_step__gt=subtask.pipeline_step,
    ).order_by("pipeline_step")


def _ended(turns: Iterable[Subtask]) -> Iterator[EndedTurn]:
    for turn in turns:
        yield EndedTurn(
            subtask_id=turn.pk,
            message_id=turn.message_id,
            status=turn.status,
            error_code=turn.error_code,
            bot=turn.bot,
            pipeline_step=turn.pipeline_step,
        )
