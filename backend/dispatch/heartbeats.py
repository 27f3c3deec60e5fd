"""Heartbeats and progress: a worker's word that a claim it holds is still running.

Workers send them far more often than anything else (a heartbeat about twice a second), so
each costs a read and, only when a lease is due for extension, a write. Each is fenced by its
claim (see `leases`): a claim that lost its lease, or whose turn was cancelled, is told so
(409 `lease_lost` with the reason, or `cancelled`) and changes nothing but the reclaim of a
lease it finds run out. Progress also counts as a heartbeat.

A worker's batched heartbeat carries the progress of all its running turns
(`record_claims_progress`): one request per worker and interval, not one per turn. Each claim's
progress is stored or refused on its own, as a progress post of its own would be, and its
outcome travels back in the heartbeat's answer. What became of the steers a claim was handed
is fenced the same way (`settle_claims_steers`); the answer hands each new steer's text to the
claim once (`steering.offered_steers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.dispatch.leases import (
    LEASE_COLUMNS,
    LEASE_LOST,
    RUNNING,
    LeaseState,
    fenced_turn,
    lease_ran_out,
    lease_renewal_due,
    lease_state,
    lease_until,
    reclaim_expired_leases,
)
from backend.errors import BatonError, NotFound, PartialTextMismatch
from backend.prompting import Role
from backend.tasks import partial_texts, task_events
from backend.tasks.history import any_of
from backend.tasks.models import Subtask, SubtaskKind, SubtaskStatus
from backend.tasks.services.steering import offered_steers, settle_steers

MAX_PROGRESS_EVENTS = 200


@dataclass(frozen=True)
class ProgressReport:
    """A running turn's progress since the last report: events, and the partial answer whole
    (`partial_text`) or what it gained (`partial_text_append` at `partial_text_offset`)."""

    events: list[dict[str, Any]]
    partial_text: str | None = None
    partial_text_append: str | None = None
    partial_text_offset: int | None = None


@dataclass(frozen=True)
class ProgressOutcome:
    """What became of one claim's progress in a batched heartbeat: stored, or refused with the
    code and message a progress post of its own would have got (`partial_text_mismatch`,
    `lease_lost`, `cancelled`, `not_found`, `too_large`). `partial_text_chars` is the stored
    partial text's length when Baton tells it: after storing, and on `partial_text_mismatch`."""

    stored: bool
    partial_text_chars: int | None = None
    code: str | None = None
    detail: str | None = None


def heartbeat(*, worker: User, worker_id: str, attempt: int, subtask_id: int) -> Subtask:
    """Extend the lease on a turn the worker holds when it is due (`lease_renewal_due`); a
    lease already run out stays lost."""
    now = timezone.now()
    with transaction.atomic():
        subtask, refusal = fenced_turn(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id, now=now
        )
        due = lease_renewal_due(lease_expires_at=subtask.lease_expires_at, now=now)
        if refusal is None and due:
            subtask.lease_expires_at = lease_until(now=now)
            subtask.save(update_fields=["lease_expires_at", "updated_at"])
    if refusal is not None:
        raise refusal  # after the commit: a lease found run out was reclaimed
    return subtask


def heartbeat_claims(
    *, worker: User, worker_id: str, claims: Sequence[tuple[int, int]]
) -> list[LeaseState]:
    """The state of every claim a worker holds, in one call, extending the running ones.

    `claims` are (subtask_id, attempt) pairs. Workers call this about once a second so that a
    cancel reaches the executor quickly, so it costs one read, and a write only for leases
    last extended more than a heartbeat interval ago. The extension is a compare-and-set on
    the claim (owner, attempt, RUNNING, lease not yet run out), so it needs no task lock and
    cannot revive a lease that ran out, or a turn that was cancelled or reclaimed meanwhile.
    A claim whose lease ran out is `lease_lost`, and its turn is reclaimed at once. A running
    claim whose turn has steers open is handed the ones still waiting (one more read, only
    then).
    """
    if not claims:
        return []
    wanted = dict(claims)
    rows = {
        row.id: row
        for row in Subtask.objects.filter(
            pk__in=list(wanted), claimed_by=worker, role=Role.ASSISTANT
        ).values_list("id", *LEASE_COLUMNS, named=True)
    }
    now = timezone.now()
    renewed_until = lease_until(now=now)
    to_renew = [
        row
        for subtask_id, row in rows.items()
        if lease_state(subtask=row, worker_id=worker_id, attempt=wanted[subtask_id], now=now)
        == RUNNING
        and lease_renewal_due(lease_expires_at=row.lease_expires_at, now=now)
    ]
    renewed: set[int] = set()
    if to_renew:
        condition = any_of([Q(pk=row.id, attempts=row.attempts) for row in to_renew])
        with transaction.atomic():
            ids = list(
                Subtask.objects.filter(
                    condition, status=SubtaskStatus.RUNNING, lease_owner=worker_id
                )
                .exclude(lease_expires_at__lt=now)
                .values_list("id", flat=True)
            )
            Subtask.objects.filter(pk__in=ids, status=SubtaskStatus.RUNNING).exclude(
                lease_expires_at__lt=now
            ).update(lease_expires_at=renewed_until, updated_at=now)
        renewed = set(ids)
    lost_meanwhile = {row.id for row in to_renew} - renewed
    states = []
    for subtask_id, attempt in claims:
        row = rows.get(subtask_id)
        if row is None:
            states.append(LeaseState(subtask_id, attempt, LEASE_LOST, None))
            continue
        state = lease_state(subtask=row, worker_id=worker_id, attempt=attempt, now=now)
        if subtask_id in lost_meanwhile:
            state = LEASE_LOST  # cancelled, reclaimed or run out between the read and the renewal
        expires = renewed_until if subtask_id in renewed else row.lease_expires_at
        states.append(LeaseState(subtask_id, attempt, state, expires))
    steered = [
        (state.subtask_id, state.attempt)
        for state in states
        if state.state == RUNNING and rows[state.subtask_id].steers_open
    ]
    if steered:
        offers = offered_steers(claims=steered)
        states = [
            replace(state, steers=offers.get((state.subtask_id, state.attempt), ()))
            for state in states
        ]
    run_out = [
        subtask_id
        for subtask_id, row in rows.items()
        if lease_ran_out(subtask=row, worker_id=worker_id, attempt=wanted[subtask_id], now=now)
    ]
    if run_out:
        reclaim_expired_leases(now=now, subtask_ids=run_out)
    return states


def settle_claims_steers(
    *,
    worker: User,
    worker_id: str,
    results: Mapping[tuple[int, int], Mapping[int, str | None]],
) -> None:
    """Record what a batched heartbeat says became of each claim's steers (by claim, steer id
    → None when delivered, else the refusal), for the claims it holds: fenced like its
    progress (`fenced_turn`), each claim in a transaction of its own. A claim the account does
    not hold, or that lost its lease, changes nothing here; its state in the answer says why.
    """
    for (subtask_id, attempt), by_steer in results.items():
        if not by_steer:
            continue
        try:
            with transaction.atomic():
                subtask, refusal = fenced_turn(
                    worker=worker,
                    worker_id=worker_id,
                    attempt=attempt,
                    subtask_id=subtask_id,
                    now=timezone.now(),
                )
                if refusal is None:
                    settle_steers(task=subtask.task, target=subtask, results=by_steer)
        except NotFound:
            continue  # never this account's: its heartbeat state says `lease_lost`


def record_claims_progress(
    *, worker: User, worker_id: str, reports: Mapping[tuple[int, int], ProgressReport]
) -> dict[tuple[int, int], ProgressOutcome]:
    """Store the progress a batched heartbeat carries, keyed by (subtask_id, attempt) claim.

    Each claim's progress is `record_progress` in its own transaction: stored whole or not at
    all, and one claim's refusal (its lease lost, its offset stale) leaves the others stored.
    """
    outcomes = {}
    for (subtask_id, attempt), report in reports.items():
        try:
            subtask = record_progress(
                worker=worker,
                worker_id=worker_id,
                attempt=attempt,
                subtask_id=subtask_id,
                events=report.events,
                partial_text=report.partial_text,
                partial_text_append=report.partial_text_append,
                partial_text_offset=report.partial_text_offset,
            )
        except PartialTextMismatch as refusal:
            outcome = ProgressOutcome(
                stored=False,
                partial_text_chars=refusal.stored_chars,
                code=refusal.code,
                detail=refusal.message,
            )
        except BatonError as refusal:
            outcome = ProgressOutcome(stored=False, code=refusal.code, detail=refusal.message)
        else:
            outcome = ProgressOutcome(stored=True, partial_text_chars=subtask.partial_text_chars)
        outcomes[(subtask_id, attempt)] = outcome
    return outcomes


def record_progress(
    *,
    worker: User,
    worker_id: str,
    attempt: int,
    subtask_id: int,
    events: list[dict[str, Any]],
    partial_text: str | None,
    partial_text_append: str | None = None,
    partial_text_offset: int | None = None,
) -> Subtask:
    """Append streamed progress events (the latest MAX_PROGRESS_EVENTS are kept) and extend
    the partial answer (`partial_text_append` at `partial_text_offset`) or replace it
    (`partial_text`): see `backend.tasks.partial_texts`. An offset that is not the stored
    text's length is refused whole (409 `partial_text_mismatch`, nothing of the post stored),
    so the worker sends the post again with the whole text. Progress also counts as a
    heartbeat: it extends the lease when that is due, as a heartbeat would, so that most posts
    leave the row's indexed columns alone."""
    now = timezone.now()
    with transaction.atomic():
        subtask, refusal = fenced_turn(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id, now=now
        )
        if refusal is None:
            _append_progress(
                subtask,
                events=events,
                partial_text=partial_text,
                partial_text_append=partial_text_append,
                partial_text_offset=partial_text_offset,
                now=now,
            )
    if refusal is not None:
        raise refusal  # after the commit: a lease found run out was reclaimed
    return subtask


def _append_progress(
    subtask: Subtask,
    *,
    events: list[dict[str, Any]],
    partial_text: str | None,
    partial_text_append: str | None,
    partial_text_offset: int | None,
    now: datetime,
) -> None:
    change = None
    if partial_text is not None:
        change = partial_texts.replace_partial_text(subtask=subtask, text=partial_text)
    elif partial_text_append is not None and partial_text_offset is not None:
        change = partial_texts.append_partial_text(
            subtask=subtask, text=partial_text_append, offset=partial_text_offset
        )
    subtask.progress_events = ((subtask.progress_events or []) + list(events))[
        -MAX_PROGRESS_EVENTS:
    ]
    # Summary jobs are no turns: the task's event log says nothing of them.
    if (events or change is not None) and subtask.kind == SubtaskKind.TURN:
        task_events.record(
            task_id=subtask.task_id,
            events=[
                task_events.progress_event(
                    subtask,
                    events=list(events),
                    added=None if change is None else change.added,
                    reset=change is not None and change.reset,
                )
            ],
        )
    subtask.progress_updated_at = now
    changed = ["progress_events", "progress_updated_at", "updated_at"]
    if change is not None:
        # Never `partial_text` on an append: PostgreSQL would write the whole text again.
        changed += ["partial_text_chars", "partial_text_bytes"]
        if partial_text is not None:
            changed.append("partial_text")  # emptied: the whole text is the first piece
    if lease_renewal_due(lease_expires_at=subtask.lease_expires_at, now=now):
        subtask.lease_expires_at = lease_until(now=now)
        changed.append("lease_expires_at")
    subtask.save(update_fields=changed)
