"""Steering: a follow-up given to the agent while it answers, and what becomes of it.

`steer_running_turn` stores the message as a USER turn at once and a `Steer` for the running
turn's attempt; the worker holding that claim is offered it once, with its next heartbeat
(`offered_steers`) and says what became of it (`settle_steers`): that claim's word only,
fenced by the caller, since a steer settled on anyone else's word would never be answered.
Delivered, the running turn's answer answers both. Refused, or still undelivered when the
attempt ends (`end_steers`), or delivered to an attempt that ends without an answer, it falls
back to the queue: its USER turn gets a round of its own when the turns before it have
finished (`start_next_queued`). So a steer is answered once: by the turn that received it, or
by its own round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F
from django.utils import timezone

from backend import executor_kinds
from backend.tasks import task_events
from backend.tasks.models import (
    QueuedMessage,
    Steer,
    SteerStatus,
    Subtask,
    SubtaskStatus,
    Task,
    TaskStatus,
)
from backend.tasks.services.rounds import _store_user_turn, lock_task

# Why a steer fell back to the queue. The first four are the worker's words (its
# `SteerRefusal`); Baton says the rest.
NOT_STEERABLE = "not_steerable"  # the running executor kind takes no input while it runs
FINISHED = "finished"  # the agent had already made its last model call
NOT_RUNNING = "not_running"  # no executor ran the turn (not claimed yet, or not started)
REFUSED = "refused"  # the executor answered the steer with an error
ATTEMPT_ENDED = "attempt_ended"  # the attempt ended before it could answer the steer
WORKER_REFUSALS = (NOT_STEERABLE, FINISHED, NOT_RUNNING, REFUSED)


@dataclass(frozen=True)
class SteerOffer:
    """A steer the worker holding the claim is to hand to its executor."""

    steer_id: int
    message: str


def steerable_turn(active: Sequence[Subtask]) -> tuple[Subtask | None, str]:
    """The running turn a steer can be given to, or None and why not (`NOT_RUNNING`,
    `NOT_STEERABLE`)."""
    running = next((turn for turn in active if turn.status == SubtaskStatus.RUNNING), None)
    if running is None:
        return None, NOT_RUNNING
    kind = executor_kinds.KINDS.get(running.executor)
    if kind is None or not kind.steerable:
        return None, NOT_STEERABLE
    return running, ""


def steer_running_turn(*, task: Task, running: Subtask, message: str, sender: str) -> Steer:
    """Store the follow-up as a USER turn given to `running`, and its `Steer`. The caller
    holds the task's lock and found `running` RUNNING under it."""
    user_turn = _store_user_turn(
        task=task, message=message, sender=sender, steered_into_message_id=running.message_id
    )
    steer = Steer.objects.create(
        task=task, message=user_turn, target=running, attempt=running.attempts
    )
    Subtask.objects.filter(pk=running.pk).update(steers_open=F("steers_open") + 1)
    return steer


def offered_steers(
    *, claims: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], tuple[SteerOffer, ...]]:
    """The PENDING steers of each (subtask_id, attempt) claim not yet offered to it, in the
    order they were sent, marked offered (one read, and one write when there are some). The
    heartbeat asks only for claims it found RUNNING under the asking claim and whose turn
    counts open steers.

    Each steer's text is offered once: a steer is given to one attempt, and a worker that
    restarts holds a new one (its steers fall back to the queue, `end_steers`). The worker
    hands each steer to its executor on that offer and says what became of it; a steer whose
    offer never reached it (the heartbeat's answer was lost) stays PENDING until its attempt
    ends, and then falls back to the queue like any steer the agent did not take.
    """
    wanted = set(claims)
    if not wanted:
        return {}
    rows = (
        Steer.objects.filter(
            target_id__in=sorted({subtask_id for subtask_id, _ in wanted}),
            status=SteerStatus.PENDING,
            offered_at__isnull=True,
        )
        .order_by("id")
        .values_list("id", "target_id", "attempt", "message__message")
    )
    offers: dict[tuple[int, int], list[SteerOffer]] = {}
    for steer_id, target_id, attempt, text in rows:
        if (target_id, attempt) in wanted:
            offers.setdefault((target_id, attempt), []).append(SteerOffer(steer_id, text))
    if offers:
        Steer.objects.filter(
            pk__in=[offer.steer_id for found in offers.values() for offer in found]
        ).update(offered_at=timezone.now())
    return {claim: tuple(found) for claim, found in offers.items()}


def settle_steers(*, task: Task, target: Subtask, results: Mapping[int, str | None]) -> None:
    """Record what the claim holding `target` says became of its steers: steer id → None when
    the executor took it, else the refusal (one of `WORKER_REFUSALS`). The caller holds the
    task's lock and has fenced the claim (worker account, worker id, attempt): it holds the
    RUNNING turn at `target.attempts`. Nothing else may settle a steer, since a steer settled
    by a word that is not the agent's would never be answered.

    Only a steer still PENDING for that attempt changes: a result sent again (its heartbeat's
    answer was lost) or about a steer already settled changes nothing. A delivered steer is
    DELIVERED; a refused one falls back to the queue at once.
    """
    if not results:
        return
    steers = list(
        Steer.objects.select_related("message").filter(
            pk__in=list(results),
            target_id=target.pk,
            attempt=target.attempts,
            status=SteerStatus.PENDING,
        )
    )
    now = timezone.now()
    for steer in steers:
        refusal = results[steer.pk]
        if refusal is None:
            steer.status, steer.delivered_at = SteerStatus.DELIVERED, now
            steer.save(update_fields=["status", "delivered_at"])
            task_events.record(
                task_id=task.pk,
                events=[task_events.Event(task_events.TURN_STEERED, target.pk, _data(steer))],
            )
        else:
            _fall_back(task=task, steer=steer, reason=refusal, now=now)
    fell_back = sum(1 for steer in steers if steer.status == SteerStatus.QUEUED)
    if fell_back:
        Subtask.objects.filter(pk=target.pk).update(steers_open=F("steers_open") - fell_back)
        target.steers_open -= fell_back


def end_steers(
    *, turns: Sequence[Subtask], task: Task | None = None, superseded: bool = False
) -> None:
    """The turns' attempts are ending (their new status set in memory, in the transaction
    that ends them): each steer still PENDING for an attempt, and each one DELIVERED to an
    attempt that did not complete, falls back to the queue — or, when the task is being
    cancelled, is cancelled with it; or, when a newer message stops the turns
    (`superseded`: interrupt, rollback), it is left to that message's round, whose history
    shows it just before that message. A completed turn's delivered steers are answered by it.
    `task` is the task when the caller holds its lock; else it is locked here, and only when
    a turn has steers (most have none: this costs nothing then)."""
    ending = {turn.pk: turn for turn in turns if turn.steers_open}
    if not ending:
        return
    if task is None:
        task = lock_task(task_id=next(iter(ending.values())).task_id)
    now = timezone.now()
    steers = Steer.objects.select_related("message").filter(
        target_id__in=list(ending),
        status__in=[SteerStatus.PENDING, SteerStatus.DELIVERED],
    )
    for steer in steers:
        turn = ending[steer.target_id]
        if steer.attempt != turn.attempts:
            continue
        if steer.status == SteerStatus.DELIVERED and turn.status == SubtaskStatus.COMPLETED:
            continue  # answered
        if task.status == TaskStatus.CANCELLED or superseded:
            steer.status = SteerStatus.CANCELLED if not superseded else SteerStatus.SUPERSEDED
            steer.settled_at = now
            steer.save(update_fields=["status", "settled_at"])
        else:
            _fall_back(task=task, steer=steer, reason=ATTEMPT_ENDED, now=now)
    Subtask.objects.filter(pk__in=list(ending)).update(steers_open=0)
    for turn in ending.values():
        turn.steers_open = 0


def _fall_back(*, task: Task, steer: Steer, reason: str, now: datetime) -> None:
    """Queue the steer's USER turn: its round starts when the turns before it have finished,
    ahead of messages queued as such (its turn is older than any round they will start)."""
    steer.status, steer.fallback_reason, steer.settled_at = SteerStatus.QUEUED, reason, now
    steer.save(update_fields=["status", "fallback_reason", "settled_at"])
    queued = QueuedMessage.objects.create(
        task=task, message=steer.message.message, sender=steer.message.sender, subtask=steer.message
    )
    task_events.record(
        task_id=task.pk,
        events=[
            task_events.Event(
                task_events.MESSAGE_QUEUED,
                data={
                    "queued_id": queued.pk,
                    "status": queued.status,
                    "sender": queued.sender,
                    "steer_id": steer.pk,
                    "fallback_reason": reason,
                },
            )
        ],
    )


def _data(steer: Steer) -> dict[str, object]:
    return {
        "steer_id": steer.pk,
        "message_id": steer.message.message_id,
        "attempt": steer.attempt,
        "status": steer.status,
    }
