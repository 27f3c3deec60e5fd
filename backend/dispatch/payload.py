"""Payloads: what a worker receives for each turn it claimed — prompt, report, manifest.

For every claimed turn: the bot, the resolved history policy, the full prompt and, when the
claiming worker holds the bot's native session, a resume prompt; one artifact manifest for
both (`manifests`); a PromptReport row per prompt and one `dispatch` log line per row
(`prompt_reports`). A claimed summary job gets the same, with its own prompt
(`summaries.summary_job_prompts`) and never a resume. Built in batch: a fixed number of
queries however many turns were claimed and however long their histories
(tests/dispatch/test_claim_queries.py pins it).

Invariants: a claimed turn whose payload cannot be built is released at once (requeued, or
failed after its last attempt) rather than left RUNNING until its lease expires; and no prompt
or result text reaches a log line or a report row (docs/architecture.md, principle 7).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.db.models import Prefetch, prefetch_related_objects

from backend.artifacts.models import Artifact
from backend.artifacts.selectors import ManifestEntry, ManifestPart
from backend.dispatch.budgets import TokenBudget, effective_max_tokens, model_windows_for
from backend.dispatch.build_failures import Releasing
from backend.dispatch.manifests import artifacts_to_list, manifest_of
from backend.dispatch.models import PromptReport
from backend.dispatch.policies import ResolvedPolicy, policy_rows, resolve_from_rows
from backend.dispatch.prompt_reports import dispatch_event, report_row
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
from backend.events import log_event
from backend.prompting.inputs import PromptInput
from backend.queries.rows import instance_of
from backend.tasks import task_events
from backend.tasks.history import prompt_input_for, prompt_inputs_for
from backend.tasks.models import Bot, NativeSession, Subtask, SubtaskKind, Task
from backend.tasks.selectors import bots_for_turns
from backend.tasks.transcripts import HistoryFiles, Transcript, store_transcripts, transcripts_for
from backend.tasks.whole_texts import store_whole_texts

_T = TypeVar("_T")


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

    A turn whose payload cannot be built is released (see `Releasing`) and left out: a stage
    of the whole batch that fails releases every turn it was building.
    """
    rows = loaded if loaded is not None else _read_claimed(ids)
    turns = [row for row in rows if row.kind == SubtaskKind.TURN]
    jobs = [row for row in rows if row.kind == SubtaskKind.SUMMARY]
    _read_previous_summaries(jobs)
    configuration = _Configuration.of(rows, turns=turns, version=configuration_version)
    releasing = Releasing(worker_id=worker_id)
    # A failure of the batch's read releases nothing: each turn's input is then read alone
    # (`_turn_prompts`), where a failure releases that turn only.
    inputs = releasing.on_failure(partial(_inputs_of, turns, configuration), release=()) or {}
    if sessions is None:
        sessions = releasing.on_failure(partial(native_sessions_for, turns), release=rows)
        if sessions is None:
            return []
    early = releasing.on_failure(
        partial(_early_transcripts, turns, inputs=inputs, budgets=configuration.budgets),
        release=rows,
    )
    if early is None:
        return []
    built: list[_Prompts] = []
    for turn in turns:
        stage = partial(
            _turn_prompts,
            turn,
            configuration=configuration,
            inputs=inputs,
            early=early,
            sessions=sessions,
            worker_id=worker_id,
        )
        if (prompts := releasing.on_failure(stage, release=[turn])) is not None:
            built.append(prompts)
    with_history = releasing.on_failure(
        partial(_with_transcripts, built), release=[item.subtask for item in built]
    )
    built, history_files = with_history if with_history is not None else ([], {})
    if jobs:
        built += _job_prompts(jobs, configuration=configuration, releasing=releasing)
        built.sort(key=lambda item: (item.subtask.pending_since, item.subtask.pk))
    built = [
        item
        for item in built
        if releasing.on_failure(partial(_store_whole_texts, item), release=[item.subtask])
        is not None
    ]
    artifacts = releasing.on_failure(
        partial(artifacts_to_list, [item.files for item in built], history_files=history_files),
        release=[item.subtask for item in built],
    )
    if artifacts is None:
        return []
    return [
        _claimed_turn(
            item,
            bot=configuration.bots[item.subtask.pk],
            worker=worker,
            worker_id=worker_id,
            artifacts=artifacts,
            history_files=history_files,
            session=sessions.get(item.subtask.pk),
        )
        for item in built
    ]


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
                    **dispatch_event(row=row, subtask=turn.subtask),
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
    """The claimed turns with their tasks, from rows that list the turn's `CLAIMED_FIELDS`
    then every column of its task, in the models' field order (and any columns after those):
    the instances `_read_claimed` loads."""
    width = len(CLAIMED_FIELDS)
    tasks = len(Task._meta.concrete_fields)
    claimed = []
    for row in rows:
        subtask = instance_of(Subtask, row[:width], CLAIMED_FIELDS)
        subtask.task = instance_of(Task, row[width : width + tasks])
        claimed.append(subtask)
    return claimed


def _read_claimed(ids: list[int]) -> list[Subtask]:
    """The claimed turns with their tasks, in line order, their `CLAIMED_FIELDS` only: what
    the claim statement returns on PostgreSQL (`claimed_rows`), in one query."""
    return list(
        Subtask.objects.filter(pk__in=ids)
        .select_related("task")
        .defer(*_LONG_COLUMNS)
        .order_by("pending_since", "id")
    )


def _read_previous_summaries(jobs: list[Subtask]) -> None:
    """Give each summary job its previous one: only a summary job builds on an earlier
    summary, so the turns' query stays narrow."""
    if jobs:
        prefetch_related_objects(
            jobs,
            Prefetch("summary_previous", queryset=Subtask.objects.defer(*_LONG_COLUMNS)),
        )


@dataclass(frozen=True)
class _Configuration:
    """What the claimed rows' payloads read of the configuration: by claimed row id, each
    one's bot (none for a row whose bot is gone) and policy, and each turn's token budget."""

    bots: dict[int, Bot]
    resolved: dict[int, ResolvedPolicy]
    budgets: dict[int, TokenBudget]

    @classmethod
    def of(
        cls, rows: list[Subtask], *, turns: list[Subtask], version: int | None
    ) -> _Configuration:
        bots = bots_for_turns(rows, configuration_version=version)
        windows = model_windows_for(bots.values(), configuration_version=version)
        policies = policy_rows(
            task_types={row.task.task_type for row in rows}, configuration_version=version
        )
        resolved = {
            row.pk: resolve_from_rows(task_type=row.task.task_type, rows=policies) for row in rows
        }
        budgets = {
            turn.pk: effective_max_tokens(
                policy=resolved[turn.pk].policy,
                window=windows.get(bots[turn.pk].pk) if turn.pk in bots else None,
                turn_cap=turn.token_cap,
            )
            for turn in turns
        }
        return cls(bots=bots, resolved=resolved, budgets=budgets)


@dataclass(frozen=True)
class _Prompts:
    """A claimed row's prompts: the full one, and the resume one with why it is offered or not."""

    subtask: Subtask
    prompt: TurnPrompt
    resume: TurnPrompt | None
    reason: str

    @property
    def files(self) -> tuple[int, TurnPrompt, TurnPrompt | None]:
        """What its manifest is read from (see `manifests.artifacts_to_list`)."""
        return self.subtask.task_id, self.prompt, self.resume


def _inputs_of(turns: list[Subtask], configuration: _Configuration) -> dict[int, PromptInput]:
    """The turns' prompt inputs, by turn id, read for the batch (see `prompt_inputs_for`)."""
    return prompt_inputs_for(
        requests=[(turn, turn.task, configuration.budgets[turn.pk].policy) for turn in turns]
    )


def _turn_prompts(
    subtask: Subtask,
    *,
    configuration: _Configuration,
    inputs: dict[int, PromptInput],
    early: dict[int, Transcript],
    sessions: dict[int, NativeSession],
    worker_id: str,
) -> _Prompts:
    """A claimed turn's full prompt and, when this worker may resume its native session, its
    resume prompt. The transcripts are read for the whole batch, before (`early`) or after
    (`_with_transcripts`)."""
    if subtask.pk not in configuration.bots:
        raise LookupError("no bot for the turn")
    policy = configuration.resolved[subtask.pk]
    budget = configuration.budgets[subtask.pk]
    full_input = inputs.get(subtask.pk) or prompt_input_for(
        subtask=subtask, task=subtask.task, policy=budget.policy
    )
    prompt = build_turn_prompt(
        subtask=subtask,
        task=subtask.task,
        resolved=policy,
        prompt_input=full_input,
        find_transcript=False,
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
            prompt_input=resume_input(full_input, session=session),
            budget=budget,
        )
    return _Prompts(subtask, prompt, resume, reason)


def _job_prompts(
    jobs: list[Subtask], *, configuration: _Configuration, releasing: Releasing
) -> list[_Prompts]:
    """The claimed summary jobs' prompts; a job whose prompt or bot is missing is released."""
    job_prompts, failures = summary_job_prompts(jobs=jobs, resolved=configuration.resolved)
    for job in jobs:
        if job.pk in failures:
            releasing.release(job, failures[job.pk])
        elif job.pk not in configuration.bots:
            releasing.release(job, LookupError("no bot"))
    return [
        _Prompts(job, prompt, None, SUMMARY_JOB)
        for job, prompt in job_prompts
        if job.pk in configuration.bots
    ]


def _store_whole_texts(item: _Prompts) -> _Prompts:
    """Store the cut texts the prompts address by content: every pointer must lead to a file
    the workspace will have, so they are stored before the manifest is read."""
    store_whole_texts(
        task_id=item.subtask.task_id,
        whole_texts=[
            *item.prompt.build.whole_texts,
            *(item.resume.build.whole_texts if item.resume is not None else ()),
        ],
    )
    return item


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


def _with_transcripts(built: list[_Prompts]) -> tuple[list[_Prompts], dict[int, HistoryFiles]]:
    """The batch with each prompt that left history out pointing to its task's transcript, and
    each such task's history files (turn index and turn files), stored: a prompt built
    without one (its omission showed only once built) is built again with it. Two queries to
    read those transcripts (sealed parts, and the turns after them), none when every prompt
    had its own already, and a few to store them all, for the batch (see
    `store_transcripts`)."""
    requests = [
        request
        for item in built
        if (request := needs_transcript(item.prompt, task=item.subtask.task)) is not None
    ]
    late = transcripts_for(requests)
    built = [
        replace(item, prompt=with_transcript(item.prompt, late[item.subtask.task_id]))
        if item.subtask.task_id in late and item.prompt.transcript is None
        else item
        for item in built
    ]
    transcripts = {
        item.subtask.task_id: item.prompt.transcript
        for item in built
        if item.prompt.transcript is not None
    }
    current = {
        item.subtask.task_id: (item.subtask.task.transcript_id, item.subtask.task.turn_index_id)
        for item in built
    }
    return built, store_transcripts(transcripts, current=current)


def _claimed_turn(
    item: _Prompts,
    *,
    bot: Bot,
    worker: User,
    worker_id: str,
    artifacts: dict[str, Artifact],
    history_files: dict[int, HistoryFiles],
    session: NativeSession | None,
) -> ClaimedTurn:
    """The payload of a claimed row whose prompts were built, with their unsaved reports."""
    subtask, prompt, resume = item.subtask, item.prompt, item.resume
    history = history_files.get(subtask.task_id) if prompt.transcript else None
    return ClaimedTurn(
        subtask=subtask,
        task=subtask.task,
        bot=bot,
        prompt=prompt,
        report=report_row(
            subtask=subtask,
            worker=worker,
            worker_id=worker_id,
            prompt=prompt,
            kind="full",
            resume_reason=item.reason,
        ),
        manifest=manifest_of(prompt=prompt, resume=resume, artifacts=artifacts, history=history),
        artifact_lists=history.lists if history is not None else [],
        session=session if resume is not None else None,
        resume=resume,
        resume_report=(
            report_row(
                subtask=subtask,
                worker=worker,
                worker_id=worker_id,
                prompt=resume,
                kind=RESUME,
                resume_reason=item.reason,
            )
            if resume is not None
            else None
        ),
        resume_reason=item.reason,
    )
