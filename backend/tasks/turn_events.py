"""What the product's webhooks hear when assistant turns end (completed, failed, cancelled).

The tasks services call these inside the transaction that ends the turns, so the deliveries
(`backend.webhooks`) are committed or rolled back with the turns' new state. Summary jobs are
not turns and are never announced. The services pass the turns they have just ended, as they
hold them for the task's event log (`task_events`), so nothing is read again; for an owner
without webhooks an announcement costs one indexed query.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

from backend.tasks.models import Subtask, Task
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
