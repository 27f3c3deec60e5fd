"""A cancel that waits: the product's cancel returns once the executors it stopped are gone.

Stopping a turn that a worker runs (cancel, interrupt, rollback) only marks it; the worker learns
it from its next claim check (about every half second) or report, ends the executor's whole
process tree and confirms (`reports.confirm_stopped`, `Subtask.stop_confirmed_at`). A turn that
never ran is confirmed when it is stopped. A cancel with `wait` polls for the confirmations of
the turns it stopped until they are all in, its client hangs up, or its timeout passes — then it
says which (`wait_for_stops`). A stopped turn's late result is refused whatever the timing: it
is fenced by its claim's attempt like any report on a finished turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from backend.tasks.models import STOPPED_SUBTASK_STATUSES, Subtask

# How often a waiting cancel looks for the confirmations (one indexed query).
STOP_POLL_SECONDS = 0.05
DEFAULT_STOP_WAIT_SECONDS = 10.0
MAX_STOP_WAIT_SECONDS = 60.0


def _assume_connected() -> bool:
    return True


def stops_unconfirmed(*, task_id: int, subtask_ids: Collection[int] | None = None) -> bool:
    """Whether a stopped turn of the task (of `subtask_ids`, when given) may still be running
    on a worker that has not confirmed its stop."""
    turns = Subtask.objects.filter(
        task_id=task_id, status__in=STOPPED_SUBTASK_STATUSES, stop_confirmed_at__isnull=True
    )
    if subtask_ids is not None:
        turns = turns.filter(pk__in=list(subtask_ids))
    return turns.exists()


def wait_for_stops(
    *,
    task_id: int,
    subtask_ids: Collection[int] | None = None,
    timeout_seconds: float,
    still_connected: Callable[[], bool] = _assume_connected,
) -> bool:
    """Wait until every stopped turn of the task (of `subtask_ids`, when given) has its stop
    confirmed: True when they all have, False when the timeout passed or the client hung up
    first. Runs outside any transaction, so each look sees the workers' commits."""
    deadline = time.monotonic() + timeout_seconds
    while stops_unconfirmed(task_id=task_id, subtask_ids=subtask_ids):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not still_connected():
            return False
        time.sleep(min(STOP_POLL_SECONDS, remaining))
    return True
