"""Follow-ups: a message sent into a task that may still be answering, and the queue.

A follow-up starts its round now when no turn is active; otherwise its strategy decides, through
the handler `HANDLERS` names for it, all under the task's lock. A queued message waits until
`status.start_next_queued` starts it, or until it is withdrawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from backend.artifacts.services import (
    atomic_storing_artifacts,
)
from backend.errors import Conflict, InvalidInput, NotFound
from backend.tasks import task_events
from backend.tasks.follow_up_strategies import FollowUpStrategy, listed
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    TURNS,
    QueuedMessage,
    QueuedMessageStatus,
    Steer,
    Subtask,
    Task,
    TaskStatus,
)
from backend.tasks.services.cancelling import _stop_turns
from backend.tasks.services.rounds import _create_round, lock_task
from backend.tasks.services.steering import steer_running_turn, steerable_turn
from backend.tasks.services.validation import (
    _validate_sender,
    _validate_strategy,
    validate_message_text,
)


@dataclass(frozen=True)
class FollowUp:
    """What a follow-up did: the round it started now (`turns`: its USER turn and PENDING
    answers), or the queue entry it waits in (`queued`); and the turns it stopped to start now
    (`stopped`: interrupted or rolled back). A steer: its USER turn (`turns`) and its `steer`;
    or, when no running turn could take it, the queue entry and why (`steer_fallback`)."""

    strategy: str
    turns: list[Subtask]
    queued: QueuedMessage | None = None
    stopped: tuple[Subtask, ...] = ()
    steer: Steer | None = None
    steer_fallback: str = ""


def follow_up_strategy(*, task: Task, strategy: str | None = None) -> str:
    """The strategy a follow-up applies: its own, else its task's, else the setting."""
    return strategy or task.follow_up_strategy or settings.BATON_FOLLOW_UP_STRATEGY


def append_message(*, task: Task, message: str, sender: str = "") -> list[Subtask]:
    """A follow-up that starts its round now or not at all (the `reject` strategy): a
    COMPLETED USER turn plus one PENDING ASSISTANT turn per step. See `send_message`."""
    return send_message(
        task=task, message=message, sender=sender, strategy=FollowUpStrategy.REJECT
    ).turns


def recorded_sender(*, task: Task, author: User, sender: str) -> str:
    """The sender a follow-up by `author` is stored with (its turn's and its queued message's).

    The task's owner, the product, names its own senders. An operator writing into another
    account's task is recorded as themself, by username, so that nothing an operator writes
    can pass for the owner's words (the owner's own carry the sender the product gave, often
    none); naming any other sender is refused.
    """
    if task.owner_id == author.pk:
        return sender
    operator = author.get_username()
    if sender not in ("", operator):
        raise InvalidInput(
            "A message written into another account's task is recorded as its author's: "
            f"sender must be empty or {operator!r}.",
            field="sender",
        )
    return operator


def send_message(
    *, task: Task, message: str, sender: str = "", strategy: str | None = None
) -> FollowUp:
    """Send a follow-up: when no turn of the task is PENDING or RUNNING (a summary job is not
    a turn), a new round starts now, whatever the strategy. Otherwise the strategy
    (`follow_up_strategy`) decides, through its handler in `HANDLERS`.

    Messages already queued stay queued behind a round started by `interrupt` or `rollback`.
    Everything runs under the task's lock, so concurrent follow-ups are applied one at a time,
    in the order they take it, and a refused one stores nothing. A cancelled task takes none.
    """
    validate_message_text(text=message)
    _validate_sender(is_group_chat=task.is_group_chat, sender=sender)
    if strategy is not None:
        _validate_strategy(strategy, field="strategy")
    with atomic_storing_artifacts():
        task = lock_task(task_id=task.pk)
        chosen = FollowUpStrategy(follow_up_strategy(task=task, strategy=strategy))
        if task.status == TaskStatus.CANCELLED:
            raise Conflict(f"Task {task.pk} is cancelled; it takes no more messages.")
        active = list(
            task.subtasks.filter(TURNS, status__in=ACTIVE_SUBTASK_STATUSES).order_by("message_id")
        )
        if not active:
            return FollowUp(
                strategy=chosen, turns=_create_round(task=task, message=message, sender=sender)
            )
        arrival = _Arrival(task=task, message=message, sender=sender, active=active)
        return HANDLERS[chosen](arrival)


@dataclass(frozen=True)
class _Arrival:
    """A follow-up that arrived, under its task's lock, while the task had `active` turns
    (PENDING or RUNNING, by message_id)."""

    task: Task
    message: str
    sender: str
    active: list[Subtask]


def _reject(arrival: _Arrival) -> FollowUp:
    """Conflict, nothing stored."""
    task, turn = arrival.task, arrival.active[0]
    others = listed(s for s in FollowUpStrategy.values if s != FollowUpStrategy.REJECT)
    raise Conflict(
        f"Task {task.pk} has a turn {turn.status} (message_id {turn.message_id}); send the "
        f"follow-up when it has finished, cancel the turn, or send it with strategy {others}."
    )


def _enqueue_behind(arrival: _Arrival) -> FollowUp:
    """Stored as a `QueuedMessage`: its round starts when every turn before it has finished
    (`start_next_queued`), queued messages in the order they arrived."""
    _check_room(arrival)
    queued = _enqueue(task=arrival.task, message=arrival.message, sender=arrival.sender)
    return FollowUp(strategy=FollowUpStrategy.ENQUEUE, turns=[], queued=queued)


def _interrupt(arrival: _Arrival) -> FollowUp:
    """The running turn stops as INTERRUPTED and stays in the history with what it had
    written; the round's turns that had not started are cancelled; the round starts now."""
    return _stop_and_start(arrival, strategy=FollowUpStrategy.INTERRUPT)


def _rollback(arrival: _Arrival) -> FollowUp:
    """The round's active turns are cancelled (a cancelled turn is no part of the history) and
    the round starts now."""
    return _stop_and_start(arrival, strategy=FollowUpStrategy.ROLLBACK)


def _steer(arrival: _Arrival) -> FollowUp:
    """Stored at once as a USER turn given to the running turn, whose answer answers both
    (`steering`); when no turn runs yet, or its executor takes no input while it runs,
    queued as `enqueue` would, saying why."""
    _check_room(arrival)
    running, why_not = steerable_turn(arrival.active)
    if running is None:
        queued = _enqueue(task=arrival.task, message=arrival.message, sender=arrival.sender)
        return FollowUp(
            strategy=FollowUpStrategy.ENQUEUE, turns=[], queued=queued, steer_fallback=why_not
        )
    steer = steer_running_turn(
        task=arrival.task, running=running, message=arrival.message, sender=arrival.sender
    )
    return FollowUp(strategy=FollowUpStrategy.STEER, turns=[steer.message], steer=steer)


def _stop_and_start(arrival: _Arrival, *, strategy: FollowUpStrategy) -> FollowUp:
    task = arrival.task
    interrupt = strategy == FollowUpStrategy.INTERRUPT
    stopped = _stop_turns(task=task, turns=arrival.active, interrupt=interrupt)
    turns = _create_round(task=task, message=arrival.message, sender=arrival.sender)
    return FollowUp(strategy=strategy, turns=turns, stopped=tuple(stopped))


# What each strategy does with a follow-up that arrives while a turn runs: one handler per
# member of `FollowUpStrategy` (tests/tasks/test_follow_up_handlers.py checks none is missing).
HANDLERS: dict[FollowUpStrategy, Callable[[_Arrival], FollowUp]] = {
    FollowUpStrategy.REJECT: _reject,
    FollowUpStrategy.ENQUEUE: _enqueue_behind,
    FollowUpStrategy.INTERRUPT: _interrupt,
    FollowUpStrategy.ROLLBACK: _rollback,
    FollowUpStrategy.STEER: _steer,
}


def _check_room(arrival: _Arrival) -> None:
    """Conflict when the task has BATON_MAX_QUEUED_MESSAGES follow-ups waiting already: its
    queued messages, and the steers its running turns have not answered (`steers_open`:
    pending, or delivered to an attempt that may still end without an answer, which sends
    them to the queue). So neither the queue nor a turn's steers grow without bound, and a
    steer falling back never overfills the queue."""
    task = arrival.task
    queued = task.queued_messages.filter(status=QueuedMessageStatus.QUEUED).count()
    steers = sum(turn.steers_open for turn in arrival.active)
    limit = settings.BATON_MAX_QUEUED_MESSAGES
    if queued + steers >= limit:
        raise Conflict(
            f"Task {task.pk} already has {queued + steers} follow-ups waiting ({queued} "
            f"queued, {steers} steers its running turn has not answered yet; "
            f"BATON_MAX_QUEUED_MESSAGES allows {limit}); wait for them to be answered, or "
            "withdraw a queued one.",
            field="message",
        )


def _enqueue(*, task: Task, message: str, sender: str) -> QueuedMessage:
    queued = QueuedMessage.objects.create(task=task, message=message, sender=sender)
    task_events.record(
        task_id=task.pk,
        events=[task_events.Event(task_events.MESSAGE_QUEUED, data=_queued_data(queued))],
    )
    # The task's status stays that of its running round; its updated_at says it changed.
    Task.objects.filter(pk=task.pk).update(updated_at=queued.created_at)
    return queued


def _queued_data(queued: QueuedMessage) -> dict[str, Any]:
    return {"queued_id": queued.pk, "status": queued.status, "sender": queued.sender}


def withdraw_queued_message(*, task: Task, queued_id: int) -> QueuedMessage:
    """Take a queued message out of the queue before its round starts (it stays, CANCELLED).
    Conflict once it was sent or withdrawn; NotFound when the task has no such message."""
    with transaction.atomic():
        task = lock_task(task_id=task.pk)
        queued = task.queued_messages.filter(pk=queued_id).first()
        if queued is None:
            raise NotFound(f"Task {task.pk} has no queued message {queued_id}.")
        if queued.status != QueuedMessageStatus.QUEUED:
            raise Conflict(
                f"Queued message {queued_id} was already {queued.status}; only a message "
                "still waiting can be withdrawn."
            )
        if queued.subtask_id is not None:
            raise Conflict(
                f"Queued message {queued_id} is a steer that fell back to the queue: it is "
                "already a turn of the conversation and will be answered."
            )
        queued.status = QueuedMessageStatus.CANCELLED
        queued.cancelled_at = timezone.now()
        queued.save(update_fields=["status", "cancelled_at"])
        Task.objects.filter(pk=task.pk).update(updated_at=queued.cancelled_at)
        task_events.record(
            task_id=task.pk,
            events=[task_events.Event(task_events.MESSAGE_WITHDRAWN, data=_queued_data(queued))],
        )
    return queued
