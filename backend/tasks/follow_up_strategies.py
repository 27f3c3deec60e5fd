"""The follow-up strategies: what a message sent into a task does while a turn of it runs.

The one list of them. The task model's choices and constraint, the `BATON_FOLLOW_UP_STRATEGY`
setting, the task API's inputs (whose schema lists each strategy with its label) and the table
of handlers in `backend.tasks.services.follow_ups`, one per strategy, all read it. A new
strategy is a member here, a handler there and the migration of the task model's choices. The
module imports nothing of Baton's, so the settings can read it too.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models


class FollowUpStrategy(models.TextChoices):
    """What a follow-up does when it arrives while a turn of its task is pending or running."""

    REJECT = "reject", "Refuse it (HTTP 409)"
    ENQUEUE = "enqueue", "Queue it; it is sent when the turns before it have finished"
    INTERRUPT = "interrupt", "Stop the running turn, keep what it wrote, send it now"
    ROLLBACK = "rollback", "Stop the running turn, drop it from the history, send it now"
    STEER = "steer", "Give it to the running agent, which answers both; else queue it"


def listed(strategies: Iterable[str] = FollowUpStrategy.values) -> str:
    """`strategies` as a sentence lists them: "reject, enqueue, interrupt, rollback or steer"."""
    names = list(strategies)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
