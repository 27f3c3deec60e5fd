"""Recording an ASSISTANT turn's result: its history text, its pipeline's next step, its task.

A result is measured and ingested (spilled to an artifact when long, or taken from an uploaded
value's stored copy), the pipeline advances or fails its later steps, a summary job's outcome
becomes the task's summary, and the task's status is refreshed, all in one transaction.
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.artifacts.services import (
    atomic_storing_artifacts,
    locked_stored_artifact,
    restore_artifact_file,
    store_artifact,
)
from backend.errors import Conflict, InvalidInput, PayloadTooLarge, UploadMissing
from backend.events import log_event
from backend.prompting import Role
from backend.prompting.kinds import classify_text
from backend.tasks import task_events
from backend.tasks.ingestion import (
    IngestedText,
    ingest_stored_text,
    ingest_text,
    replace_unstorable_chars,
)
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    Task,
    TaskStatus,
)
from backend.tasks.partial_texts import end_attempts
from backend.tasks.services.rounds import _apply_ingestion, _ingestion_fields, lock_task
from backend.tasks.services.status import refresh_task_status
from backend.tasks.services.steering import end_steers
from backend.tasks.services.validation import check_text_size
from backend.tasks.transcripts import (
    TranscriptRequest,
    may_be_in_parts,
    store_transcripts,
    transcripts_for,
)
from backend.tasks.turn_events import (
    announce_ended_turns,
)
from backend.tasks.wakeups import announce_pending

# The other columns a result sets (`record_result`); nothing else of the row is written.
_RESULT_FIELDS = (
    "status",
    "result",
    "result_value_in_artifact",
    "error",
    "error_code",
    "usage",
    "native_session_id",
    "lease_expires_at",
    "finished_at",
    "updated_at",
)


def canonical_json(value: Any) -> str:
    """Results without a `value` appear in history as this: sorted keys, UTF-8, compact."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def history_text_for_result(
    *, status: str, result: dict[str, Any] | None, error: str
) -> tuple[str, bool]:
    """The text an ASSISTANT turn contributes to history, and whether it is serialized JSON.

    `result.value` when it is a string; a `value` of any other JSON type (a number, a list, an
    object) as its canonical JSON; without a `value` (absent or null), the whole result as
    canonical JSON. A FAILED turn contributes its error message.
    """
    if status == SubtaskStatus.FAILED:
        return error, False
    if result is None:
        return "", False
    value = result.get("value")
    if isinstance(value, str):
        return value, False
    if value is not None:
        return canonical_json(value), True
    return canonical_json(result), True


def _validate_result_payload(*, status: str, result: Any, error: str, usage: Any) -> None:
    if status not in (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED):
        raise InvalidInput("status must be COMPLETED or FAILED.", field="status")
    if result is not None and not isinstance(result, dict):
        raise InvalidInput(
            f"result must be a JSON object, not {type(result).__name__}.", field="result"
        )
    if status == SubtaskStatus.COMPLETED and result is None:
        raise InvalidInput("result is required when status is COMPLETED.", field="result")
    if status == SubtaskStatus.FAILED and not error.strip():
        raise InvalidInput("error is required when status is FAILED.", field="error")
    if usage is not None and not isinstance(usage, dict):
        raise InvalidInput("usage must be a JSON object.", field="usage")


def result_with_uploaded_value(*, status: str, result: Any) -> dict[str, Any]:
    """The result a report that names a value upload records, its `value` still null: `result`
    holds every other key, its `value` null or absent (an absent or null result: none).
    InvalidInput when the report cannot name an upload."""
    if status != SubtaskStatus.COMPLETED:
        raise InvalidInput("value_upload goes with status COMPLETED only.", field="value_upload")
    if result is None:
        result = {}
    if not isinstance(result, dict):
        raise InvalidInput(
            f"result must be a JSON object, not {type(result).__name__}.", field="result"
        )
    if result.get("value") is not None:
        raise InvalidInput(
            "result.value must be null or absent when value_upload names the value.",
            field="result",
        )
    return {"value": None, **{key: item for key, item in result.items() if key != "value"}}


def record_result(
    *,
    subtask: Subtask,
    status: str,
    result: dict[str, Any] | None = None,
    error: str = "",
    error_code: str = "",
    usage: dict[str, Any] | None = None,
    native_session_id: str = "",
    value_upload: str = "",
    locked: Task | None = None,
) -> Subtask:
    """Record an ASSISTANT turn's outcome and, for pipelines, make the next step dispatchable.

    A failed step fails the steps after it (they would have nothing to build on). A summary
    job's outcome is recorded the same way, and then `_finish_summary` applies.

    `value_upload` is the sha256 of a result value the worker uploaded as a stream (stored by
    `ingestion.store_uploaded_text`): the turn is recorded exactly as if `result.value` were
    that text (see `result_with_uploaded_value`), and the text is never held whole
    (`ingestion.ingest_stored_text`). UploadMissing when Baton does not hold it whole.

    `locked` is the task when the caller's transaction already holds its lock and read
    `subtask` under it (a worker's report does): nothing is locked or read again then.
    """
    if subtask.role != Role.ASSISTANT:
        raise InvalidInput("Only ASSISTANT turns have results.", field="subtask")
    if value_upload:
        result = result_with_uploaded_value(status=status, result=result)
    _validate_result_payload(status=status, result=result, error=error, usage=usage)
    # An uploaded value is measured where it is stored, under the lock (see below).
    text, serialized_json = (
        ("", False)
        if value_upload
        else history_text_for_result(status=status, result=result, error=error)
    )
    check_text_size(text=text, limit=settings.BATON_MAX_RESULT_BYTES, field="result")
    with atomic_storing_artifacts() if locked is None else nullcontext():
        task = _locked_active_turn(subtask=subtask, locked=locked)
        now = timezone.now()
        ingested, result = _ingest_result(
            task=task,
            result=result,
            text=text,
            serialized_json=serialized_json,
            value_upload=value_upload,
        )
        ingested_fields = _apply_ingestion(subtask, ingested, recorded_at=now)
        _set_outcome(
            subtask,
            status=status,
            result=result,
            value_in_artifact=(
                ingested.artifact is not None
                and ingested.replaced_chars == 0
                and not serialized_json
                and status == SubtaskStatus.COMPLETED
            ),
            error=error,
            error_code=error_code,
            usage=usage,
            native_session_id=native_session_id,
            now=now,
        )
        end_attempts(turns=[subtask])
        end_steers(turns=[subtask], task=task)
        if subtask.kind == SubtaskKind.SUMMARY:
            _finish_summary(subtask=subtask, task=task)
            return subtask
        subtask.save(update_fields=[*ingested_fields, *_RESULT_FIELDS])
        _after_turn_finished(subtask=subtask, task=task, now=now)
    return subtask


def _ingest_result(
    *,
    task: Task,
    result: dict[str, Any] | None,
    text: str,
    serialized_json: bool,
    value_upload: str,
) -> tuple[IngestedText, dict[str, Any] | None]:
    """The turn's history text ingested (from the report, or from the uploaded value named by
    `value_upload`), and the result to store: an uploaded value short enough to stay in the
    row is put in it, as the same value reported inline is."""
    if not value_upload:
        return ingest_text(text=text, task=task, serialized_json=serialized_json), result
    assert result is not None  # result_with_uploaded_value made one
    ingested = _ingest_uploaded_value(sha256=value_upload, task=task)
    if ingested.artifact is None:
        result = {**result, "value": ingested.history_text}
    return ingested, result


def _locked_active_turn(*, subtask: Subtask, locked: Task | None) -> Task:
    """The turn's task, locked (and the turn read again under the lock) unless the caller
    holds the lock already (`locked`); Conflict when the turn has finished."""
    if locked is None:
        task = lock_task(task_id=subtask.task_id)
        subtask.refresh_from_db()
    else:
        task = locked
    if subtask.status not in ACTIVE_SUBTASK_STATUSES:
        raise Conflict(f"{subtask.name_in_task.capitalize()} is already {subtask.status}.")
    return task


def _set_outcome(
    subtask: Subtask,
    *,
    status: str,
    result: dict[str, Any] | None,
    value_in_artifact: bool,
    error: str,
    error_code: str,
    usage: dict[str, Any] | None,
    native_session_id: str,
    now: datetime,
) -> None:
    """Set the result's columns (`_RESULT_FIELDS`) on the turn, unsaved. `value_in_artifact`:
    the turn's artifact holds exactly `result["value"]`, which the row then leaves out."""
    subtask.status = status
    subtask.result = result
    subtask.result_value_in_artifact = False
    if value_in_artifact:
        # The artifact holds exactly result["value"]; keep the row small.
        assert result is not None  # a COMPLETED report has one (validated)
        subtask.result = {key: None if key == "value" else item for key, item in result.items()}
        subtask.result_value_in_artifact = True
    # PostgreSQL text cannot hold NUL or lone surrogates; an error message is diagnostic
    # text, so those characters are shown as U+FFFD there.
    subtask.error = replace_unstorable_chars(error)[0]
    subtask.error_code = error_code if status == SubtaskStatus.FAILED else ""
    subtask.usage = usage
    subtask.native_session_id = native_session_id
    # claimed_by and lease_owner stay: they name who delivered this result.
    subtask.lease_expires_at = None
    subtask.finished_at = now


def _after_turn_finished(*, subtask: Subtask, task: Task, now: datetime) -> None:
    """What follows a turn's stored result: the pipeline's next step, the finished turns'
    events, the task's status, the ended turns announced and, once the task is idle, the next
    message's transcript stored after the commit."""
    finished = [subtask, *_advance_pipeline(subtask=subtask, task=task, now=now)]
    task_events.record(
        task_id=task.pk, events=[task_events.finished_event(turn) for turn in finished]
    )
    status_now = refresh_task_status(task=task)
    announce_ended_turns(task=task, turns=finished, occurred_at=now)
    if (
        task.transcript_id is not None
        and status_now in IDLE_TASK_STATUSES
        and may_be_in_parts(turns=task.next_message_id - 1)
    ):
        # The next message's dispatch points to this history: store it now (see
        # `store_next_transcript`), once the result is committed.
        transaction.on_commit(lambda: store_next_transcript(task=task))


# The statuses of a task whose every turn has finished: the next turn answers a new message.
IDLE_TASK_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED})


def store_next_transcript(*, task: Task) -> None:
    """Store the transcript (and turn index and turn files) that the dispatch of the task's
    next message will point to, as its current one: that dispatch then finds it stored and
    lists it without writing (`transcripts.store_transcripts`), so the latency between a
    message and its prompt does not pay for the history's files. Only for a task whose
    history a prompt has left out already (it has a transcript) and that may have sealed
    parts (a transcript rendered whole is stored by its dispatch again); a failure is logged
    and costs nothing else: the dispatch stores what it needs itself."""
    request = TranscriptRequest(
        task_id=task.pk,
        is_group_chat=task.is_group_chat,
        multi_bot=task.is_multi_bot,
        before_message_id=task.next_message_id,
    )
    try:
        store_transcripts(
            transcripts_for([request]),
            current={task.pk: (task.transcript_id, task.turn_index_id)},
        )
    except Exception as error:  # noqa: BLE001 - the result is recorded; the dispatch stores it
        log_event(
            "transcript_store_failed",
            level=logging.WARNING,
            task=task.pk,
            error_type=type(error).__name__,
        )


def _advance_pipeline(*, subtask: Subtask, task: Task, now: datetime) -> list[Subtask]:
    """After a pipeline step's result: a completed step makes the next one dispatchable; a
    failed one fails the steps after it, which it returns (they never ran)."""
    if subtask.pipeline_step is not None and subtask.pipeline_step + 1 >= len(task.pipeline):
        return []  # a pipeline is fixed when its task is created: nothing follows its last step
    later_steps = Subtask.objects.filter(
        task_id=task.pk,
        parent_message_id=subtask.parent_message_id,
        role=Role.ASSISTANT,
        status=SubtaskStatus.PENDING,
        pipeline_step__gt=subtask.pipeline_step,
    ).order_by("pipeline_step")
    if subtask.status == SubtaskStatus.COMPLETED:
        next_step = later_steps.first()
        if next_step is not None:
            next_step.pending_since = now
            next_step.save(update_fields=["pending_since", "updated_at"])
            announce_pending(executors=[next_step.executor])
        return []
    # The steps that never ran show the model why, like any failed turn.
    reason = f"Not run: pipeline step {subtask.pipeline_step} ({subtask.bot}) failed."
    not_run = list(later_steps)
    later_steps.update(
        status=SubtaskStatus.FAILED,
        error=reason,
        finished_at=now,
        updated_at=now,
        **_ingestion_fields(ingest_text(text=reason, task=task), recorded_at=now),
    )
    for turn in not_run:
        turn.status = SubtaskStatus.FAILED
    return not_run


def _ingest_uploaded_value(*, sha256: str, task: Task) -> IngestedText:
    """Ingest the uploaded value stored under `sha256`, its artifact row locked (in the
    caller's transaction) and its stored copy checked whole first."""
    artifact = locked_stored_artifact(sha256=sha256)
    if artifact is None:
        raise UploadMissing(
            f"value_upload {sha256[:16]}… names no value Baton holds whole (removed since it "
            "was uploaded, or its stored copy is damaged); upload the value again.",
            field="value_upload",
        )
    limit = settings.BATON_MAX_RESULT_BYTES
    if artifact.size_bytes > limit:
        raise PayloadTooLarge(
            f"result is {artifact.size_bytes} bytes of UTF-8; the limit is {limit} bytes.",
            field="result",
        )
    return ingest_stored_text(artifact=artifact, task=task)


def _finish_summary(*, subtask: Subtask, task: Task) -> None:
    """Store a summary job's outcome: a completed summary is stored as an artifact (whatever
    its length: prompts point to it when they cut it) and becomes the task's summary when it
    covers more than the one prompts show now. A failed job changes nothing else; the next
    dispatch that omits enough turns schedules another."""
    summary = subtask.history_text
    if subtask.status == SubtaskStatus.COMPLETED and subtask.artifact is None and summary:
        subtask.artifact = store_artifact(
            text=summary, kind=classify_text(summary), task_id=task.pk
        )
    subtask.save()
    if subtask.status != SubtaskStatus.COMPLETED or not summary.strip():
        return
    assert subtask.summary_last_message_id is not None  # a summary job covers a range
    Task.objects.filter(pk=task.pk).filter(
        Q(summary__isnull=True)
        | Q(summary__summary_last_message_id__lt=subtask.summary_last_message_id)
    ).update(summary=subtask)
    log_event(
        "summary_recorded",
        task=task.pk,
        subtask=subtask.pk,
        first_message_id=subtask.summary_first_message_id,
        last_message_id=subtask.summary_last_message_id,
        chars=subtask.history_chars,
        tokens=subtask.history_tokens,
    )


def restore_spilled_text(
    *, subtask: Subtask, status: str, result: dict[str, Any] | None, error: str
) -> bool:
    """Store the turn's spilled text again from a report that repeats the recorded one.

    The artifact's stored copy is checked against its sha256 and written anew only when it is
    missing or damaged (`artifacts.services.restore_artifact_file`); an intact copy is left as
    it is. Only the artifact's own content is ever written: a text with another sha256 (which a
    true repeat never has) is left alone. Returns whether the copy was written.
    """
    artifact = subtask.artifact
    if not subtask.history_is_preview or artifact is None:
        return False
    text = replace_unstorable_chars(
        history_text_for_result(status=status, result=result, error=error)[0]
    )[0]
    written = restore_artifact_file(artifact=artifact, text=text)
    if written:
        log_event(
            "artifact_restored",
            level=logging.WARNING,
            task=subtask.task_id,
            subtask=subtask.pk,
            artifact=artifact.pk,
        )
    return written
