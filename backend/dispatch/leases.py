"""Leases: how long a claim lasts, which claim holds a turn, and what happens when one expires.

A claim is named by (worker account, worker_id, attempt); `attempts` goes up by one on every
claim, so it is the fencing token. Invariant: only the claim that holds a turn's current
attempt while it is RUNNING, with its lease not yet run out, may change it. Everything else
is refused by `fenced_turn` with 409: `cancelled` when the product cancelled the turn, and
otherwise one answer whatever the path — `lease_lost`, with a message naming the reason:

- the lease expired and Baton requeued the turn (no claim holds it yet), or failed it
  because it was the last attempt;
- another claim (attempt N, of this or another worker account) holds the turn now, or the
  turn was requeued after it, or finished or cancelled;
- this claim already gave the turn back (RETRY, RELEASE) or reported it (a heartbeat or
  progress after the result).

A lease whose `lease_expires_at` has passed is lost whatever the reclaim timing: a heartbeat
never extends it, and a heartbeat, progress or result from its claim is refused and reclaims
the turn at once (requeued, or failed after BATON_MAX_ATTEMPTS), so the answer and the stored
turn agree. The repeat of a report this claim did record is still answered as before
(`changed: false`, see `reports`). A requeue keeps the ending claim's names (claimed_by,
lease_owner, attempts) so its late reports are recognised, and keeps the turn's place in
line; once another account claims the turn, its dispatch's PromptReport still names the
earlier claims, so their late reports get `lease_lost` while an account that never held the
turn gets 404 and learns nothing. Writers lock the task row first, then the turn: the one
order every writer of a task's turns uses, so concurrent writers queue instead of
deadlocking.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import F, Subquery
from django.utils import timezone

from backend import queries
from backend.dispatch.models import PromptReport
from backend.errors import Conflict, LeaseLost, NotFound, TurnCancelled
from backend.events import log_event
from backend.prompting import Role
from backend.queries.rows import instance_of
from backend.tasks import task_events
from backend.tasks.ingestion import replace_unstorable_chars
from backend.tasks.models import (
    STOPPED_SUBTASK_STATUSES,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    Task,
)
from backend.tasks.partial_texts import discard_attempts
from backend.tasks.services import lock_task, record_result, refresh_task_status
from backend.tasks.services.steering import SteerOffer, end_steers
from backend.tasks.wakeups import announce_pending

RECLAIM_BATCH = 200
# The error code of a turn whose lease ran out; Baton's own, no worker may report it.
LEASE_EXPIRED = "lease_expired"
# A claim's states as a heartbeat reports them.
RUNNING, CANCELLED, LEASE_LOST, FINISHED = "running", "cancelled", "lease_lost", "finished"


@dataclass(frozen=True)
class LeaseState:
    """What a heartbeat tells a worker about one claim it holds."""

    subtask_id: int
    attempt: int
    # "running" (keep going), "cancelled" (stop the executor; nothing to report),
    # "lease_lost" (the claim no longer holds the turn: its lease ran out, or another claim
    # holds or finished it) or "finished" (this claim reported the turn's result).
    state: str
    lease_expires_at: datetime | None
    # Steers for the running agent, to hand over (`backend.tasks.services.steering`).
    steers: tuple[SteerOffer, ...] = ()


@dataclass(frozen=True)
class ReclaimSummary:
    requeued: int
    failed: int


class LeaseFields(Protocol):
    """What the lease checks read of a turn: a `Subtask`, or a row of only these columns
    (`LEASE_COLUMNS`), as the batched heartbeat reads its claims: a hundred model instances
    of the wide turn row cost more than the rest of that request."""

    @property
    def status(self) -> str: ...
    @property
    def error_code(self) -> str: ...
    @property
    def lease_owner(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def lease_expires_at(self) -> datetime | None: ...
    @property
    def steers_open(self) -> int: ...


LEASE_COLUMNS = (
    "status",
    "error_code",
    "lease_owner",
    "attempts",
    "lease_expires_at",
    "steers_open",
)


def lease_until(*, now: datetime) -> datetime:
    return now + timedelta(seconds=settings.BATON_LEASE_SECONDS)


def heartbeat_interval_seconds() -> int:
    """How often a worker should extend its leases: well inside the lease."""
    return max(1, min(60, settings.BATON_LEASE_SECONDS // 4))


def lease_renewal_due(*, lease_expires_at: datetime | None, now: datetime) -> bool:
    """Whether a running claim's lease was last extended more than a heartbeat interval ago
    (or never): heartbeats and progress posts extend it only then. `lease_expires_at` is
    indexed, so an update that moves it writes every index entry of the row; one that leaves
    it (and every other indexed column) alone can be a heap-only update."""
    renew_before = lease_until(now=now) - timedelta(seconds=heartbeat_interval_seconds())
    return lease_expires_at is None or lease_expires_at <= renew_before


def attempts_used(*, subtask: Subtask) -> int:
    """Claims that count against BATON_MAX_ATTEMPTS: releases on shutdown do not, nor do the
    attempts whose prompt overflowed the model's context window (BATON_CONTEXT_OVERFLOW_RETRIES
    bounds those, see `overflow`)."""
    return subtask.attempts - subtask.releases - len(subtask.context_overflows)


def reclaim_expired_leases(
    *, now: datetime | None = None, subtask_ids: Collection[int] | None = None
) -> ReclaimSummary:
    """Turns whose lease ran out go back to PENDING; after BATON_MAX_ATTEMPTS claims they fail.

    Runs on every dispatch call (and from `manage.py reclaim_leases`), so no separate
    scheduler is needed: before the claim, or on PostgreSQL when the claim statement found a
    lease run out (`claims`); a fenced report that finds its own lease run out reclaims
    its turn at once (`subtask_ids`). A requeued turn keeps its place in line (its
    pending_since).
    """
    now = now or timezone.now()
    if subtask_ids is None:
        expired_ids = _expired_lease_ids(now=now)
    else:
        expired_ids = list(
            Subtask.objects.filter(
                pk__in=list(subtask_ids), status=SubtaskStatus.RUNNING, lease_expires_at__lt=now
            )
            .order_by("lease_expires_at")
            .values_list("id", flat=True)[:RECLAIM_BATCH]
        )
    requeued = failed = 0
    for subtask_id in expired_ids:
        with transaction.atomic():
            task_id = Subtask.objects.filter(pk=subtask_id).values_list("task_id", flat=True)
            lock_task(task_id=task_id.get())  # task first, then the turn: the writers' order
            subtask = (
                Subtask.objects.select_for_update()
                .filter(pk=subtask_id, status=SubtaskStatus.RUNNING, lease_expires_at__lt=now)
                .first()
            )
            if subtask is None:
                continue  # reported or reclaimed meanwhile
            used = attempts_used(subtask=subtask)
            error = (
                f"The executor lease expired on attempt {used} of "
                f"{settings.BATON_MAX_ATTEMPTS} (last worker {subtask.lease_owner!r})"
            )
            if used >= settings.BATON_MAX_ATTEMPTS:
                record_result(
                    subtask=subtask,
                    status=SubtaskStatus.FAILED,
                    error=f"{error}; Baton gave up on this turn.",
                    error_code=LEASE_EXPIRED,
                )
                failed += 1
            else:
                requeue(subtask=subtask, error=f"{error}.", error_code=LEASE_EXPIRED)
                requeued += 1
    if requeued or failed:
        log_event("leases_reclaimed", requeued=requeued, failed=failed)
    return ReclaimSummary(requeued=requeued, failed=failed)


def requeue(
    *,
    subtask: Subtask,
    error: str = "",
    error_code: str = "",
    delay_seconds: float = 0.0,
    released: bool = False,
) -> None:
    """Back to PENDING, keeping its place in line (pending_since).

    claimed_by, lease_owner and attempts stay: they name the claim that ended, so that claim's
    late reports are told its lease is gone, and a repeated report is recognised. The error
    and its code say why the last attempt ended until the turn finishes.
    """
    now = timezone.now()
    Subtask.objects.filter(pk=subtask.pk).update(
        status=SubtaskStatus.PENDING,
        lease_expires_at=None,
        started_at=None,
        not_before=now + timedelta(seconds=delay_seconds) if delay_seconds > 0 else None,
        releases=F("releases") + (1 if released else 0),
        error=replace_unstorable_chars(error)[0],
        error_code=error_code,
        updated_at=now,
    )
    discard_attempts(turns=[subtask])
    end_steers(turns=[subtask])
    announce_pending(executors=[subtask.executor])
    if subtask.kind == SubtaskKind.TURN:
        subtask.status, subtask.error_code = SubtaskStatus.PENDING, error_code
        task_events.record(
            task_id=subtask.task_id,
            events=[task_events.turn_event(task_events.TURN_REQUEUED, subtask)],
        )
    refresh_task_status(task=Task.objects.get(pk=subtask.task_id))


def _expired_lease_ids(*, now: datetime) -> list[int]:
    """The RUNNING turns whose lease ran out before `now`, soonest expired first (a range of
    the index of running leases). Every dispatch on SQLite asks, and on PostgreSQL one whose
    claim found a lease run out (`claims`)."""
    return list(
        Subtask.objects.filter(status=SubtaskStatus.RUNNING, lease_expires_at__lt=now)
        .order_by("lease_expires_at")
        .values_list("id", flat=True)[:RECLAIM_BATCH]
    )


def claimed_turn(*, worker: User, worker_id: str, attempt: int, subtask_id: int) -> Subtask:
    """The turn, locked, if this worker account holds or last held its claim, or once held the
    claim (worker_id, attempt) it names; else NotFound, so an account learns nothing of turns
    it never held. Its `task` is the task row read under the task's lock.

    A claim another account has since taken over is known by its dispatch's PromptReport
    (attempt, worker_id, claimed_by). Locks the task row first, then the turn: the order every
    writer of a task's turns uses (follow-ups, cancel, results), so concurrent writers queue
    instead of deadlocking.
    """
    # The usual case first: the account holding the claim.
    found = _locked_turn_of(subtask_id=subtask_id, claimed_by=worker)
    if found is None and _held_before(
        worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id
    ):
        found = _locked_turn_of(subtask_id=subtask_id, claimed_by=None)
    if found is None:
        raise NotFound(f"Turn {subtask_id} is not claimed by this worker.")
    return found


def _locked_turn_of(*, subtask_id: int, claimed_by: User | None) -> Subtask | None:
    """The ASSISTANT turn `subtask_id` (held by `claimed_by`, when given) with its task, the
    task's row locked, then the turn's (see `lock_task`). On PostgreSQL one statement
    (`lock_claimed_turn`)."""
    if connection.vendor == "postgresql":
        rows = queries.fetch(
            "lock_claimed_turn",
            {
                "subtask_id": subtask_id,
                "claimed_by_id": None if claimed_by is None else claimed_by.pk,
            },
            {"assistant": Role.ASSISTANT.value},
        )
        if not rows:
            return None
        split = len(Subtask._meta.concrete_fields)
        found = instance_of(Subtask, rows[0][:split])
        found.task = instance_of(Task, rows[0][split:])
        return found
    return _locked_turn_by_orm(subtask_id=subtask_id, claimed_by=claimed_by)


def _locked_turn_by_orm(*, subtask_id: int, claimed_by: User | None) -> Subtask | None:
    """`_locked_turn_of` by the ORM: the task locked by one query, then the turn by another."""
    turn = Subtask.objects.filter(pk=subtask_id, role=Role.ASSISTANT)
    if claimed_by is not None:
        turn = turn.filter(claimed_by=claimed_by)
    task = Task.objects.select_for_update().filter(pk=Subquery(turn.values("task_id"))).first()
    if task is None:
        return None
    found = Subtask.objects.select_for_update().filter(pk=subtask_id).first()
    if found is not None:
        found.task = task  # the locked row, read under the lock
    return found


def _held_before(*, worker: User, worker_id: str, attempt: int, subtask_id: int) -> bool:
    return PromptReport.objects.filter(
        subtask_id=subtask_id, attempt=attempt, worker_id=worker_id, claimed_by=worker
    ).exists()


def fenced_turn(
    *, worker: User, worker_id: str, attempt: int, subtask_id: int, now: datetime
) -> tuple[Subtask, Conflict | None]:
    """The turn, locked, and `fence`'s answer for the claim. NotFound if the account never
    held the claim. The caller raises a refusal after its transaction commits (see `fence`)."""
    subtask = claimed_turn(
        worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id
    )
    return subtask, fence(
        subtask=subtask, worker=worker, worker_id=worker_id, attempt=attempt, now=now
    )


def fence(
    *, subtask: Subtask, worker: User, worker_id: str, attempt: int, now: datetime
) -> Conflict | None:
    """The 409 that refuses the claim on the locked `subtask` — None when the claim holds the
    RUNNING turn and its lease has not run out.

    A claim whose lease ran out before `now` is lost whatever the reclaim timing: its turn is
    reclaimed here (and `subtask` refreshed), in the caller's transaction, so the answer and
    the stored turn agree. The caller therefore raises the refusal after its transaction
    commits, not inside it.
    """
    if lease_ran_out(subtask=subtask, worker_id=worker_id, attempt=attempt, now=now):
        reclaim_expired_leases(now=now, subtask_ids=[subtask.pk])
        subtask.refresh_from_db()
    return claim_refusal(
        subtask=subtask, worker=worker, worker_id=worker_id, attempt=attempt, now=now
    )


def lease_ran_out(*, subtask: LeaseFields, worker_id: str, attempt: int, now: datetime) -> bool:
    """Whether the claim still holds the RUNNING turn on paper but its lease expired before
    `now` (no reclaim has run yet): the lease is lost all the same."""
    return is_claim(subtask, worker_id=worker_id, attempt=attempt) and _expired(subtask, now=now)


def failed_for_lease_expiry(*, subtask: LeaseFields) -> bool:
    """Whether Baton itself failed the turn because the last claim's lease ran out (no worker
    may report that code, so no claim recorded this result)."""
    return subtask.status == SubtaskStatus.FAILED and subtask.error_code == LEASE_EXPIRED


def lease_state(*, subtask: LeaseFields, worker_id: str, attempt: int, now: datetime) -> str:
    """The claim's state as a heartbeat reports it (see `LeaseState.state`)."""
    if not is_claim(subtask, worker_id=worker_id, attempt=attempt):
        return LEASE_LOST
    if subtask.status == SubtaskStatus.RUNNING:
        return LEASE_LOST if _expired(subtask, now=now) else RUNNING
    if subtask.status in STOPPED_SUBTASK_STATUSES:
        return CANCELLED
    if subtask.status == SubtaskStatus.COMPLETED or (
        subtask.status == SubtaskStatus.FAILED and not failed_for_lease_expiry(subtask=subtask)
    ):
        return FINISHED
    return LEASE_LOST  # requeued (expired, retried or released), or failed for lease expiry


def claim_refusal(
    *, subtask: Subtask, worker: User, worker_id: str, attempt: int, now: datetime
) -> Conflict | None:
    """None if the claim (worker_id, attempt) holds the RUNNING turn; else the 409 saying why:
    TurnCancelled, or LeaseLost naming the reason."""
    state = lease_state(subtask=subtask, worker_id=worker_id, attempt=attempt, now=now)
    if state == RUNNING:
        return None
    if state == CANCELLED:
        return TurnCancelled(
            f"Turn {subtask.pk} was cancelled; stop the executor (nothing more to report)."
        )
    reason = _lost_reason(subtask=subtask, worker=worker, worker_id=worker_id, attempt=attempt)
    return LeaseLost(f"Lease lost on turn {subtask.pk} (attempt {attempt}): {reason}.")


def _lost_reason(*, subtask: Subtask, worker: User, worker_id: str, attempt: int) -> str:
    if not is_claim(subtask, worker_id=worker_id, attempt=attempt):
        holder = f"attempt {subtask.attempts}" + (
            f" (worker {subtask.lease_owner!r})"
            if subtask.claimed_by_id == worker.pk
            else " of another worker account"
        )
        if subtask.status == SubtaskStatus.RUNNING:
            return f"{holder} holds the turn now"
        if subtask.status == SubtaskStatus.PENDING:
            return f"the turn was requeued after {holder}; it waits for a new claim"
        return f"the turn is {subtask.status}; {holder} held it last"
    if subtask.status == SubtaskStatus.RUNNING:
        return "the lease expired; Baton has not reclaimed the turn yet"
    if subtask.error_code == LEASE_EXPIRED:
        if subtask.status == SubtaskStatus.FAILED:
            return "the lease expired; Baton failed the turn (it was the last attempt)"
        return "the lease expired; Baton requeued the turn and no claim holds it yet"
    if subtask.status == SubtaskStatus.PENDING:
        return (
            f"this claim gave the turn back ({subtask.error_code or 'requeued'}); "
            "it waits for a new claim"
        )
    return f"this claim already reported the turn {subtask.status}"


def is_claim(subtask: LeaseFields, *, worker_id: str, attempt: int) -> bool:
    """Whether (worker_id, attempt) is the turn's current, or last, claim."""
    return subtask.lease_owner == worker_id and subtask.attempts == attempt


def _expired(subtask: LeaseFields, *, now: datetime) -> bool:
    return (
        subtask.status == SubtaskStatus.RUNNING
        and subtask.lease_expires_at is not None
        and subtask.lease_expires_at < now
    )
