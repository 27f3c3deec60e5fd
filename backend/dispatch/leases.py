"""Leases: how long a claim lasts, which claim holds a turn, and what happens when one expires.

A claim is named by (worker account, worker_id, attempt); `attempts` goes up by one on every
claim, so it is the fencing token. Invariant: only the claim that holds a turn's current
attempt while it is RUNNING may change it — `check_claim` refuses everything else with 409
(`lease_lost`, or `turn_cancelled`), so a worker whose lease expired and was handed to another
worker cannot touch the turn any more. A requeue keeps the ending claim's names (owner,
attempts) so its late reports are recognised and fenced off, and keeps the turn's place in
line. Writers lock the task row first, then the turn: the one order every writer of a task's
turns uses, so concurrent writers queue instead of deadlocking.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from backend.errors import LeaseLost, NotFound, TurnCancelled
from backend.events import log_event
from backend.prompting import Role
from backend.tasks.ingestion import replace_unstorable_chars
from backend.tasks.models import Subtask, SubtaskStatus, Task
from backend.tasks.services import lock_task, record_result, refresh_task_status

RECLAIM_BATCH = 200


@dataclass(frozen=True)
class LeaseState:
    """What a heartbeat tells a worker about one claim it holds."""

    subtask_id: int
    attempt: int
    # "running" (keep going), "cancelled" (stop the executor; nothing to report),
    # "lease_lost" (another claim owns the turn now) or "finished" (already reported).
    state: str
    lease_expires_at: datetime | None


@dataclass(frozen=True)
class ReclaimSummary:
    requeued: int
    failed: int


def lease_until(*, now: datetime) -> datetime:
    return now + timedelta(seconds=settings.BATON_LEASE_SECONDS)


def heartbeat_interval_seconds() -> int:
    """How often a worker should extend its leases: well inside the lease."""
    return max(1, min(60, settings.BATON_LEASE_SECONDS // 4))


def attempts_used(*, subtask: Subtask) -> int:
    """Claims that count against BATON_MAX_ATTEMPTS: releases on shutdown do not."""
    return subtask.attempts - subtask.releases


def reclaim_expired_leases(*, now: datetime | None = None) -> ReclaimSummary:
    """Turns whose lease ran out go back to PENDING; after BATON_MAX_ATTEMPTS claims they fail.

    Runs at the start of every dispatch call (and from `manage.py reclaim_leases`), so no
    separate scheduler is needed. A requeued turn keeps its place in line (its pending_since).
    """
    now = now or timezone.now()
    expired_ids = list(
        Subtask.objects.filter(status=SubtaskStatus.RUNNING, lease_expires_at__lt=now)
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
                    error_code="lease_expired",
                )
                failed += 1
            else:
                requeue(subtask=subtask, error=f"{error}.", error_code="lease_expired")
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
    refresh_task_status(task=Task.objects.get(pk=subtask.task_id))


def claimed_turn(*, worker: User, subtask_id: int) -> Subtask:
    """The turn, locked, if this worker account holds or last held its claim; else NotFound.

    Locks the task row first, then the turn: the order every writer of a task's turns uses
    (follow-ups, cancel, results), so concurrent writers queue instead of deadlocking.
    """
    task_id = (
        Subtask.objects.filter(pk=subtask_id, claimed_by=worker, role=Role.ASSISTANT)
        .values_list("task_id", flat=True)
        .first()
    )
    if task_id is not None:
        lock_task(task_id=task_id)
        subtask = (
            Subtask.objects.select_for_update().filter(pk=subtask_id, claimed_by=worker).first()
        )
        if subtask is not None:
            return subtask
    raise NotFound(f"Turn {subtask_id} is not claimed by this worker.")


def held_claim(*, worker: User, worker_id: str, attempt: int, subtask_id: int) -> Subtask:
    """The turn this claim holds, locked. NotFound if the worker never claimed it; TurnCancelled
    or LeaseLost (both 409, told apart by their code) if the claim may not go on."""
    subtask = claimed_turn(worker=worker, subtask_id=subtask_id)
    check_claim(subtask=subtask, worker_id=worker_id, attempt=attempt)
    return subtask


def lease_state(*, subtask: Subtask, worker_id: str, attempt: int) -> str:
    """The claim's state as a heartbeat reports it (see `LeaseState.state`)."""
    same_claim = subtask.lease_owner == worker_id and subtask.attempts == attempt
    if not same_claim:
        return "lease_lost"
    if subtask.status == SubtaskStatus.RUNNING:
        return "running"
    if subtask.status == SubtaskStatus.CANCELLED:
        return "cancelled"
    if subtask.status in (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED):
        return "finished"
    return "lease_lost"  # requeued: expired, retried or released


def check_claim(*, subtask: Subtask, worker_id: str, attempt: int) -> None:
    """Nothing if the claim (worker_id, attempt) holds the RUNNING turn; else the 409 saying why."""
    state = lease_state(subtask=subtask, worker_id=worker_id, attempt=attempt)
    if state == "running":
        return
    if state == "cancelled":
        raise TurnCancelled(
            f"Turn {subtask.pk} was cancelled; stop the executor (nothing more to report)."
        )
    if state == "finished":
        raise LeaseLost(f"Turn {subtask.pk} is already {subtask.status}.")
    if subtask.lease_owner == worker_id and subtask.attempts == attempt:
        raise LeaseLost(f"Turn {subtask.pk} is {subtask.status}; the lease is gone.")
    raise LeaseLost(
        f"The lease on turn {subtask.pk} was lost: it is now held by attempt {subtask.attempts}."
    )
