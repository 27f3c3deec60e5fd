"""Claims: which PENDING assistant turns a worker may take now, and taking them.

Invariant: exactly-once claim. Each dispatchable turn goes to exactly one caller, however many
workers claim at the same time: one `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
LOCKED)` statement on PostgreSQL (`claim_turns` in `backend/queries/dispatch.sql`); a
compare-and-set UPDATE per candidate elsewhere (SQLite,
whose IMMEDIATE transactions also serialize writers). A claim moves the turn to RUNNING under a new
attempt (the lease's fencing token, see `leases`) and the claimed turns' payloads are built by
`payload`. Turns wait out a retry backoff, and are held for a while for the worker that has
the bot's native session, before anyone may claim them. Summary jobs (`summaries`) wait in the
same queue and are claimed by the same query, exactly once; claiming one leaves its task's
status alone, and a dispatch may schedule new ones (after its payloads are built).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count, Exists, F, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from backend import queries
from backend.dispatch.leases import lease_until, reclaim_expired_leases
from backend.dispatch.models import ConfigurationVersion
from backend.dispatch.payload import (
    CLAIMED_FIELDS,
    ClaimedTurn,
    build_claimed_turns,
    claimed_rows,
    record_dispatch,
)
from backend.dispatch.summaries import schedule_summaries
from backend.errors import InvalidInput
from backend.prompting import Role
from backend.queries.rows import instance_of
from backend.tasks.models import (
    TURNS,
    NativeSession,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    Task,
)

MAX_CLAIM_LIMIT = 100


def claim_turns(
    *,
    worker: User,
    worker_id: str,
    kinds: Sequence[str],
    limit: int,
) -> list[ClaimedTurn]:
    """Claim up to `limit` dispatchable turns of these executor kinds, oldest first, and build
    each one's payload. Each turn is claimed by exactly one caller."""
    if not worker_id.strip():
        raise InvalidInput("worker_id must not be empty.", field="worker_id")
    if not 1 <= limit <= MAX_CLAIM_LIMIT:
        raise InvalidInput(f"limit must be between 1 and {MAX_CLAIM_LIMIT}.", field="limit")
    on_postgresql = connection.vendor == "postgresql"
    if not on_postgresql:
        reclaim_expired_leases()
    claim = _claim_ids(worker=worker, worker_id=worker_id, kinds=kinds, limit=limit)
    if claim.expired:
        # On PostgreSQL the claim statement asked whether a lease ran out (a round trip fewer
        # on every dispatch, where the answer is almost always no). Their turns go back in
        # line, keeping their place, and what the claim left of the limit is claimed again.
        reclaim_expired_leases()
        if len(claim.ids) < limit:
            more = _claim_ids(
                worker=worker, worker_id=worker_id, kinds=kinds, limit=limit - len(claim.ids)
            )
            if more.ids:
                claim = _Claim(
                    ids=sorted([*claim.ids, *more.ids]),
                    version=(
                        more.version
                        if not claim.ids or more.version == claim.version
                        else None  # the configuration changed in between: read it all
                    ),
                    rows=sorted([*(claim.rows or ()), *(more.rows or ())], key=_line_order),
                    sessions={**(claim.sessions or {}), **(more.sessions or {})},
                    expired=True,
                )
    if not claim.ids:
        return []
    claimed = build_claimed_turns(
        ids=claim.ids,
        worker=worker,
        worker_id=worker_id,
        configuration_version=claim.version,
        loaded=claim.rows,
        sessions=claim.sessions,
    )
    record_dispatch(claimed)
    schedule_summaries(prompts=[(turn.subtask, turn.prompt) for turn in claimed])
    return claimed


def next_ready_in_seconds(*, kinds: Sequence[str], worker_id: str) -> float | None:
    """For an idle worker: seconds until a pending turn of these kinds may be claimed by it
    (0: now), or None when none is pending. Turns waiting out a retry backoff, or held for
    the worker of their native session, count."""
    now = timezone.now()
    held = ~Q(session_worker="") & ~Q(session_worker=worker_id)
    found = _dispatchable(kinds=kinds).aggregate(
        pending=Count("id"),
        ready=Count("id", filter=_claimable_by(worker_id=worker_id, now=now)),
        backoff_ends=Min("not_before"),
        held_since=Min("pending_since", filter=held),
    )
    if not found["pending"]:
        return None
    if found["ready"]:
        return 0.0
    ends: list[datetime | None] = [found["backoff_ends"]]
    if found["held_since"] is not None:
        ends.append(
            found["held_since"] + timedelta(seconds=settings.BATON_SESSION_AFFINITY_SECONDS)
        )
    return max(0.0, (min(end for end in ends if end is not None) - now).total_seconds())


def claimable_exists(*, kinds: Sequence[str], worker_id: str, now: datetime) -> bool:
    """Whether a turn of these kinds is claimable by this worker now: one cheap EXISTS query,
    for a waiting dispatch that polls (`waiting`)."""
    return _dispatchable(kinds=kinds).filter(_claimable_by(worker_id=worker_id, now=now)).exists()


def _line_order(row: Subtask) -> tuple[datetime, int]:
    """A claimed turn's place in line (the claim's order)."""
    assert row.pending_since is not None
    return row.pending_since, row.pk


@dataclass(frozen=True)
class _Claim:
    """What a claim took (`_claim_ids`)."""

    ids: list[int]  # the turns claimed, by id
    # The configuration version their payloads may reuse what the process read under (None:
    # read it all; see `backend.configuration_cache`).
    version: int | None
    # On PostgreSQL, the claimed rows with their tasks, oldest first, and each claimed turn's
    # native session of its bot (by the turn's id); None: the payload reads them.
    rows: list[Subtask] | None
    sessions: dict[int, NativeSession] | None
    expired: bool  # whether a RUNNING turn's lease had run out (asked on PostgreSQL only)


def _claim_ids(*, worker: User, worker_id: str, kinds: Sequence[str], limit: int) -> _Claim:
    """Claim up to `limit` turns (see `_Claim`)."""
    now = timezone.now()
    version = None
    rows = None
    sessions = None
    expired = False
    claim = {
        "status": SubtaskStatus.RUNNING,
        "claimed_by": worker,
        "lease_owner": worker_id,
        "lease_expires_at": lease_until(now=now),
        "attempts": F("attempts") + 1,
        "not_before": None,
        "started_at": now,
        "updated_at": now,
    }
    if connection.vendor == "postgresql":
        rows, sessions, version, expired = _claim_in_one_statement(
            kinds=kinds, worker_id=worker_id, now=now, limit=limit, claim=claim
        )
        ids = sorted(row.pk for row in rows)
    else:
        candidates = _candidates(kinds=kinds, worker_id=worker_id, now=now)
        with transaction.atomic():
            ids = []
            for candidate in candidates.values_list("id", flat=True)[:limit]:
                # Compare-and-set: only the writer that still sees it PENDING gets it.
                if Subtask.objects.filter(pk=candidate, status=SubtaskStatus.PENDING).update(
                    **claim
                ):
                    ids.append(candidate)
        if ids:
            version = ConfigurationVersion.objects.values_list("value", flat=True).first()
    return _Claim(ids=ids, version=version, rows=rows, sessions=sessions, expired=expired)


def _claim_in_one_statement(
    *, kinds: Sequence[str], worker_id: str, now: datetime, limit: int, claim: dict[str, Any]
) -> tuple[list[Subtask], dict[int, NativeSession], int | None, bool]:
    """PostgreSQL: pick and claim in one statement (`claim_turns` in
    `backend/queries/dispatch.sql`), the ORM's `_candidates` picking written out. `claim` is
    `_claim_ids`'s.

    The claimed rows come back as the payload reads them (`payload.claimed_rows`: the turn
    as claimed, joined to its task), oldest first, each with its bot's native session in its
    task (the one row `native_session_per_bot` allows, if any; for turns, not summary jobs),
    with the configuration version and whether a RUNNING turn's lease ran out before `now`,
    all read in the claim's snapshot."""
    rows = queries.fetch(
        "claim_turns",
        {
            "claimed_by_id": claim["claimed_by"].pk,
            "worker_id": worker_id,
            "lease_expires_at": claim["lease_expires_at"],
            "now": now,
            "kinds": list(dict.fromkeys(kinds)),
            "affinity_over": _affinity_over(now=now),
            "limit": limit,
        },
        {
            "pending": SubtaskStatus.PENDING.value,
            "running": SubtaskStatus.RUNNING.value,
            "assistant": Role.ASSISTANT.value,
            "turn": SubtaskKind.TURN.value,
        },
    )
    # Each row: the claimed turn (its id first), its task, its session, the version, whether
    # a lease ran out.
    claimed = [row for row in rows if row[0] is not None]
    turns = claimed_rows(claimed)
    start = len(CLAIMED_FIELDS) + len(Task._meta.concrete_fields)
    by_turn = {}
    for turn, row in zip(turns, claimed, strict=True):
        session = _session_of(row[start:-2])
        if session is not None:
            by_turn[turn.pk] = session
    return turns, by_turn, rows[0][-2], rows[0][-1]


def _session_of(values: Sequence[Any]) -> NativeSession | None:
    """The native session of the claim statement's columns of one (None: no session)."""
    return None if values[0] is None else instance_of(NativeSession, values)


def _candidates(*, kinds: Sequence[str], worker_id: str, now: datetime) -> QuerySet[Subtask]:
    """The turns this worker may claim now, oldest first."""
    return (
        _dispatchable(kinds=kinds)
        .filter(_claimable_by(worker_id=worker_id, now=now))
        .order_by("pending_since", "id")
    )


def _dispatchable(*, kinds: Sequence[str]) -> QuerySet[Subtask]:
    return Subtask.objects.filter(
        _first_of_its_task(),
        status=SubtaskStatus.PENDING,
        role=Role.ASSISTANT,
        pending_since__isnull=False,
        executor__in=list(kinds),
    )


def _first_of_its_task() -> Q:
    """A turn no turn of its task runs beside or stands before in line: a task runs one turn
    at a time (`subtask_one_running_turn_per_task`), in its order. Should a task ever hold a
    turn pending beside a running one, or two in line, the later waits: a claim never takes
    two turns of one task, so one task's state never fails a batch. Summary jobs run beside
    turns."""
    task_turns = Subtask.objects.filter(TURNS, task_id=OuterRef("task_id"))
    running = task_turns.filter(status=SubtaskStatus.RUNNING)
    ahead = task_turns.filter(
        Q(pending_since__lt=OuterRef("pending_since"))
        | Q(pending_since=OuterRef("pending_since"), id__lt=OuterRef("id")),
        status=SubtaskStatus.PENDING,
    )
    return ~Q(TURNS) | (~Exists(running) & ~Exists(ahead))


def _claimable_by(*, worker_id: str, now: datetime) -> Q:
    """Past any retry backoff, and not held for the worker that has the bot's native session
    (which gets BATON_SESSION_AFFINITY_SECONDS to claim it and resume the session)."""
    return (Q(not_before__isnull=True) | Q(not_before__lte=now)) & (
        Q(session_worker="")
        | Q(session_worker=worker_id)
        | Q(pending_since__lte=_affinity_over(now=now))
    )


def _affinity_over(*, now: datetime) -> datetime:
    """Turns pending since before this moment are no longer held for their session's worker."""
    return now - timedelta(seconds=settings.BATON_SESSION_AFFINITY_SECONDS)
