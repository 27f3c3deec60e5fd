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
from django.db.models import F, Q
from django.utils import timezone

from backend.artifacts.selectors import artifact_manifest
from backend.artifacts.services import replace_unstorable_chars
from backend.dispatch.models import PromptReport
from backend.dispatch.policies import policy_rows, resolve_from_rows
from backend.dispatch.prompts import TurnPrompt, build_turn_prompt
from backend.errors import Conflict, InvalidInput, NotFound
from backend.tasks.history import any_of, prompt_inputs_for
from backend.tasks.models import Role, Subtask, SubtaskStatus, Task, TaskStatus
from backend.tasks.selectors import turn_result
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


@dataclass(frozen=True)
class ClaimedTurn:
    subtask: Subtask
    task: Task
    prompt: TurnPrompt
    report: PromptReport
    manifest: list[dict[str, Any]]
    native_session_id: str


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
            if subtask.attempts >= settings.BATON_MAX_ATTEMPTS:
                record_result(
                    subtask=subtask,
                    status=SubtaskStatus.FAILED,
                    error=(
                        f"The executor lease expired on attempt {subtask.attempts} of "
                        f"{settings.BATON_MAX_ATTEMPTS} (last worker {subtask.lease_owner!r}); "
                        "Baton gave up on this turn."
                    ),
                )
                failed += 1
            else:
                _requeue(subtask)
                requeued += 1
    if requeued or failed:
        logger.info(
            json.dumps({"event": "leases_reclaimed", "requeued": requeued, "failed": failed})
        )
    return ReclaimSummary(requeued=requeued, failed=failed)


def _requeue(subtask: Subtask) -> None:
    Subtask.objects.filter(pk=subtask.pk).update(
        status=SubtaskStatus.PENDING,
        claimed_by=None,
        lease_owner="",
        lease_expires_at=None,
        started_at=None,
        updated_at=timezone.now(),
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
        "started_at": now,
        "updated_at": now,
    }
    candidates = Subtask.objects.filter(
        status=SubtaskStatus.PENDING,
        role=Role.ASSISTANT,
        pending_since__isnull=False,
        executor__in=list(kinds),
    ).order_by("pending_since", "id")
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


def _native_sessions_to_resume(subtasks: Sequence[Subtask]) -> dict[int, str]:
    """Per subtask id: the executor's own session id from the same bot's latest earlier turn
    in its task (one query for the batch)."""
    if not subtasks:
        return {}
    condition = any_of(
        [
            Q(
                task_id=subtask.task_id,
                bot=subtask.bot,
                executor=subtask.executor,
                message_id__lt=subtask.message_id,
            )
            for subtask in subtasks
        ]
    )
    latest: dict[tuple[int, str, str], str] = {}
    rows = (
        Subtask.objects.filter(condition, role=Role.ASSISTANT)
        .exclude(native_session_id="")
        .order_by("task_id", "-message_id")
        .values_list("task_id", "bot", "executor", "native_session_id")
    )
    for task_id, bot, executor, session_id in rows:
        latest.setdefault((task_id, bot, executor), session_id)
    return {
        subtask.pk: latest.get((subtask.task_id, subtask.bot, subtask.executor), "")
        for subtask in subtasks
    }


def _report_row(*, subtask: Subtask, worker_id: str, prompt: TurnPrompt) -> PromptReport:
    report = prompt.build.report
    return PromptReport(
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
        if current.attempts >= settings.BATON_MAX_ATTEMPTS:
            record_result(
                subtask=current,
                status=SubtaskStatus.FAILED,
                error=f"Baton could not build this turn's prompt ({reason}).",
            )
        else:
            _requeue(current)


def claim_turns(
    *,
    worker: AbstractBaseUser,
    worker_id: str,
    kinds: Sequence[str],
    limit: int,
    request_base_url: str | None = None,
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
    built: list[tuple[Subtask, TurnPrompt]] = []
    for subtask in subtasks:
        try:
            prompt = build_turn_prompt(
                subtask=subtask,
                task=subtask.task,
                resolved=resolved[subtask.pk],
                prompt_input=inputs.get(subtask.pk),
            )
        except Exception as error:  # noqa: BLE001 - any failure must release the claim
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
            continue
        built.append((subtask, prompt))
    try:
        manifest_entries = {
            entry["id"]: entry
            for entry in artifact_manifest(
                artifact_ids=[
                    artifact_id
                    for _, prompt in built
                    for artifact_id in prompt.build.report.artifacts
                ],
                request_base_url=request_base_url,
            )
        }
        sessions = _native_sessions_to_resume([subtask for subtask, _ in built])
    except Exception as error:  # noqa: BLE001
        for subtask, _ in built:
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
        return []
    claimed: list[ClaimedTurn] = []
    for subtask, prompt in built:
        claimed.append(
            ClaimedTurn(
                subtask=subtask,
                task=subtask.task,
                prompt=prompt,
                report=_report_row(subtask=subtask, worker_id=worker_id, prompt=prompt),
                manifest=[
                    manifest_entries[artifact_id] for artifact_id in prompt.build.report.artifacts
                ],
                native_session_id=sessions[subtask.pk],
            )
        )
    PromptReport.objects.bulk_create([turn.report for turn in claimed])
    for turn in claimed:
        _log_dispatch(turn.report, turn.subtask)
    return claimed


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
    """The turn this claim holds, locked. NotFound if the worker never claimed it; Conflict if
    the claim is no longer theirs."""
    subtask = _claimed_turn(worker=worker, subtask_id=subtask_id)
    _check_claim(subtask, worker_id=worker_id, attempt=attempt)
    return subtask


def _check_claim(subtask: Subtask, *, worker_id: str, attempt: int) -> None:
    subtask_id = subtask.pk
    if subtask.status != SubtaskStatus.RUNNING:
        raise Conflict(f"Turn {subtask_id} is {subtask.status}; the lease is gone.")
    if subtask.lease_owner != worker_id or subtask.attempts != attempt:
        raise Conflict(
            f"The lease on turn {subtask_id} was lost: it is now held by attempt "
            f"{subtask.attempts}."
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
    usage: dict | None,
    native_session_id: str,
) -> tuple[Subtask, bool]:
    """Record the outcome of a claimed turn. Returns (turn, changed).

    Idempotent: the same report from the same claim a second time changes nothing and returns
    changed=False. A different report for an already finished turn, or any report from a claim
    that was lost, is a Conflict.
    """
    with transaction.atomic():
        subtask = _claimed_turn(worker=worker, subtask_id=subtask_id)
        same_claim = subtask.lease_owner == worker_id and subtask.attempts == attempt
        if subtask.status in (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED) and same_claim:
            if _same_report(subtask, status=status, result=result, error=error, usage=usage):
                return subtask, False
            raise Conflict(f"Turn {subtask_id} already has a different result recorded.")
        _check_claim(subtask, worker_id=worker_id, attempt=attempt)
        recorded = record_result(
            subtask=subtask,
            status=status,
            result=result,
            error=error,
            usage=usage,
            native_session_id=native_session_id,
        )
    logger.info(
        json.dumps(
            {
                "event": "result",
                "task": recorded.task_id,
                "subtask": recorded.pk,
                "status": recorded.status,
                "attempt": recorded.attempts,
                "history_chars": recorded.history_chars,
                "spilled": recorded.artifact_id is not None,
            },
            sort_keys=True,
        )
    )
    return recorded, True


def _same_report(
    subtask: Subtask, *, status: str, result: dict | None, error: str, usage: dict | None
) -> bool:
    if subtask.status != status or subtask.usage != usage:
        return False
    if status == SubtaskStatus.FAILED:
        return subtask.error == replace_unstorable_chars(error)[0]
    return turn_result(subtask=subtask) == result
