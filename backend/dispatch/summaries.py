"""Summaries of omitted history: when to schedule a summary job, and the prompts of the jobs.

With a policy's `summaries_enabled`, every dispatched prompt that omits turns may schedule a
summary job; the prompt itself never waits for one. It shows the task's latest finished summary
(`Task.summary`, read with the history at no extra query) or, while none has finished, the
omission notice alone.

Scheduling, after a dispatch (`schedule_summaries`), per prompt that omitted turns:

* The span to cover ends with the newest omitted turn: the one just before the prompt's
  window (the pinned first user message aside). The task's latest summary covers the turns up
  to its last message id; the turns after that, up to the span's end, are not covered yet.
* When they reach `summary_threshold_turns`, and no summary job of the task is pending or
  running, one job is scheduled (under the task's lock, so exactly once however many workers
  dispatch): a Subtask of kind `summary` on `summary_bot`, PENDING in the same dispatch queue
  as the turns, covering a fixed range of message ids — from where the latest summary starts
  (the first turn, for a first summary) to the newest turn it takes in. It takes at most
  `MAX_TURNS_PER_JOB` turns: a longer span is summarized in chunks, one job after the other,
  each folding in the one before. So a job is scheduled once per threshold crossing.
* The job is claimed, leased and reported like a turn, on a worker that serves the bot's
  executor, so model keys stay on the workers. Its prompt (`summary_job_prompts`) holds the
  summary it folds in (after an omission notice counting the turns that summary covers), its
  turns, each cut at the per-message cap and none dropped, and the request to write one
  rolling summary. It carries no transcript pointer: the task's transcript file is the one its
  turns' prompts point to, and the job needs only what it folds. Its result is stored as an
  artifact with its token count (`tasks.services.record_result`) and becomes the task's
  summary, which later prompts show until the omitted span grows past the threshold again.

Costs: nothing for a policy with summaries off. Otherwise a dispatch reads which tasks have a
job in flight (one query, only when some prompt could schedule), and each job it schedules
costs a few queries of its own; a batch of summary jobs costs two queries to read their inputs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.dispatch.budgets import effective_max_tokens
from backend.dispatch.policies import ResolvedPolicy
from backend.dispatch.prompts import TurnPrompt
from backend.events import log_event
from backend.prompting import Role, build_prompt
from backend.prompting.policy import ContextPassing
from backend.prompting.summary import summary_job_policy
from backend.tasks.history import HISTORY_STATUSES, summary_job_inputs_for
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    TURNS,
    Bot,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    Task,
    TaskStatus,
)
from backend.tasks.services import allocate_message_ids, lock_task
from backend.tasks.wakeups import announce_pending

MAX_TURNS_PER_JOB = 50
"""Turns one summary job reads at most (each cut at the per-message cap): a longer span is
summarized in chunks, each job folding in the one before."""

SUMMARY_JOB = "summary_job"
"""A summary job's `resume_reason`: it never resumes a native session."""


@dataclass(frozen=True)
class _Candidate:
    """A dispatched prompt that omitted turns under a policy with summaries on."""

    task_id: int
    bot: str
    threshold: int
    covered_last: int
    """The last message id the task's latest summary covers (0: none yet)."""
    covered_first: int | None
    span_end: int
    """The newest omitted turn's message id (at most)."""


def schedule_summaries(*, prompts: Sequence[tuple[Subtask, TurnPrompt]]) -> list[Subtask]:
    """Schedule the summary jobs the dispatched `prompts` call for (see the module docstring);
    returns the jobs scheduled. Never raises: a summary is never worth failing a dispatch."""
    try:
        candidates = [
            candidate
            for subtask, prompt in prompts
            if (candidate := _candidate(subtask, prompt)) is not None
        ]
        if not candidates:
            return []
        busy = set(
            Subtask.objects.filter(
                task_id__in=[candidate.task_id for candidate in candidates],
                kind=SubtaskKind.SUMMARY,
                status__in=ACTIVE_SUBTASK_STATUSES,
            ).values_list("task_id", flat=True)
        )
        scheduled = []
        for candidate in candidates:
            if candidate.task_id not in busy:
                job = _schedule(candidate)
                if job is not None:
                    scheduled.append(job)
        return scheduled
    except Exception as error:  # noqa: BLE001 - a failed schedule must not fail the dispatch
        log_event("summary_schedule_failed", level=logging.ERROR, error_type=type(error).__name__)
        return []


def _candidate(subtask: Subtask, prompt: TurnPrompt) -> _Candidate | None:
    policy = prompt.resolved.policy
    report = prompt.build.report
    if (
        subtask.kind != SubtaskKind.TURN
        or not (policy.enabled and policy.summaries_enabled and policy.summary_bot)
        or not report.messages_omitted
    ):
        return None
    summary = prompt.input.summary
    covered_last = summary.last_message_id if summary is not None else 0
    span_end = _newest_omitted(prompt)
    # Message ids bound the turns between them: too few ids, too few turns (no query).
    if span_end - covered_last < policy.summary_threshold_turns:
        return None
    return _Candidate(
        task_id=subtask.task_id,
        bot=policy.summary_bot,
        threshold=policy.summary_threshold_turns,
        covered_last=covered_last,
        covered_first=summary.first_message_id if summary is not None else None,
        span_end=span_end,
    )


def _newest_omitted(prompt: TurnPrompt) -> int:
    """The message id the omitted span ends at: just before the prompt's window (the pinned
    first user message is not part of it), or just before the current message when the window
    is empty. Every history turn up to it that the window does not hold was omitted."""
    report = prompt.build.report
    pinned = prompt.input.first_user_message_id if report.first_user_message_pinned else None
    window = [message_id for message_id in report.included_message_ids if message_id != pinned]
    return (min(window) if window else prompt.input.current.message_id) - 1


def _schedule(candidate: _Candidate) -> Subtask | None:
    """The job for `candidate`, created under the task's lock, or None when it is not due."""
    uncovered = list(
        Subtask.objects.filter(
            TURNS,
            task_id=candidate.task_id,
            status__in=HISTORY_STATUSES,
            message_id__gt=candidate.covered_last,
            message_id__lte=candidate.span_end,
        )
        .order_by("message_id")
        .values_list("message_id", flat=True)[: max(candidate.threshold, MAX_TURNS_PER_JOB)]
    )
    if len(uncovered) < candidate.threshold:
        return None
    taken = uncovered[:MAX_TURNS_PER_JOB]
    bot = Bot.objects.filter(name=candidate.bot).first()
    if bot is None:
        log_event("summary_not_scheduled", level=logging.WARNING, task=candidate.task_id)
        return None
    with transaction.atomic():
        task = lock_task(task_id=candidate.task_id)
        if task.status == TaskStatus.CANCELLED or _superseded(task, candidate):
            return None
        now = timezone.now()
        job = Subtask.objects.create(
            task=task,
            kind=SubtaskKind.SUMMARY,
            message_id=allocate_message_ids(task_id=task.pk, count=1),
            role=Role.ASSISTANT,
            status=SubtaskStatus.PENDING,
            bot=bot.name,
            executor=bot.executor,
            pending_since=now,
            created_at=now,
            summary_first_message_id=candidate.covered_first or taken[0],
            summary_last_message_id=taken[-1],
            summary_previous_id=task.summary_id if candidate.covered_last else None,
        )
        announce_pending(executors=[job.executor])
    log_event(
        "summary_scheduled",
        task=task.pk,
        subtask=job.pk,
        message_id=job.message_id,
        first_message_id=job.summary_first_message_id,
        last_message_id=job.summary_last_message_id,
        turns=len(taken),
        executor=job.executor,
    )
    return job


def _superseded(task: Task, candidate: _Candidate) -> bool:
    """Under the task's lock: whether a job is in flight already, or a summary newer than the
    one the prompt showed has finished (the next dispatch decides then)."""
    return Subtask.objects.filter(
        Q(status__in=ACTIVE_SUBTASK_STATUSES)
        | Q(status=SubtaskStatus.COMPLETED, summary_last_message_id__gt=candidate.covered_last),
        task_id=task.pk,
        kind=SubtaskKind.SUMMARY,
    ).exists()


def summary_job_prompts(
    *, jobs: Sequence[Subtask], resolved: Mapping[int, ResolvedPolicy]
) -> tuple[list[tuple[Subtask, TurnPrompt]], dict[int, Exception]]:
    """The prompts of claimed summary jobs (loaded with `task` and `summary_previous`), under
    the policy of each job's task (`resolved`, by subtask id) made into a job's
    (`summary_job_policy`), and the jobs whose prompt could not be built, with why."""
    failed: dict[int, Exception] = {}
    try:
        inputs = summary_job_inputs_for(jobs=jobs, tasks={job.task_id: job.task for job in jobs})
    except Exception as error:  # noqa: BLE001 - any failure must release the claims
        return [], {job.pk: error for job in jobs}
    built = []
    for job in jobs:
        started = time.perf_counter()
        try:
            # The job's prompt is held to the policy's own caps (its bot's window is not asked).
            budget = effective_max_tokens(
                policy=summary_job_policy(resolved[job.pk].policy), window=None
            )
            policy = replace(resolved[job.pk], policy=budget.policy)
            build = build_prompt(
                inputs[job.pk], policy.policy, context_passing=ContextPassing.ORIGINAL_USER
            )
        except Exception as error:  # noqa: BLE001 - any failure must release the claim
            failed[job.pk] = error
            continue
        built.append(
            (
                job,
                TurnPrompt(
                    build=build,
                    resolved=policy,
                    budget=budget,
                    context_passing=ContextPassing.ORIGINAL_USER.value,
                    build_ms=(time.perf_counter() - started) * 1000,
                    input=inputs[job.pk],
                ),
            )
        )
    return built, failed
