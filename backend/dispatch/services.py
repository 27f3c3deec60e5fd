"""Exactly-once dispatch of ASSISTANT turns to executor workers, leases and result reporting.

A worker claims turns with `claim_turns`; each claim is a lease that heartbeats extend. A claim
is named by (worker account, worker_id, attempt): heartbeats, progress and results must name
the claim they hold, so a worker whose lease expired and was given to another worker cannot
change the turn any more (409). Claims are atomic: `SELECT … FOR UPDATE SKIP LOCKED` on
PostgreSQL, a compare-and-set UPDATE on databases without it (SQLite, whose IMMEDIATE
transactions also serialize writers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Count, F, Min, Q
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.artifacts.selectors import manifest_artifacts
from backend.dispatch.models import PromptReport
from backend.dispatch.policies import policy_rows, resolve_from_rows
from backend.dispatch.prompts import TurnPrompt, build_turn_prompt
from backend.dispatch.sessions import (
    RESUME,
    native_sessions_for,
    record_session,
    resume_input,
    resume_reason,
)
from backend.errors import Conflict, InvalidInput, LeaseLost, NotFound, TurnCancelled
from backend.tasks.history import any_of, prompt_input_for, prompt_inputs_for
from backend.tasks.ingestion import replace_unstorable_chars
from backend.tasks.models import Bot, NativeSession, Role, Subtask, SubtaskStatus, Task, TaskStatus
from backend.tasks.selectors import bots_for_turns, turn_result
from backend.tasks.services import (
    check_text_size,
    lock_task,
    record_result,
    refresh_task_status,
)

logger = logging.getLogger("baton.dispatch")

EXECUTOR_GROUP = "baton-executors"
MAX_CLAIM_LIMIT = 100
MAX_PROGRESS_EVENTS = 200
RECLAIM_BATCH = 200
# What a worker may report for a claim: an outcome, or a requeue.
COMPLETED, FAILED = SubtaskStatus.COMPLETED.value, SubtaskStatus.FAILED.value
RETRY = "RETRY"  # a transient failure: back to PENDING after a backoff, attempts counted
RELEASE = "RELEASE"  # the worker gives the turn back unfinished (shutdown): PENDING at once
REPORT_STATUSES = (COMPLETED, FAILED, RETRY, RELEASE)


@dataclass(frozen=True)
class ClaimedTurn:
    subtask: Subtask
    task: Task
    bot: Bot
    prompt: TurnPrompt
    report: PromptReport
    manifest: list[Artifact]
    # Offered when the claiming worker can resume the bot's native session (see sessions.py).
    session: NativeSession | None
    resume: TurnPrompt | None
    resume_report: PromptReport | None
    resume_reason: str


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


def is_executor_worker(user: AbstractBaseUser) -> bool:
    if not user.is_authenticated:
        return False
    cached = getattr(user, "_baton_is_worker", None)
    if cached is None:
        cached = user.groups.filter(name=EXECUTOR_GROUP).exists()
        user._baton_is_worker = cached
    return cached


# --- leases -------------------------------------------------------------------------------


def _lease_until(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.BATON_LEASE_SECONDS)


def heartbeat_interval_seconds() -> int:
    """How often a worker should extend its leases: well inside the lease."""
    return max(1, min(60, settings.BATON_LEASE_SECONDS // 4))


def _attempts_used(subtask: Subtask) -> int:
    """Claims that count against BATON_MAX_ATTEMPTS: releases on shutdown do not."""
    return subtask.attempts - subtask.releases


def retry_backoff_seconds(*, attempt: int) -> float:
    """Delay before a turn that failed transiently on `attempt` may be claimed again."""
    delay = settings.BATON_RETRY_BACKOFF_SECONDS * 2 ** max(0, attempt - 1)
    return min(delay, settings.BATON_RETRY_BACKOFF_MAX_SECONDS)


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
            error = (
                f"The executor lease expired on attempt {_attempts_used(subtask)} of "
                f"{settings.BATON_MAX_ATTEMPTS} (last worker {subtask.lease_owner!r})"
            )
            if _attempts_used(subtask) >= settings.BATON_MAX_ATTEMPTS:
                record_result(
                    subtask=subtask,
                    status=SubtaskStatus.FAILED,
                    error=f"{error}; Baton gave up on this turn.",
                    error_code="lease_expired",
                )
                failed += 1
            else:
                _requeue(subtask, error=f"{error}.", error_code="lease_expired")
                requeued += 1
    if requeued or failed:
        logger.info(
            json.dumps({"event": "leases_reclaimed", "requeued": requeued, "failed": failed})
        )
    return ReclaimSummary(requeued=requeued, failed=failed)


def _requeue(
    subtask: Subtask,
    *,
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


# --- claiming ------------------------------------------------------------------------------


def _claim_ids(
    *, worker: AbstractBaseUser, worker_id: str, kinds: Sequence[str], limit: int
) -> list[int]:
    now = timezone.now()
    claim = {
        "status": SubtaskStatus.RUNNING,
        "claimed_by": worker,
        "lease_owner": worker_id,
        "lease_expires_at": _lease_until(now),
        "attempts": F("attempts") + 1,
        "not_before": None,
        "started_at": now,
        "updated_at": now,
    }
    candidates = (
        _dispatchable(kinds).filter(_claimable_by(worker_id, now)).order_by("pending_since", "id")
    )
    with transaction.atomic():
        if connection.features.has_select_for_update_skip_locked:
            ids = list(
                candidates.select_for_update(skip_locked=True).values_list("id", flat=True)[:limit]
            )
            if ids:
                Subtask.objects.filter(pk__in=ids).update(**claim)
        else:
            ids = []
            for candidate in candidates.values_list("id", flat=True)[:limit]:
                # Compare-and-set: only the writer that still sees it PENDING gets it.
                if Subtask.objects.filter(pk=candidate, status=SubtaskStatus.PENDING).update(
                    **claim
                ):
                    ids.append(candidate)
    if ids:
        # After the claim commits, not inside it: the claim holds turn locks, and taking task
        # locks after them would invert the order of follow-ups and cancel (task, then turns).
        # A task cancelled meanwhile keeps its status.
        Task.objects.filter(pk__in=Subtask.objects.filter(pk__in=ids).values("task_id")).exclude(
            status=TaskStatus.CANCELLED
        ).update(status=TaskStatus.RUNNING, updated_at=now)
    return ids


def _dispatchable(kinds: Sequence[str]):
    return Subtask.objects.filter(
        status=SubtaskStatus.PENDING,
        role=Role.ASSISTANT,
        pending_since__isnull=False,
        executor__in=list(kinds),
    )


def _claimable_by(worker_id: str, now: datetime) -> Q:
    """Past any retry backoff, and not held for the worker that has the bot's native session
    (which gets BATON_SESSION_AFFINITY_SECONDS to claim it and resume the session)."""
    affinity_over = now - timedelta(seconds=settings.BATON_SESSION_AFFINITY_SECONDS)
    return (Q(not_before__isnull=True) | Q(not_before__lte=now)) & (
        Q(session_worker="") | Q(session_worker=worker_id) | Q(pending_since__lte=affinity_over)
    )


def next_ready_in_seconds(*, kinds: Sequence[str], worker_id: str) -> float | None:
    """For an idle worker: seconds until a pending turn of these kinds may be claimed by it
    (0: now), or None when none is pending. Turns waiting out a retry backoff, or held for
    the worker of their native session, count."""
    now = timezone.now()
    held = ~Q(session_worker="") & ~Q(session_worker=worker_id)
    found = _dispatchable(kinds).aggregate(
        pending=Count("id"),
        ready=Count("id", filter=_claimable_by(worker_id, now)),
        backoff_ends=Min("not_before"),
        held_since=Min("pending_since", filter=held),
    )
    if not found["pending"]:
        return None
    if found["ready"]:
        return 0.0
    ends = [found["backoff_ends"]]
    if found["held_since"] is not None:
        ends.append(
            found["held_since"] + timedelta(seconds=settings.BATON_SESSION_AFFINITY_SECONDS)
        )
    return max(0.0, (min(end for end in ends if end is not None) - now).total_seconds())


def _report_row(
    *, subtask: Subtask, worker_id: str, prompt: TurnPrompt, kind: str, resume_reason: str
) -> PromptReport:
    report = prompt.build.report
    return PromptReport(
        kind=kind,
        resume_reason=resume_reason,
        included_message_ids=list(report.included_message_ids),
        subtask=subtask,
        task_id=subtask.task_id,
        attempt=subtask.attempts,
        worker_id=worker_id,
        policy=prompt.resolved.row,
        policy_source=prompt.resolved.source,
        policy_version=prompt.resolved.version,
        history_enabled=prompt.resolved.policy.enabled,
        context_passing=prompt.context_passing,
        messages_considered=report.messages_considered,
        messages_included=report.messages_included,
        messages_omitted=report.messages_omitted,
        omitted_user=report.omitted_user,
        omitted_assistant=report.omitted_assistant,
        truncated=[item.model_dump(mode="json") for item in report.truncated],
        truncated_count=len(report.truncated),
        sections=list(report.sections),
        chars=report.chars,
        bytes=report.bytes,
        tokens=report.tokens,
        history_tokens=report.history_tokens,
        current_tokens=report.current_tokens,
        previous_result_tokens=report.previous_result_tokens,
        token_encoding=report.token_encoding,
        artifacts=list(report.artifacts),
        first_user_message_pinned=report.first_user_message_pinned,
        build_ms=round(prompt.build_ms, 3),
    )


def _log_dispatch(row: PromptReport, subtask: Subtask) -> None:
    """One structured line per dispatch: ids, counts, sizes, timing — never text."""
    logger.info(
        json.dumps(
            {
                "event": "dispatch",
                "prompt": row.kind,
                "resume_reason": row.resume_reason,
                "task": subtask.task_id,
                "subtask": subtask.pk,
                "message_id": subtask.message_id,
                "executor": subtask.executor,
                "attempt": row.attempt,
                "worker_id": row.worker_id,
                "policy_id": row.policy_id,
                "policy_version": row.policy_version,
                "policy_source": row.policy_source,
                "history_enabled": row.history_enabled,
                "messages_included": row.messages_included,
                "messages_omitted": row.messages_omitted,
                "truncated": row.truncated_count,
                "chars": row.chars,
                "bytes": row.bytes,
                "tokens": row.tokens,
                "artifacts": len(row.artifacts),
                "build_ms": row.build_ms,
            },
            sort_keys=True,
        )
    )


def _build_failed(*, subtask: Subtask, worker_id: str, error: Exception) -> None:
    # The exception text may quote content; log only its type (principle 7).
    logger.error(
        json.dumps(
            {
                "event": "dispatch_build_failed",
                "task": subtask.task_id,
                "subtask": subtask.pk,
                "attempt": subtask.attempts,
                "error_type": type(error).__name__,
            }
        )
    )
    _release_failed_claim(subtask=subtask, worker_id=worker_id, reason=type(error).__name__)


def _release_failed_claim(*, subtask: Subtask, worker_id: str, reason: str) -> None:
    """Undo a claim whose payload could not be built; after the last attempt, fail the turn."""
    with transaction.atomic():
        lock_task(task_id=subtask.task_id)
        current = Subtask.objects.filter(
            pk=subtask.pk, status=SubtaskStatus.RUNNING, lease_owner=worker_id
        ).first()
        if current is None:
            return
        error = f"Baton could not build this turn's prompt ({reason})."
        if _attempts_used(current) >= settings.BATON_MAX_ATTEMPTS:
            record_result(
                subtask=current,
                status=SubtaskStatus.FAILED,
                error=error,
                error_code="prompt_build_failed",
            )
        else:
            _requeue(current, error=error, error_code="prompt_build_failed")


def claim_turns(
    *,
    worker: AbstractBaseUser,
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
    reclaim_expired_leases()
    ids = _claim_ids(worker=worker, worker_id=worker_id, kinds=kinds, limit=limit)
    if not ids:
        return []
    subtasks = list(
        Subtask.objects.filter(pk__in=ids)
        .select_related("task")
        .defer("result", "prompt", "history_text", "preview_head", "preview_tail")
        .order_by("pending_since", "id")
    )
    bots = bots_for_turns(subtasks)
    rows = policy_rows(task_types={subtask.task.task_type for subtask in subtasks})
    resolved = {
        subtask.pk: resolve_from_rows(task_type=subtask.task.task_type, rows=rows)
        for subtask in subtasks
    }
    try:
        inputs = prompt_inputs_for(
            requests=[(subtask, subtask.task, resolved[subtask.pk].policy) for subtask in subtasks]
        )
    except Exception:  # noqa: BLE001 - fall back to one turn at a time to isolate the failure
        inputs = {}
    try:
        sessions = native_sessions_for(subtasks)
    except Exception as error:  # noqa: BLE001 - any failure must release the claims
        for subtask in subtasks:
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
        return []
    built: list[tuple[Subtask, TurnPrompt, TurnPrompt | None, str]] = []
    for subtask in subtasks:
        if subtask.pk not in bots:
            _build_failed(
                subtask=subtask, worker_id=worker_id, error=LookupError("no bot for the turn")
            )
            continue
        policy = resolved[subtask.pk]
        try:
            full_input = inputs.get(subtask.pk) or prompt_input_for(
                subtask=subtask, task=subtask.task, policy=policy.policy
            )
            prompt = build_turn_prompt(
                subtask=subtask, task=subtask.task, resolved=policy, prompt_input=full_input
            )
            session = sessions.get(subtask.pk)
            reason = resume_reason(
                subtask=subtask,
                session=session,
                bot=bots[subtask.pk],
                policy=policy.policy,
                worker_id=worker_id,
                full_input=full_input,
            )
            resume = None
            if reason == RESUME:
                assert session is not None
                resume = build_turn_prompt(
                    subtask=subtask,
                    task=subtask.task,
                    resolved=policy,
                    prompt_input=resume_input(
                        full_input, seen_through=session.seen_through_message_id
                    ),
                )
        except Exception as error:  # noqa: BLE001 - any failure must release the claim
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
            continue
        built.append((subtask, prompt, resume, reason))
    try:
        manifest_entries = {
            artifact.id: artifact
            for artifact in manifest_artifacts(
                artifact_ids=[
                    artifact_id
                    for _, prompt, resume, _ in built
                    for artifact_id in _artifacts_of(prompt, resume)
                ]
            )
        }
    except Exception as error:  # noqa: BLE001
        for subtask, *_ in built:
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
        return []
    claimed: list[ClaimedTurn] = []
    for subtask, prompt, resume, reason in built:
        claimed.append(
            ClaimedTurn(
                subtask=subtask,
                task=subtask.task,
                bot=bots[subtask.pk],
                prompt=prompt,
                report=_report_row(
                    subtask=subtask,
                    worker_id=worker_id,
                    prompt=prompt,
                    kind="full",
                    resume_reason=reason,
                ),
                manifest=[
                    manifest_entries[artifact_id] for artifact_id in _artifacts_of(prompt, resume)
                ],
                session=sessions.get(subtask.pk) if resume is not None else None,
                resume=resume,
                resume_report=(
                    _report_row(
                        subtask=subtask,
                        worker_id=worker_id,
                        prompt=resume,
                        kind=RESUME,
                        resume_reason=reason,
                    )
                    if resume is not None
                    else None
                ),
                resume_reason=reason,
            )
        )
    PromptReport.objects.bulk_create(
        [report for turn in claimed for report in (turn.report, turn.resume_report) if report]
    )
    for turn in claimed:
        _log_dispatch(turn.report, turn.subtask)
        if turn.resume_report is not None:
            _log_dispatch(turn.resume_report, turn.subtask)
    return claimed


def _artifacts_of(prompt: TurnPrompt, resume: TurnPrompt | None) -> list[str]:
    """Artifacts either prompt points to, each once: one manifest serves both (with fewer
    turns, a resume prompt may keep a turn the full prompt dropped)."""
    ids = list(prompt.build.report.artifacts)
    if resume is not None:
        ids += [artifact for artifact in resume.build.report.artifacts if artifact not in ids]
    return ids


# --- heartbeat, progress, result ------------------------------------------------------------


def _claimed_turn(*, worker: AbstractBaseUser, subtask_id: int) -> Subtask:
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


def _held_claim(
    *, worker: AbstractBaseUser, worker_id: str, attempt: int, subtask_id: int
) -> Subtask:
    """The turn this claim holds, locked. NotFound if the worker never claimed it; TurnCancelled
    or LeaseLost (both 409, told apart by their code) if the claim may not go on."""
    subtask = _claimed_turn(worker=worker, subtask_id=subtask_id)
    _check_claim(subtask, worker_id=worker_id, attempt=attempt)
    return subtask


def _lease_state(subtask: Subtask, *, worker_id: str, attempt: int) -> str:
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


def _check_claim(subtask: Subtask, *, worker_id: str, attempt: int) -> None:
    state = _lease_state(subtask, worker_id=worker_id, attempt=attempt)
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


def heartbeat(
    *, worker: AbstractBaseUser, worker_id: str, attempt: int, subtask_id: int
) -> Subtask:
    """Extend the lease on a turn the worker holds."""
    with transaction.atomic():
        subtask = _held_claim(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id
        )
        subtask.lease_expires_at = _lease_until(timezone.now())
        subtask.save(update_fields=["lease_expires_at", "updated_at"])
    return subtask


def heartbeat_claims(
    *, worker: AbstractBaseUser, worker_id: str, claims: Sequence[tuple[int, int]]
) -> list[LeaseState]:
    """The state of every claim a worker holds, in one call, extending the running ones.

    `claims` are (subtask_id, attempt) pairs. Workers call this about once a second so that a
    cancel reaches the executor quickly, so it costs one read, and a write only for leases
    last extended more than a heartbeat interval ago. The extension is a compare-and-set on
    the claim (owner, attempt, RUNNING), so it needs no task lock and cannot revive a turn
    that was cancelled or reclaimed meanwhile.
    """
    if not claims:
        return []
    wanted = dict(claims)
    rows = {
        subtask.pk: subtask
        for subtask in Subtask.objects.filter(
            pk__in=list(wanted), claimed_by=worker, role=Role.ASSISTANT
        ).only("id", "status", "lease_owner", "attempts", "lease_expires_at")
    }
    now = timezone.now()
    renew_before = _lease_until(now) - timedelta(seconds=heartbeat_interval_seconds())
    renewed_until = _lease_until(now)
    to_renew = [
        subtask
        for subtask_id, subtask in rows.items()
        if _lease_state(subtask, worker_id=worker_id, attempt=wanted[subtask_id]) == "running"
        and (subtask.lease_expires_at is None or subtask.lease_expires_at <= renew_before)
    ]
    renewed: set[int] = set()
    if to_renew:
        condition = any_of([Q(pk=subtask.pk, attempts=subtask.attempts) for subtask in to_renew])
        with transaction.atomic():
            ids = list(
                Subtask.objects.filter(
                    condition, status=SubtaskStatus.RUNNING, lease_owner=worker_id
                ).values_list("id", flat=True)
            )
            Subtask.objects.filter(pk__in=ids, status=SubtaskStatus.RUNNING).update(
                lease_expires_at=renewed_until, updated_at=now
            )
        renewed = set(ids)
    lost_meanwhile = {subtask.pk for subtask in to_renew} - renewed
    states = []
    for subtask_id, attempt in claims:
        subtask = rows.get(subtask_id)
        if subtask is None:
            states.append(LeaseState(subtask_id, attempt, "lease_lost", None))
            continue
        state = _lease_state(subtask, worker_id=worker_id, attempt=attempt)
        if subtask.pk in lost_meanwhile:
            state = "lease_lost"  # cancelled or reclaimed between the read and the renewal
        expires = renewed_until if subtask.pk in renewed else subtask.lease_expires_at
        states.append(LeaseState(subtask_id, attempt, state, expires))
    return states


def record_progress(
    *,
    worker: AbstractBaseUser,
    worker_id: str,
    attempt: int,
    subtask_id: int,
    events: list[dict[str, Any]],
    partial_text: str | None,
) -> Subtask:
    """Append streamed progress events (the latest MAX_PROGRESS_EVENTS are kept) and replace the
    partial answer. Progress also counts as a heartbeat."""
    if partial_text is not None:
        check_text_size(
            text=partial_text, limit=settings.BATON_MAX_MESSAGE_BYTES, field="partial_text"
        )
    with transaction.atomic():
        subtask = _held_claim(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id
        )
        now = timezone.now()
        subtask.progress_events = ((subtask.progress_events or []) + list(events))[
            -MAX_PROGRESS_EVENTS:
        ]
        if partial_text is not None:
            subtask.partial_text = replace_unstorable_chars(partial_text)[0]
        subtask.progress_updated_at = now
        subtask.lease_expires_at = _lease_until(now)
        subtask.save(
            update_fields=[
                "progress_events",
                "partial_text",
                "progress_updated_at",
                "lease_expires_at",
                "updated_at",
            ]
        )
    return subtask


def report_result(
    *,
    worker: AbstractBaseUser,
    worker_id: str,
    attempt: int,
    subtask_id: int,
    status: str,
    result: dict | None,
    error: str,
    error_code: str = "",
    usage: dict | None,
    native_session_id: str,
    session_resumed: bool = False,
) -> tuple[Subtask, bool]:
    """Record the outcome of a claimed turn. Returns (turn, changed).

    COMPLETED and FAILED finish the turn. RETRY (a transient failure: rate limit, provider
    error, network) puts it back to PENDING after a backoff, or fails it for good with this
    error once BATON_MAX_ATTEMPTS claims have been used. RELEASE gives it back at once (the
    worker is shutting down) and does not use up an attempt.

    Idempotent: the same report from the same claim a second time changes nothing and returns
    changed=False. A different report for an already finished turn, or any report from a claim
    that was lost or cancelled, is a Conflict.
    """
    if status not in REPORT_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(REPORT_STATUSES)}.", field="status")
    if status == RETRY and not error.strip():
        raise InvalidInput("error is required when status is RETRY.", field="error")
    if status == RELEASE:
        error_code = error_code or "shutdown"
    with transaction.atomic():
        subtask = _claimed_turn(worker=worker, subtask_id=subtask_id)
        same_claim = subtask.lease_owner == worker_id and subtask.attempts == attempt
        if same_claim and _is_repeat(
            subtask,
            status=status,
            result=result,
            error=error,
            error_code=error_code,
            usage=usage,
        ):
            return subtask, False
        if subtask.status in (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED) and same_claim:
            raise Conflict(f"Turn {subtask_id} already has a different result recorded.")
        _check_claim(subtask, worker_id=worker_id, attempt=attempt)
        if status == RELEASE:
            _requeue(subtask, error=error, error_code=error_code, released=True)
        elif status == RETRY and _attempts_used(subtask) < settings.BATON_MAX_ATTEMPTS:
            _requeue(
                subtask,
                error=error,
                error_code=error_code,
                delay_seconds=retry_backoff_seconds(attempt=_attempts_used(subtask)),
            )
        else:
            if status == RETRY:
                status = SubtaskStatus.FAILED
                error = (
                    f"{error}\n(attempt {_attempts_used(subtask)} of "
                    f"{settings.BATON_MAX_ATTEMPTS}; Baton gave up on this turn)"
                )
            record_result(
                subtask=subtask,
                status=status,
                result=result,
                error=error,
                error_code=error_code,
                usage=usage,
                native_session_id=native_session_id,
            )
            subtask.refresh_from_db()
            record_session(
                subtask=subtask,
                worker_id=worker_id,
                session_id=native_session_id,
                resumed=session_resumed,
                usage=usage,
            )
        subtask.refresh_from_db()
    logger.info(
        json.dumps(
            {
                "event": "result",
                "task": subtask.task_id,
                "subtask": subtask.pk,
                "reported": status,
                "status": subtask.status,
                "error_code": subtask.error_code,
                "attempt": subtask.attempts,
                "history_chars": subtask.history_chars,
                "spilled": subtask.artifact_id is not None,
            },
            sort_keys=True,
        )
    )
    return subtask, True


def _is_repeat(
    subtask: Subtask,
    *,
    status: str,
    result: dict | None,
    error: str,
    error_code: str,
    usage: dict | None,
) -> bool:
    """Whether this report is the one the claim already made (a retried request)."""
    if status in (RETRY, RELEASE):
        # A requeue by this claim leaves the turn PENDING with its error code until the next
        # claim (which changes `attempts`); a RETRY on the last attempt left it FAILED.
        requeued = subtask.status == SubtaskStatus.PENDING
        gave_up = status == RETRY and subtask.status == SubtaskStatus.FAILED
        return (requeued or gave_up) and subtask.error_code == error_code
    if subtask.status != status or subtask.usage != usage:
        return False
    if status == SubtaskStatus.FAILED:
        return (
            subtask.error == replace_unstorable_chars(error)[0] and subtask.error_code == error_code
        )
    return turn_result(subtask=subtask) == result
