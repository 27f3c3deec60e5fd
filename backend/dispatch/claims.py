"""Claims: which PENDING assistant turns a worker may take now, and taking them.

Invariant: exactly-once claim. Each dispatchable turn goes to exactly one caller, however many
workers claim at the same time: one `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
LOCKED)` statement on PostgreSQL; a compare-and-set UPDATE per candidate elsewhere (SQLite,
whose IMMEDIATE transactions also serialize writers). A claim moves the turn to RUNNING under a new
attempt (the lease's fencing token, see `leases`) and the claimed turns' payloads are built by
`payload`. Turns wait out a retry backoff, and are held for a while for the worker that has
the bot's native session, before anyone may claim them. Summary jobs (`summaries`) wait in the
same queue and are claimed by the same query, exactly once; claiming one leaves its task's
status alone, and a dispatch may schedule new ones (after its payloads are built).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count, F, Min, Q, QuerySet
from django.utils import timezone

from backend import sql
from backend.dispatch.leases import expired_lease_exists, lease_until, reclaim_expired_leases
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
from backend.tasks.models import (
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
    """PostgreSQL: pick and claim in one statement, `UPDATE … WHERE id IN (SELECT … FOR
    UPDATE SKIP LOCKED LIMIT n) RETURNING …` — one round trip instead of a transaction of
    four. The rows the subquery locks are skipped by every concurrent claim, and the UPDATE
    changes exactly those, so each turn still goes to one caller. `claim` is `_claim_ids`'s.

    The claimed rows come back as the payload reads them (`payload.claimed_rows`: the turn
    as claimed, joined to its task), oldest first, each with its bot's native session in its
    task (the one row `native_session_per_bot` allows, if any; for turns, not summary jobs)
    and the configuration version, all read in the claim's snapshot: the payload's own reads
    of them are two round trips fewer.
    The statement also says whether a RUNNING turn's lease ran out before `now` (the index
    range `leases` reads), on a row of its own when nothing was claimed: the claimed rows
    are LEFT JOINed to one row."""
    kinds = list(dict.fromkeys(kinds))  # as the ORM's IN does: each kind once
    picked, slots = _picking(len(kinds), limit, settings.BATON_SESSION_AFFINITY_SECONDS)
    picked_params = [slot.value(now=now, worker_id=worker_id, kinds=kinds) for slot in slots]
    values = [
        claim["status"],
        claim["claimed_by"].pk,
        claim["lease_owner"],
        claim["lease_expires_at"],
        claim["started_at"],
        claim["updated_at"],
    ]
    # Only column names and the ORM's own parameterized SQL (with the dispatch index's
    # constants written in by `_picking`) are formatted in.
    tasks, sessions = Task._meta.db_table, NativeSession._meta.db_table
    turn = sql.literal(SubtaskKind.TURN.value)  # a summary job has no session
    statement = (
        f"WITH claimed AS (UPDATE {Subtask._meta.db_table} SET status = %s, "  # noqa: S608
        "claimed_by_id = %s, lease_owner = %s, lease_expires_at = %s, started_at = %s, "
        "updated_at = %s, not_before = NULL, attempts = attempts + 1 "
        f"WHERE id IN ({picked} FOR UPDATE SKIP LOCKED) "
        f"RETURNING {sql.columns(Subtask, CLAIMED_FIELDS, table='')}) "
        f"SELECT {sql.columns(Subtask, CLAIMED_FIELDS, table='claimed')}, {sql.columns(Task)}, "
        f"{sql.columns(NativeSession, table='session')}, "
        f"(SELECT value FROM {ConfigurationVersion._meta.db_table} WHERE id = 1), "
        f"{expired_lease_exists()} "
        f"FROM (VALUES (1)) AS one LEFT JOIN (claimed JOIN {tasks} "
        f"ON {tasks}.id = claimed.task_id LEFT JOIN {sessions} AS session "
        "ON session.task_id = claimed.task_id AND session.bot = claimed.bot "
        f"AND session.executor = claimed.executor AND claimed.kind = {turn}) "
        "ON true ORDER BY claimed.pending_since, claimed.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [*values, *picked_params, sql.when(now)])
        rows = cursor.fetchall()
    # Each row: the claimed turn (its id first), its task, its session, the version, whether
    # a lease ran out.
    claimed = [row for row in rows if row[0] is not None]
    turns = claimed_rows(claimed)
    start = sql.width(Subtask, CLAIMED_FIELDS) + sql.width(Task)
    found = sql.models_of(NativeSession, [row[start:] for row in claimed])
    by_turn = {turn.pk: session for turn, session in zip(turns, found, strict=True) if session}
    return turns, by_turn, rows[0][-2], rows[0][-1]


# Stand-ins the claim's SELECT is compiled with, to find where each value goes among its
# parameters (`_picking`).
_AT = datetime(2000, 1, 1, tzinfo=UTC)
_WORKER = "\x00worker"


def _kind_stand_in(index: int) -> str:
    return f"\x00kind{index}"


@dataclass(frozen=True)
class _Slot:
    """One parameter of the claim's SELECT: a constant of the query, the claiming worker,
    one of the kinds asked for, or a moment at an offset from now."""

    constant: Any = None
    worker: bool = False
    kind: int | None = None
    offset: timedelta | None = None

    def value(self, *, now: datetime, worker_id: str, kinds: Sequence[str]) -> Any:
        if self.offset is not None:
            return now + self.offset
        if self.worker:
            return worker_id
        if self.kind is not None:
            return kinds[self.kind]
        return self.constant


@functools.lru_cache(maxsize=64)
def _picking(kinds: int, limit: int, affinity_seconds: float) -> tuple[str, tuple[_Slot, ...]]:
    """The SQL of the claim's SELECT for this many kinds and this limit, and its parameters'
    slots. The ORM compiles it once per shape (and affinity, which `_claimable_by` reads from
    settings), with stand-in values, instead of on every dispatch: compiling it cost more
    than the statement's round trip."""
    stand_ins = [_kind_stand_in(index) for index in range(kinds)]
    candidates = _candidates(kinds=stand_ins, worker_id=_WORKER, now=_AT)
    # The ORM compiles a locking read only inside a transaction; the statement is its own.
    compiled, params = candidates.values("id")[:limit].query.sql_with_params()
    pieces = compiled.split("%s")
    assert len(pieces) == len(params) + 1, compiled
    picked, slots = pieces[0], []
    for param, after in zip(params, pieces[1:], strict=True):
        if isinstance(param, datetime):
            slots.append(_Slot(offset=param - _AT))
        elif param == _WORKER:
            slots.append(_Slot(worker=True))
        elif param in stand_ins:
            slots.append(_Slot(kind=stand_ins.index(param)))
        elif isinstance(param, str) and param in _IN_TEXT:
            # The dispatch index's predicate (a pending assistant turn), written in for the
            # prepared statement's plan to read that index (`sql.literal`).
            picked += sql.literal(param) + after
            continue
        else:
            slots.append(_Slot(constant=param))
        picked += "%s" + after
    return picked, tuple(slots)


# The constants of the claim's SELECT written into its text: those `subtask_dispatch_order`'s
# predicate names.
_IN_TEXT = frozenset({SubtaskStatus.PENDING.value, Role.ASSISTANT.value})


def _candidates(*, kinds: Sequence[str], worker_id: str, now: datetime) -> QuerySet[Subtask]:
    """The turns this worker may claim now, oldest first."""
    return (
        _dispatchable(kinds=kinds)
        .filter(_claimable_by(worker_id=worker_id, now=now))
        .order_by("pending_since", "id")
    )


def _dispatchable(*, kinds: Sequence[str]) -> QuerySet[Subtask]:
    return Subtask.objects.filter(
        status=SubtaskStatus.PENDING,
        role=Role.ASSISTANT,
        pending_since__isnull=False,
        executor__in=list(kinds),
    )


def _claimable_by(*, worker_id: str, now: datetime) -> Q:
    """Past any retry backoff, and not held for the worker that has the bot's native session
    (which gets BATON_SESSION_AFFINITY_SECONDS to claim it and resume the session)."""
    affinity_over = now - timedelta(seconds=settings.BATON_SESSION_AFFINITY_SECONDS)
    return (Q(not_before__isnull=True) | Q(not_before__lte=now)) & (
        Q(session_worker="") | Q(session_worker=worker_id) | Q(pending_since__lte=affinity_over)
    )
