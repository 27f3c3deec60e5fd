"""Reports from a worker about a claim it holds: heartbeats, progress and the result.

Every report names its claim (worker account, worker_id, attempt) and is fenced by it (see
`leases`): a claim that lost its lease — its lease ran out, reclaimed or not yet — or whose
turn was cancelled is told so (409 `lease_lost` with the reason, or `cancelled`) and changes
nothing but the reclaim of a lease it finds run out. Invariant: reports are idempotent — the
same result from the same claim a second time changes nothing and says so (changed=False),
so a worker may retry a report whose response it never received; a different result for a
turn the claim finished is a Conflict. A repeat is recognised without reading the turn's
artifact (a value kept there is compared by sha256), so a damaged stored copy cannot turn it
into an error; the repeat brings the whole text again, and a missing or damaged copy is
written anew from it (`services.restore_spilled_text`).

A long result value may travel on its own, as a stream of UTF-8, before the report
(`upload_result_value`): it is stored as an artifact under its sha256, and the report names it
(`value_upload`) instead of carrying it. The upload is fenced like a report, and
content-addressed, so uploading the same text again stores nothing new; the report is still
the one place that records the turn, by the same rules: the same report with the same upload a
second time is `changed: false`. An upload that no report names stays an unreferenced
artifact, which pruning removes after the retention period.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.artifacts.retention import record_artifact_read
from backend.artifacts.services import atomic_storing_artifacts
from backend.artifacts.storage import ByteStream, spool_text
from backend.dispatch.budgets import learn_from_usage
from backend.dispatch.leases import (
    LEASE_EXPIRED,
    LEASE_LOST,
    RUNNING,
    LeaseState,
    attempts_used,
    claimed_turn,
    failed_for_lease_expiry,
    fence,
    fenced_turn,
    heartbeat_interval_seconds,
    is_claim,
    lease_ran_out,
    lease_state,
    lease_until,
    reclaim_expired_leases,
    requeue,
)
from backend.dispatch.overflow import CONTEXT_OVERFLOW, recover_from_overflow
from backend.dispatch.sessions import record_session
from backend.errors import Conflict, InvalidInput, LeaseLost
from backend.events import log_event
from backend.prompting import Role
from backend.tasks import task_events
from backend.tasks.history import any_of
from backend.tasks.ingestion import replace_unstorable_chars, store_uploaded_text
from backend.tasks.models import STOPPED_SUBTASK_STATUSES, Subtask, SubtaskStatus
from backend.tasks.selectors import is_recorded_result, is_recorded_upload
from backend.tasks.services import (
    check_text_size,
    record_result,
    restore_spilled_text,
    result_with_uploaded_value,
)

MAX_PROGRESS_EVENTS = 200
# What a worker may report for a claim: an outcome, or a requeue.
COMPLETED, FAILED = SubtaskStatus.COMPLETED.value, SubtaskStatus.FAILED.value
RETRY = "RETRY"  # a transient failure: back to PENDING after a backoff, attempts counted
RELEASE = "RELEASE"  # the worker gives the turn back unfinished (shutdown): PENDING at once
REPORT_STATUSES = (COMPLETED, FAILED, RETRY, RELEASE)


def retry_backoff_seconds(*, attempt: int) -> float:
    """Delay before a turn that failed transiently on `attempt` may be claimed again."""
    doubling: int = 2 ** max(0, attempt - 1)  # a non-negative power of two is an int
    delay = settings.BATON_RETRY_BACKOFF_SECONDS * doubling
    return min(delay, settings.BATON_RETRY_BACKOFF_MAX_SECONDS)


def heartbeat(*, worker: User, worker_id: str, attempt: int, subtask_id: int) -> Subtask:
    """Extend the lease on a turn the worker holds; a lease already run out stays lost."""
    now = timezone.now()
    with transaction.atomic():
        subtask, refusal = fenced_turn(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id, now=now
        )
        if refusal is None:
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
    A claim whose lease ran out is `lease_lost`, and its turn is reclaimed at once.
    """
    if not claims:
        return []
    wanted = dict(claims)
    rows = {
        subtask.pk: subtask
        for subtask in Subtask.objects.filter(
            pk__in=list(wanted), claimed_by=worker, role=Role.ASSISTANT
        ).only("id", "status", "error_code", "lease_owner", "attempts", "lease_expires_at")
    }
    now = timezone.now()
    renew_before = lease_until(now=now) - timedelta(seconds=heartbeat_interval_seconds())
    renewed_until = lease_until(now=now)
    to_renew = [
        subtask
        for subtask_id, subtask in rows.items()
        if lease_state(subtask=subtask, worker_id=worker_id, attempt=wanted[subtask_id], now=now)
        == RUNNING
        and (subtask.lease_expires_at is None or subtask.lease_expires_at <= renew_before)
    ]
    renewed: set[int] = set()
    if to_renew:
        condition = any_of([Q(pk=subtask.pk, attempts=subtask.attempts) for subtask in to_renew])
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
    lost_meanwhile = {subtask.pk for subtask in to_renew} - renewed
    states = []
    for subtask_id, attempt in claims:
        subtask = rows.get(subtask_id)
        if subtask is None:
            states.append(LeaseState(subtask_id, attempt, LEASE_LOST, None))
            continue
        state = lease_state(subtask=subtask, worker_id=worker_id, attempt=attempt, now=now)
        if subtask.pk in lost_meanwhile:
            state = LEASE_LOST  # cancelled, reclaimed or run out between the read and the renewal
        expires = renewed_until if subtask.pk in renewed else subtask.lease_expires_at
        states.append(LeaseState(subtask_id, attempt, state, expires))
    run_out = [
        subtask.pk
        for subtask_id, subtask in rows.items()
        if lease_ran_out(subtask=subtask, worker_id=worker_id, attempt=wanted[subtask_id], now=now)
    ]
    if run_out:
        reclaim_expired_leases(now=now, subtask_ids=run_out)
    return states


def record_progress(
    *,
    worker: User,
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
    now = timezone.now()
    with transaction.atomic():
        subtask, refusal = fenced_turn(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id, now=now
        )
        if refusal is None:
            _append_progress(subtask, events=events, partial_text=partial_text, now=now)
    if refusal is not None:
        raise refusal  # after the commit: a lease found run out was reclaimed
    return subtask


def _append_progress(
    subtask: Subtask, *, events: list[dict[str, Any]], partial_text: str | None, now: datetime
) -> None:
    text_before = subtask.partial_text
    subtask.progress_events = ((subtask.progress_events or []) + list(events))[
        -MAX_PROGRESS_EVENTS:
    ]
    if partial_text is not None:
        subtask.partial_text = replace_unstorable_chars(partial_text)[0]
    if events or subtask.partial_text != text_before:
        task_events.record(
            task_id=subtask.task_id,
            events=[
                task_events.progress_event(
                    subtask,
                    events=list(events),
                    text_before=text_before,
                    text_after=subtask.partial_text,
                )
            ],
        )
    subtask.progress_updated_at = now
    subtask.lease_expires_at = lease_until(now=now)
    subtask.save(
        update_fields=[
            "progress_events",
            "partial_text",
            "progress_updated_at",
            "lease_expires_at",
            "updated_at",
        ]
    )


def upload_result_value(
    *, worker: User, worker_id: str, attempt: int, subtask_id: int, stream: ByteStream
) -> Artifact:
    """Store a result value the claim sends as a stream of UTF-8, for its report to name by
    sha256 (`value_upload`); returns the value's artifact.

    The claim is fenced before a byte of the stream is read, and again before the text is
    stored: a claim that does not hold the RUNNING turn stores nothing. The stream is checked,
    hashed and measured chunk by chunk into a temporary file (`storage.spool_text`), never
    held whole: not UTF-8 is InvalidInput, over BATON_MAX_RESULT_BYTES PayloadTooLarge, NUL
    InvalidInput (the stored value must be exactly the result's, and Baton's artifacts show
    NUL as U+FFFD), each naming `value`. The artifact is stamped as read, so pruning leaves it
    for the retention period even when it existed before, unreferenced.
    """
    _check_claim(worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id)
    with spool_text(stream, max_bytes=settings.BATON_MAX_RESULT_BYTES, field="value") as text:
        if text.nul_chars:
            raise InvalidInput(
                f"value holds {text.nul_chars} NUL characters (U+0000), which an uploaded "
                "value cannot; report this result with its value inline.",
                field="value",
            )
        now = timezone.now()
        with atomic_storing_artifacts():
            subtask, refusal = fenced_turn(
                worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id, now=now
            )
            if refusal is None:
                artifact = store_uploaded_text(text=text, task_id=subtask.task_id)
                record_artifact_read(artifact_id=artifact.pk)
    if refusal is not None:
        raise refusal  # after the commit: a lease found run out was reclaimed
    log_event(
        "result_value_uploaded",
        task=subtask.task_id,
        subtask=subtask.pk,
        attempt=attempt,
        artifact=artifact.pk,
        size_bytes=artifact.size_bytes,
    )
    return artifact


def _check_claim(*, worker: User, worker_id: str, attempt: int, subtask_id: int) -> None:
    """Raise the claim's refusal (see `leases.fence`), if any; change nothing else."""
    with transaction.atomic():
        _, refusal = fenced_turn(
            worker=worker,
            worker_id=worker_id,
            attempt=attempt,
            subtask_id=subtask_id,
            now=timezone.now(),
        )
    if refusal is not None:
        raise refusal  # after the commit: a lease found run out was reclaimed


def report_result(
    *,
    worker: User,
    worker_id: str,
    attempt: int,
    subtask_id: int,
    status: str,
    result: dict[str, Any] | None,
    error: str,
    error_code: str = "",
    usage: dict[str, Any] | None,
    native_session_id: str,
    session_resumed: bool = False,
    value_upload: str = "",
) -> tuple[Subtask, bool]:
    """Record the outcome of a claimed turn. Returns (turn, changed).

    COMPLETED and FAILED finish the turn. RETRY (a transient failure: rate limit, provider
    error, network) puts it back to PENDING after a backoff, or fails it for good with this
    error once BATON_MAX_ATTEMPTS claims have been used. RELEASE gives it back at once (the
    worker is shutting down) and does not use up an attempt. A FAILED or RETRY with error code
    `context_overflow` requeues the turn in a fresh session (when it resumed one:
    `session_resumed`) or with a tighter token budget, or fails it saying what was tried (see
    `overflow`).

    Idempotent: the same report from the same claim a second time changes nothing and returns
    changed=False, even after the lease time passed. A different report for a turn this claim
    already finished is a Conflict; any report from a claim that no longer holds the turn is
    refused with 409 `lease_lost` (or `cancelled`) — a claim whose lease ran out included,
    whose turn is reclaimed then (see `leases`). `lease_expired` is Baton's own error code.

    `value_upload` names the result's value by the sha256 of its upload
    (`upload_result_value`); the report is then recorded as the same report with that value
    inline would be, and is a repeat under the same rules.
    """
    if status not in REPORT_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(REPORT_STATUSES)}.", field="status")
    if value_upload:
        result = result_with_uploaded_value(status=status, result=result)
    if status == RETRY and not error.strip():
        raise InvalidInput("error is required when status is RETRY.", field="error")
    if error_code == LEASE_EXPIRED:
        raise InvalidInput(
            f"error_code {LEASE_EXPIRED!r} is set by Baton only, when a lease runs out.",
            field="error_code",
        )
    if status == RELEASE:
        error_code = error_code or "shutdown"
    now = timezone.now()
    with atomic_storing_artifacts():
        subtask = claimed_turn(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id
        )
        same_claim = is_claim(subtask, worker_id=worker_id, attempt=attempt)
        if same_claim and _is_repeat(
            subtask,
            status=status,
            result=result,
            error=error,
            error_code=error_code,
            usage=usage,
            native_session_id=native_session_id,
            value_upload=value_upload,
        ):
            # An uploaded value's stored copy was checked, and mended, when it was uploaded.
            if status in (COMPLETED, FAILED) and not value_upload:
                restore_spilled_text(subtask=subtask, status=status, result=result, error=error)
            return subtask, False
        finished = subtask.status in (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED)
        if same_claim and finished and not failed_for_lease_expiry(subtask=subtask):
            raise Conflict(f"Turn {subtask_id} already has a different result recorded.")
        refusal = fence(
            subtask=subtask, worker=worker, worker_id=worker_id, attempt=attempt, now=now
        )
        if refusal is None:
            _apply_report(
                subtask,
                worker_id=worker_id,
                status=status,
                result=result,
                error=error,
                error_code=error_code,
                usage=usage,
                native_session_id=native_session_id,
                session_resumed=session_resumed,
                value_upload=value_upload,
            )
    if refusal is not None:
        raise refusal  # after the commit: a lease found run out was reclaimed
    log_event(
        "result",
        task=subtask.task_id,
        subtask=subtask.pk,
        message_id=subtask.message_id,
        reported=status,
        status=subtask.status,
        error_code=subtask.error_code,
        attempt=subtask.attempts,
        history_chars=subtask.history_chars,
        spilled=subtask.history_is_preview,
    )
    return subtask, True


def _apply_report(
    subtask: Subtask,
    *,
    worker_id: str,
    status: str,
    result: dict[str, Any] | None,
    error: str,
    error_code: str,
    usage: dict[str, Any] | None,
    native_session_id: str,
    session_resumed: bool,
    value_upload: str,
) -> None:
    """Requeue or finish the turn as the report says (see `report_result`)."""
    if status == RELEASE:
        requeue(subtask=subtask, error=error, error_code=error_code, released=True)
    elif _is_overflow(status=status, error_code=error_code):
        recover_from_overflow(subtask=subtask, error=error, session_resumed=session_resumed)
        subtask.refresh_from_db()
        # Marks which prompt was sent; no session is recorded for a turn that did not complete.
        record_session(
            subtask=subtask,
            worker_id=worker_id,
            session_id=native_session_id,
            resumed=session_resumed,
            usage=usage,
        )
    elif status == RETRY and attempts_used(subtask=subtask) < settings.BATON_MAX_ATTEMPTS:
        requeue(
            subtask=subtask,
            error=error,
            error_code=error_code,
            delay_seconds=retry_backoff_seconds(attempt=attempts_used(subtask=subtask)),
        )
    else:
        if status == RETRY:
            status = SubtaskStatus.FAILED
            error = (
                f"{error}\n(attempt {attempts_used(subtask=subtask)} of "
                f"{settings.BATON_MAX_ATTEMPTS}; Baton gave up on this turn)"
            )
        # Under the locks `claimed_turn` took; the turn is recorded in place (no reread).
        record_result(
            subtask=subtask,
            status=status,
            result=result,
            error=error,
            error_code=error_code,
            usage=usage,
            native_session_id=native_session_id,
            value_upload=value_upload,
            locked=subtask.task,
        )
        record_session(
            subtask=subtask,
            worker_id=worker_id,
            session_id=native_session_id,
            resumed=session_resumed,
            usage=usage,
        )
        if subtask.status == SubtaskStatus.COMPLETED and not session_resumed:
            learn_from_usage(subtask=subtask, usage=usage)
        return
    subtask.refresh_from_db()


def _is_repeat(
    subtask: Subtask,
    *,
    status: str,
    result: dict[str, Any] | None,
    error: str,
    error_code: str,
    usage: dict[str, Any] | None,
    native_session_id: str,
    value_upload: str,
) -> bool:
    """Whether this report is the one the claim already made (a retried request). A report
    that differs in anything it would record, its native session id included, is not: it is
    refused as a different result rather than half applied."""
    overflow = _is_overflow(status=status, error_code=error_code)
    if status in (RETRY, RELEASE) or overflow:
        # A requeue by this claim leaves the turn PENDING with its error code until the next
        # claim (which changes `attempts`); a RETRY on the last attempt left it FAILED, and so
        # did an overflow with no retry left (with Baton's error, not the report's).
        requeued = subtask.status == SubtaskStatus.PENDING
        gave_up = (status == RETRY or overflow) and subtask.status == SubtaskStatus.FAILED
        return (requeued or gave_up) and subtask.error_code == error_code
    if (
        subtask.status != status
        or subtask.usage != usage
        or subtask.native_session_id != native_session_id
    ):
        return False
    if status == SubtaskStatus.FAILED:
        return (
            subtask.error == replace_unstorable_chars(error)[0] and subtask.error_code == error_code
        )
    if value_upload:
        assert result is not None  # result_with_uploaded_value made one
        return is_recorded_upload(subtask=subtask, result=result, value_sha256=value_upload)
    return is_recorded_result(subtask=subtask, result=result)


def _is_overflow(*, status: str, error_code: str) -> bool:
    """Whether the report says the model refused the prompt as too long (see `overflow`)."""
    return status in (FAILED, RETRY) and error_code == CONTEXT_OVERFLOW


def confirm_stopped(*, worker: User, worker_id: str, attempt: int, subtask_id: int) -> Subtask:
    """The worker's word that the executor of a turn the product stopped (cancelled,
    interrupted, rolled back) while this claim ran it is gone, its processes with it: recorded
    once as `stop_confirmed_at`, which a cancel that waits is waiting for. Repeating it is a
    no-op. 409 `lease_lost` for a claim that was not the turn's last, and 409 `conflict` for a
    turn that was not stopped (a worker confirms only what it was told)."""
    with transaction.atomic():
        subtask = claimed_turn(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id
        )
        if not is_claim(subtask, worker_id=worker_id, attempt=attempt):
            raise LeaseLost(
                f"Turn {subtask_id}'s last claim is attempt {subtask.attempts}, not attempt "
                f"{attempt} of worker {worker_id!r}; there is nothing to confirm."
            )
        if subtask.status not in STOPPED_SUBTASK_STATUSES:
            raise Conflict(
                f"Turn {subtask_id} is {subtask.status}; only a turn the product stopped has a "
                "stop to confirm."
            )
        if subtask.stop_confirmed_at is None:
            subtask.stop_confirmed_at = timezone.now()
            subtask.save(update_fields=["stop_confirmed_at", "updated_at"])
            log_event("turn_stop_confirmed", task=subtask.task_id, subtask=subtask.pk)
    return subtask
