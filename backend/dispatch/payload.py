"""Payloads: what a worker receives for each turn it claimed — prompt, report, manifest.

For every claimed turn: the bot, the resolved history policy, the full prompt and, when the
claiming worker holds the bot's native session, a resume prompt; one artifact manifest for
both; a PromptReport row per prompt and one `dispatch` log line per row. A claimed summary job
gets the same, with its own prompt (`summaries.summary_job_prompts`) and never a resume. Built
in batch: a fixed number of queries however many turns were claimed and however long their
histories (tests/dispatch/test_claim_queries.py pins it).

Invariants: a claimed turn whose payload cannot be built is released at once (requeued, or
failed after its last attempt) rather than left RUNNING until its lease expires; and no prompt
or result text reaches a log line or a report row (docs/architecture.md, principle 7).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Prefetch, prefetch_related_objects

from backend import sql
from backend.artifacts.models import Artifact
from backend.artifacts.selectors import ManifestEntry, ManifestPart, manifest_artifacts
from backend.dispatch.budgets import (
    TokenBudget,
    budget_columns,
    effective_max_tokens,
    model_windows_for,
)
from backend.dispatch.leases import attempts_used, requeue
from backend.dispatch.models import PromptReport
from backend.dispatch.overflow import fail_unbuildable, overflow_columns
from backend.dispatch.policies import policy_rows, resolve_from_rows
from backend.dispatch.prompts import (
    TurnPrompt,
    build_turn_prompt,
    context_passing_of,
    needs_transcript,
    omits_unloaded_history,
    transcript_request,
    with_transcript,
)
from backend.dispatch.sessions import (
    RESUME,
    native_sessions_for,
    resume_input,
    resume_reason,
)
from backend.dispatch.summaries import SUMMARY_JOB, summary_job_prompts
from backend.events import EventValue, log_event, opaque_id
from backend.prompting import BUILDER_VERSION, PromptBudgetError
from backend.prompting.addressing import content_sha256
from backend.prompting.inputs import PromptInput
from backend.tasks import task_events
from backend.tasks.history import input_snapshot, prompt_input_for, prompt_inputs_for
from backend.tasks.models import Bot, NativeSession, Subtask, SubtaskKind, SubtaskStatus, Task
from backend.tasks.selectors import bots_for_turns
from backend.tasks.services import lock_task, record_result
from backend.tasks.transcripts import HistoryFiles, Transcript, store_transcripts, transcripts_for
from backend.tasks.whole_texts import store_whole_texts


@dataclass(frozen=True)
class ClaimedTurn:
    subtask: Subtask
    task: Task
    bot: Bot
    prompt: TurnPrompt
    report: PromptReport
    # Every file the prompts' pointer lines name (`.baton/artifacts/<id>.txt`, the transcript
    # at `.baton/history/...`) and, with a transcript, the history files it is split into.
    manifest: list[ManifestEntry]
    # The lists of more history files: one per sealed part of a long transcript.
    artifact_lists: list[ManifestPart]
    # Offered when the claiming worker can resume the bot's native session (see sessions.py).
    session: NativeSession | None
    resume: TurnPrompt | None
    resume_report: PromptReport | None
    resume_reason: str


def build_claimed_turns(
    *,
    ids: list[int],
    worker: User,
    worker_id: str,
    configuration_version: int | None = None,
    loaded: list[Subtask] | None = None,
    sessions: dict[int, NativeSession] | None = None,
) -> list[ClaimedTurn]:
    """The payloads of the turns the claim (`worker`, `worker_id`) just took (`ids`), oldest first.
    Their bots, model windows and policies reuse what this process read under the claim's
    `configuration_version` (see `backend.configuration_cache`). `loaded`: the claimed turns
    with their tasks as the claim statement returned them (`claimed_rows`), else read here;
    `sessions`: the claimed turns' native sessions it returned too (by turn id), else read here.

    A turn whose payload cannot be built is released (see `_build_failed`) and left out.
    """
    table, tasks = Subtask._meta.db_table, Task._meta.db_table
    # Every dispatch reads its claimed rows: the SQL is written out (see `backend.sql`).
    claimed_rows = (
        loaded
        if loaded is not None
        else sql.rows_of(
            Subtask,
            f"SELECT {sql.columns(Subtask, CLAIMED_FIELDS)}, {sql.columns(Task)} "  # noqa: S608
            f"FROM {table} JOIN {tasks} ON {tasks}.id = {table}.task_id "
            f"WHERE {table}.id IN ({sql.placeholders(ids)}) "
            f"ORDER BY {table}.pending_since, {table}.id",
            ids,
            fields=CLAIMED_FIELDS,
            joined=("task", None),
        )
    )
    subtasks = [row for row in claimed_rows if row.kind == SubtaskKind.TURN]
    jobs = [row for row in claimed_rows if row.kind == SubtaskKind.SUMMARY]
    if jobs:
        # Only a summary job builds on an earlier summary: the turns' query stays narrow.
        prefetch_related_objects(
            jobs,
            Prefetch("summary_previous", queryset=Subtask.objects.defer(*_LONG_COLUMNS)),
        )
    bots = bots_for_turns(claimed_rows, configuration_version=configuration_version)
    windows = model_windows_for(bots.values(), configuration_version=configuration_version)
    rows = policy_rows(
        task_types={subtask.task.task_type for subtask in claimed_rows},
        configuration_version=configuration_version,
    )
    resolved = {
        subtask.pk: resolve_from_rows(task_type=subtask.task.task_type, rows=rows)
        for subtask in claimed_rows
    }
    budgets = {
        subtask.pk: effective_max_tokens(
            policy=resolved[subtask.pk].policy,
            window=windows.get(bots[subtask.pk].pk) if subtask.pk in bots else None,
            turn_cap=subtask.token_cap,
        )
        for subtask in subtasks
    }
    try:
        inputs = prompt_inputs_for(
            requests=[(subtask, subtask.task, budgets[subtask.pk].policy) for subtask in subtasks]
        )
    except Exception:  # noqa: BLE001 - fall back to one turn at a time to isolate the failure
        inputs = {}
    try:
        if sessions is None:
            sessions = native_sessions_for(subtasks)
    except Exception as error:  # noqa: BLE001 - any failure must release the claims
        for subtask in claimed_rows:
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
        return []
    try:
        early = _early_transcripts(subtasks, inputs=inputs, budgets=budgets)
    except Exception as error:  # noqa: BLE001 - any failure must release the claims
        for subtask in claimed_rows:
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
        budget = budgets[subtask.pk]
        try:
            full_input = inputs.get(subtask.pk) or prompt_input_for(
                subtask=subtask, task=subtask.task, policy=budget.policy
            )
            prompt = build_turn_prompt(
                subtask=subtask,
                task=subtask.task,
                resolved=policy,
                prompt_input=full_input,
                find_transcript=False,  # read for the whole batch, before or after
                budget=budget,
                transcript=early.get(subtask.task_id),
            )
            session = sessions.get(subtask.pk)
            reason = resume_reason(
                subtask=subtask,
                session=session,
                input_window=budget.window.input_window if budget.window is not None else None,
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
                    budget=budget,
                )
        except Exception as error:  # noqa: BLE001 - any failure must release the claim
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
            continue
        built.append((subtask, prompt, resume, reason))
    try:
        built, history_files = _with_transcripts(built)
    except Exception as error:  # noqa: BLE001 - any failure must release the claims
        for subtask, *_ in built:
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
        built = []
    if jobs:
        job_prompts, job_failures = summary_job_prompts(jobs=jobs, resolved=resolved)
        for job in jobs:
            if job.pk in job_failures:
                _build_failed(subtask=job, worker_id=worker_id, error=job_failures[job.pk])
            elif job.pk not in bots:
                _build_failed(subtask=job, worker_id=worker_id, error=LookupError("no bot"))
        built += [(job, prompt, None, SUMMARY_JOB) for job, prompt in job_prompts if job.pk in bots]
        built.sort(key=lambda item: (item[0].pending_since, item[0].pk))
    stored: list[tuple[Subtask, TurnPrompt, TurnPrompt | None, str]] = []
    for subtask, prompt, resume, reason in built:
        try:
            # Every pointer must lead to a file the workspace will have: the cut texts the
            # prompts address by content are stored before the manifest is read.
            store_whole_texts(
                task_id=subtask.task_id,
                whole_texts=[
                    *prompt.build.whole_texts,
                    *(resume.build.whole_texts if resume is not None else ()),
                ],
            )
        except Exception as error:  # noqa: BLE001 - any failure must release the claim
            _build_failed(subtask=subtask, worker_id=worker_id, error=error)
            continue
        stored.append((subtask, prompt, resume, reason))
    built = stored
    try:
        manifest_entries = {
            artifact.id: artifact
            for artifact in manifest_artifacts(
                artifact_ids=[
                    artifact_id
                    for subtask, prompt, resume, _ in built
                    for artifact_id, path in _files_of(prompt, resume)
                    # A transcript stored just now comes with its entry: no row to read.
                    if _stored_transcript(
                        history_files.get(subtask.task_id) if prompt.transcript else None,
                        artifact_id=artifact_id,
                        path=path,
                    )
                    is None
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
                    worker=worker,
                    worker_id=worker_id,
                    prompt=prompt,
                    kind="full",
                    resume_reason=reason,
                ),
                manifest=_manifest(
                    prompt=prompt,
                    resume=resume,
                    artifacts=manifest_entries,
                    history=history_files.get(subtask.task_id) if prompt.transcript else None,
                ),
                artifact_lists=(
                    history_files[subtask.task_id].lists
                    if prompt.transcript and subtask.task_id in history_files
                    else []
                ),
                session=sessions.get(subtask.pk) if resume is not None else None,
                resume=resume,
                resume_report=(
                    _report_row(
                        subtask=subtask,
                        worker=worker,
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
    return claimed


def record_dispatch(claimed: Sequence[ClaimedTurn]) -> None:
    """Store what a claim built: its prompt reports and its turns' `turn.claimed` events
    (`task_events.record_claims`), committed together; then
    log a dispatch line per report."""
    reports = [row for turn in claimed for row in (turn.report, turn.resume_report) if row]
    task_events.record_claims(turns=[turn.subtask for turn in claimed], along=reports)
    for turn in claimed:
        for row in (turn.report, turn.resume_report):
            if row is not None:
                log_event(
                    "dispatch",
                    level=logging.INFO,
                    **_dispatch_event(row=row, subtask=turn.subtask),
                )


# Columns a payload never reads from the claimed rows (nor from a summary job's previous one).
_LONG_COLUMNS = (
    "result",
    "message",
    "history_text",
    "preview_head",
    "preview_tail",
    "preview_layout",
)
# The columns a payload reads of each claimed turn (and every column of its task).
CLAIMED_FIELDS = tuple(
    field.name for field in Subtask._meta.concrete_fields if field.name not in _LONG_COLUMNS
)


def claimed_rows(rows: Sequence[Sequence[Any]]) -> list[Subtask]:
    """The claimed turns with their tasks, from rows that select `sql.columns(Subtask,
    CLAIMED_FIELDS, …)` then `sql.columns(Task)` (and any columns after those)."""
    return sql.models_of(Subtask, rows, fields=CLAIMED_FIELDS, joined=("task", None))


def _early_transcripts(
    subtasks: list[Subtask],
    *,
    inputs: dict[int, PromptInput],
    budgets: dict[int, TokenBudget],
) -> dict[int, Transcript]:
    """The transcripts of the turns whose prompts leave history out whatever they select (a
    long conversation's window: `omits_unloaded_history`), read for the batch before any is
    built, so each of those prompts is built once, with its pointer; by task id."""
    requests = []
    for subtask in subtasks:
        full_input = inputs.get(subtask.pk)
        if full_input is None or full_input.transcript is not None:
            continue
        policy = budgets[subtask.pk].policy
        if omits_unloaded_history(
            full_input, policy, context_passing=context_passing_of(subtask, policy)
        ):
            requests.append(transcript_request(full_input, task_id=subtask.task_id))
    return transcripts_for(requests)


def _with_transcripts(
    built: list[tuple[Subtask, TurnPrompt, TurnPrompt | None, str]],
) -> tuple[list[tuple[Subtask, TurnPrompt, TurnPrompt | None, str]], dict[int, HistoryFiles]]:
    """The batch with each prompt that left history out pointing to its task's transcript, and
    each such task's history files (turn index and turn files), stored: a prompt built
    without one (its omission showed only once built) is built again with it. Two queries to
    read those transcripts (sealed parts, and the turns after them), none when every prompt
    had its own already, and a few to store them all, for the batch (see
    `store_transcripts`)."""
    requests = [
        request
        for subtask, prompt, _, _ in built
        if (request := needs_transcript(prompt, task=subtask.task)) is not None
    ]
    late = transcripts_for(requests)
    built = [
        (
            subtask,
            with_transcript(prompt, late[subtask.task_id])
            if subtask.task_id in late and prompt.transcript is None
            else prompt,
            resume,
            reason,
        )
        for subtask, prompt, resume, reason in built
    ]
    transcripts = {
        subtask.task_id: prompt.transcript
        for subtask, prompt, _, _ in built
        if prompt.transcript is not None
    }
    current = {
        subtask.task_id: (subtask.task.transcript_id, subtask.task.turn_index_id)
        for subtask, *_ in built
    }
    return built, store_transcripts(transcripts, current=current)


def _manifest(
    *,
    prompt: TurnPrompt,
    resume: TurnPrompt | None,
    artifacts: dict[str, Artifact],
    history: HistoryFiles | None,
) -> list[ManifestEntry]:
    """The files the prompts point to, then the history files. A transcript in parts is
    listed with its parts (its row has no file to download)."""
    return [
        *(
            _stored_transcript(history, artifact_id=artifact_id, path=path)
            or ManifestEntry.of(artifacts[artifact_id], workspace_path=path)
            for artifact_id, path in _files_of(prompt, resume)
        ),
        *(history.files if history is not None else []),
    ]


def _stored_transcript(
    history: HistoryFiles | None, *, artifact_id: str, path: str
) -> ManifestEntry | None:
    """The manifest entry of the transcript in parts this dispatch stored, when it is the file
    this pointer line names."""
    composite = history.transcript if history is not None else None
    if composite is not None and artifact_id == composite.id and path == composite.workspace_path:
        return composite
    return None


def _files_of(prompt: TurnPrompt, resume: TurnPrompt | None) -> list[tuple[str, str]]:
    """The (artifact id, workspace path) of every pointer line either prompt shows, each once:
    one manifest serves both (with fewer turns, a resume prompt may keep a turn the full prompt
    dropped)."""
    files: dict[tuple[str, str], None] = {}
    for turn_prompt in (prompt, resume):
        if turn_prompt is None:
            continue
        for section in turn_prompt.build.document.sections:
            pointers = [message.artifact for message in section.messages]
            if section.summary is not None:
                pointers.insert(0, section.summary.artifact)
            if section.notice is not None:
                pointers.insert(0, section.notice.transcript)
            for pointer in pointers:
                if pointer is not None:
                    files[(pointer.artifact_id, pointer.workspace_path)] = None
    return list(files)


def _report_row(
    *,
    subtask: Subtask,
    worker: User,
    worker_id: str,
    prompt: TurnPrompt,
    kind: str,
    resume_reason: str,
) -> PromptReport:
    return PromptReport(
        subtask=subtask,
        task_id=subtask.task_id,
        attempt=subtask.attempts,
        worker_id=worker_id,
        claimed_by=worker,
        kind=kind,
        resume_reason=resume_reason,
        **overflow_columns(subtask),
        **_build_columns(prompt, summary_job=subtask.kind == SubtaskKind.SUMMARY),
    )


def _build_columns(prompt: TurnPrompt, *, summary_job: bool = False) -> dict[str, Any]:
    """The PromptReport columns a built prompt fills: the one place its report is copied.

    The row is made from these and the dispatch log line from the row's columns, so a column
    added here is stored and logged without a second copy.
    """
    report = prompt.build.report
    return {
        "policy": prompt.resolved.row,
        "policy_source": prompt.resolved.source,
        "policy_version": prompt.resolved.version,
        "history_enabled": prompt.resolved.policy.enabled,
        "context_passing": prompt.context_passing,
        "messages_considered": report.messages_considered,
        "messages_included": report.messages_included,
        "messages_omitted": report.messages_omitted,
        "omitted_user": report.omitted_user,
        "omitted_assistant": report.omitted_assistant,
        "included_message_ids": list(report.included_message_ids),
        "truncated": [item.model_dump(mode="json") for item in report.truncated],
        "truncated_count": (
            len(report.truncated) + report.current_truncated + report.previous_result_truncated
        ),
        "current_truncated": report.current_truncated,
        "current_removed_chars": report.current_removed_chars,
        "previous_result_truncated": report.previous_result_truncated,
        "previous_result_removed_chars": report.previous_result_removed_chars,
        "sections": list(report.sections),
        "chars": report.chars,
        "bytes": report.bytes,
        "tokens": report.tokens,
        "history_tokens": report.history_tokens,
        "current_tokens": report.current_tokens,
        "previous_result_tokens": report.previous_result_tokens,
        "note_tokens": report.note_tokens,
        "summary_first_message_id": report.summary_first_message_id,
        "summary_last_message_id": report.summary_last_message_id,
        "summary_tokens": report.summary_tokens,
        "token_encoding": report.token_encoding,
        **budget_columns(prompt.budget, counted_tokens=report.tokens),
        "artifacts": list(report.artifacts),
        "first_user_message_pinned": report.first_user_message_pinned,
        "build_ms": round(prompt.build_ms, 3),
        "token_budget": prompt.resolved.policy.max_tokens,
        "builder_version": BUILDER_VERSION,
        "policy_snapshot": prompt.resolved.policy.model_dump(mode="json"),
        "input_snapshot": {
            **input_snapshot(prompt.input, summary_job=summary_job),
            "transcript": prompt.transcript.snapshot() if prompt.transcript else None,
        },
        "prompt_sha256": content_sha256(prompt.build.text),
    }


# Columns a dispatch line leaves out: the row's own id and time, which prompt was sent (known
# only when the result comes back), and what replay needs (a digest of the prompt is not for
# logs, and the snapshots are structures, not counts).
_NOT_LOGGED = frozenset(
    {"id", "created_at", "sent", "policy_snapshot", "input_snapshot", "prompt_sha256"}
)


def _dispatch_event(*, row: PromptReport, subtask: Subtask) -> dict[str, EventValue]:
    """The fields of a dispatch log line: every column of its PromptReport row (a foreign key
    by its id, a list by its length: counts, never the ids or titles themselves) and the
    turn's message id and executor. The worker id is the client's choice: logged opaque."""
    fields: dict[str, EventValue] = {
        "message_id": subtask.message_id,
        "executor": subtask.executor,
    }
    for column in PromptReport._meta.concrete_fields:
        if column.name in _NOT_LOGGED:
            continue
        value = getattr(row, column.attname)
        fields[column.name] = len(value) if isinstance(value, list) else value
    fields["worker_id"] = opaque_id(row.worker_id)
    return fields


def _build_failed(*, subtask: Subtask, worker_id: str, error: Exception) -> None:
    # The exception text may quote content; log only its type (principle 7).
    log_event(
        "dispatch_build_failed",
        level=logging.ERROR,
        task=subtask.task_id,
        subtask=subtask.pk,
        attempt=subtask.attempts,
        error_type=opaque_id(type(error).__name__),
    )
    _release_failed_claim(subtask=subtask, worker_id=worker_id, error=error)


def _release_failed_claim(*, subtask: Subtask, worker_id: str, error: Exception) -> None:
    """Undo a claim whose payload could not be built; after the last attempt, fail the turn.

    A turn retried after a context overflow whose prompt does not fit its tightened budget
    fails at once: another attempt would build the same prompt (see `overflow`).
    """
    with transaction.atomic():
        lock_task(task_id=subtask.task_id)
        current = Subtask.objects.filter(
            pk=subtask.pk, status=SubtaskStatus.RUNNING, lease_owner=worker_id
        ).first()
        if current is None:
            return
        if isinstance(error, PromptBudgetError) and current.token_cap is not None:
            fail_unbuildable(subtask=current, max_tokens=current.token_cap)
            return
        reason = type(error).__name__
        error_text = f"Baton could not build this turn's prompt ({reason})."
        if attempts_used(subtask=current) >= settings.BATON_MAX_ATTEMPTS:
            record_result(
                subtask=current,
                status=SubtaskStatus.FAILED,
                error=error_text,
                error_code="prompt_build_failed",
            )
        else:
            requeue(subtask=current, error=error_text, error_code="prompt_build_failed")
