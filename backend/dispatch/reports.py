"""Reports from a worker about a claim it holds: the result, its uploaded value, a stop.

Heartbeats and progress, the reports sent most often, are `heartbeats`' (importable from here
too, with the rest of what a worker reports).

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.artifacts.retention import record_artifact_read
from backend.artifacts.services import atomic_storing_artifacts
from backend.artifacts.storage import ByteStream, spool_text
from backend.dispatch.budgets import learn_from_usage
from backend.dispatch.heartbeats import ProgressOutcome as ProgressOutcome
from backend.dispatch.heartbeats import ProgressReport as ProgressReport
from backend.dispatch.heartbeats import heartbeat as heartbeat
from backend.dispatch.heartbeats import heartbeat_claims as heartbeat_claims
from backend.dispatch.heartbeats import record_claims_progress as record_claims_progress
from backend.dispatch.heartbeats import record_progress as record_progress
from backend.dispatch.heartbeats import settle_claims_steers as settle_claims_steers
from backend.dispatch.leases import (
    LEASE_EXPIRED,
    attempts_used,
    claimed_turn,
    failed_for_lease_expiry,
    fence,
    fenced_turn,
    is_claim,
    requeue,
)
from backend.dispatch.overflow import CONTEXT_OVERFLOW, recover_from_overflow
from backend.dispatch.sessions import record_session
from backend.errors import Conflict, InvalidInput, LeaseLost
from backend.events import log_event
from backend.tasks.ingestion import replace_unstorable_chars, store_uploaded_text
from backend.tasks.models import STOPPED_SUBTASK_STATUSES, Subtask, SubtaskStatus
from backend.tasks.selectors import is_recorded_result, is_recorded_upload
from backend.tasks.services import (
    record_result,
    restore_spilled_text,
    result_with_uploaded_value,
)
from backend.tasks.services.steering import settle_steers

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
    steers: Mapping[int, str | None] | None = None,
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

    `steers` says what became of the steers the claim was handed (`steering.settle_steers`):
    recorded first, so that a steer the agent received is answered by this result, and only
    once the claim is known to hold the turn: a refused report changes none.
    """
    report = _Report.checked(
        status=status,
        result=result,
        error=error,
        error_code=error_code,
        usage=usage,
        native_session_id=native_session_id,
        session_resumed=session_resumed,
        value_upload=value_upload,
    )
    now = timezone.now()
    with atomic_storing_artifacts():
        subtask = claimed_turn(
            worker=worker, worker_id=worker_id, attempt=attempt, subtask_id=subtask_id
        )
        same_claim = is_claim(subtask, worker_id=worker_id, attempt=attempt)
        if same_claim and _is_repeat(subtask, report):
            # An uploaded value's stored copy was checked, and mended, when it was uploaded.
            if report.status in (COMPLETED, FAILED) and not report.value_upload:
                restore_spilled_text(
                    subtask=subtask, status=report.status, result=report.result, error=report.error
                )
            return subtask, False
        finished = subtask.status in (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED)
        if same_claim and finished and not failed_for_lease_expiry(subtask=subtask):
            raise Conflict(f"Turn {subtask_id} already has a different result recorded.")
        refusal = fence(
            subtask=subtask, worker=worker, worker_id=worker_id, attempt=attempt, now=now
        )
        if refusal is None:
            if steers:
                settle_steers(task=subtask.task, target=subtask, results=steers)
            _apply_report(subtask, worker_id=worker_id, report=report)
    if refusal is not None:
        raise refusal  # after the commit: a lease found run out was reclaimed
    log_event(
        "result",
        task=subtask.task_id,
        subtask=subtask.pk,
        message_id=subtask.message_id,
        reported=report.status,
        status=subtask.status,
        error_code=subtask.error_code,
        attempt=subtask.attempts,
        history_chars=subtask.history_chars,
        spilled=subtask.history_is_preview,
    )
    return subtask, True


@dataclass(frozen=True)
class _Report:
    """A result report as `report_result` records it (see there for each field)."""

    status: str
    result: dict[str, Any] | None
    error: str
    error_code: str
    usage: dict[str, Any] | None
    native_session_id: str
    session_resumed: bool
    value_upload: str

    @classmethod
    def checked(
        cls,
        *,
        status: str,
        result: dict[str, Any] | None,
        error: str,
        error_code: str,
        usage: dict[str, Any] | None,
        native_session_id: str,
        session_resumed: bool,
        value_upload: str,
    ) -> _Report:
        """The report, once its fields are valid (InvalidInput naming the first that is not):
        an uploaded value in its result, a shutdown's error code when a RELEASE gives none."""
        if status not in REPORT_STATUSES:
            raise InvalidInput(
                f"status must be one of {', '.join(REPORT_STATUSES)}.", field="status"
            )
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
        return cls(
            status=status,
            result=result,
            error=error,
            error_code=error_code,
            usage=usage,
            native_session_id=native_session_id,
            session_resumed=session_resumed,
            value_upload=value_upload,
        )

    @property
    def overflow(self) -> bool:
        """Whether the model refused the prompt as too long (see `overflow`)."""
        return self.status in (FAILED, RETRY) and self.error_code == CONTEXT_OVERFLOW


def _apply_report(subtask: Subtask, *, worker_id: str, report: _Report) -> None:
    """Requeue or finish the turn as the report says (see `report_result`)."""
    if report.status == RELEASE:
        requeue(subtask=subtask, error=report.error, error_code=report.error_code, released=True)
    elif report.overflow:
        recover_from_overflow(
            subtask=subtask, error=report.error, session_resumed=report.session_resumed
        )
        subtask.refresh_from_db()
        # Marks which prompt was sent; no session is recorded for a turn that did not complete.
        _record_session(subtask, worker_id=worker_id, report=report)
    elif report.status == RETRY and attempts_used(subtask=subtask) < settings.BATON_MAX_ATTEMPTS:
        requeue(
            subtask=subtask,
            error=report.error,
            error_code=report.error_code,
            delay_seconds=retry_backoff_seconds(attempt=attempts_used(subtask=subtask)),
        )
    else:
        _finish(subtask, worker_id=worker_id, report=report)
        return
    subtask.refresh_from_db()


def _finish(subtask: Subtask, *, worker_id: str, report: _Report) -> None:
    """Record the turn's outcome, a RETRY on its last attempt as FAILED, and its session."""
    status, error = report.status, report.error
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
        result=report.result,
        error=error,
        error_code=report.error_code,
        usage=report.usage,
        native_session_id=report.native_session_id,
        value_upload=report.value_upload,
        locked=subtask.task,
    )
    _record_session(subtask, worker_id=worker_id, report=report)
    if subtask.status == SubtaskStatus.COMPLETED and not report.session_resumed:
        learn_from_usage(subtask=subtask, usage=report.usage)


def _record_session(subtask: Subtask, *, worker_id: str, report: _Report) -> None:
    record_session(
        subtask=subtask,
        worker_id=worker_id,
        session_id=report.native_session_id,
        resumed=report.session_resumed,
        usage=report.usage,
    )


def _is_repeat(subtask: Subtask, report: _Report) -> bool:
    """Whether this report is the one the claim already made (a retried request). A report
    that differs in anything it would record, its native session id included, is not: it is
    refused as a different result rather than half applied."""
    if report.status in (RETRY, RELEASE) or report.overflow:
        # A requeue by this claim leaves the turn PENDING with its error code until the next
        # claim (which changes `attempts`); a RETRY on the last attempt left it FAILED, and so
        # did an overflow with no retry left (with Baton's error, not the report's).
        requeued = subtask.status == SubtaskStatus.PENDING
        gave_up = (
            report.status == RETRY or report.overflow
        ) and subtask.status == SubtaskStatus.FAILED
        return (requeued or gave_up) and subtask.error_code == report.error_code
    if (
        subtask.status != report.status
        or subtask.usage != report.usage
        or subtask.native_session_id != report.native_session_id
    ):
        return False
    if report.status == SubtaskStatus.FAILED:
        return (
            subtask.error == replace_unstorable_chars(report.error)[0]
            and subtask.error_code == report.error_code
        )
    if report.value_upload:
        assert report.result is not None  # result_with_uploaded_value made one
        return is_recorded_upload(
            subtask=subtask, result=report.result, value_sha256=report.value_upload
        )
    return is_recorded_result(subtask=subtask, result=report.result)


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
