"""The prompt preview: what the next dispatch of a task would send, under a saved or draft policy.

Operators tune history caps on real tasks before they save them (the admin's preview page) or
from a terminal (`manage.py preview_prompt`). Both call `preview_prompt`, which builds through
the same path as dispatch (`build_turn_prompt`, the same policy resolution and kill switch) so
the preview is the prompt byte for byte. It only reads: it claims nothing, records no
PromptReport and saves no policy, so previewing is safe on a live system.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from django.conf import settings

from backend.dispatch.budgets import TokenBudget, effective_max_tokens, turn_window
from backend.dispatch.models import HistoryPolicy
from backend.dispatch.policies import (
    POLICY_FIELDS,
    ResolvedPolicy,
    policy_rows,
    resolve_from_rows,
    resolve_policy,
)
from backend.dispatch.prompts import TurnPrompt, build_turn_prompt, next_turn_to_dispatch
from backend.dispatch.sessions import RESUME, native_sessions_for, resume_input, resume_reason
from backend.errors import InvalidInput, NotFound
from backend.prompting.build import PromptBudgetError
from backend.prompting.report import BuildReport
from backend.tasks.history import HISTORY_STATUSES, HistoryUnavailable, prompt_input_for
from backend.tasks.models import ROLE_CHOICES, TURNS, NativeSession, Subtask, Task

# The history list under the prompt names turns by id and role only, but a task can have
# thousands: list the newest ones (and any older turn the prompt includes, the pinned first
# user message) and count the rest.
HISTORY_LIST_LIMIT = 500

UNSAVED_SOURCE = "unsaved"


class TurnMark(StrEnum):
    """What became of one history turn in the previewed prompt."""

    INCLUDED = "included"
    TRUNCATED = "truncated"
    OMITTED = "omitted"
    HISTORY_OFF = "history off"


@dataclass(frozen=True)
class HistoryTurn:
    message_id: int
    role: str
    status: str
    mark: TurnMark
    removed_chars: int = 0


@dataclass(frozen=True)
class BudgetSegment:
    """One part of the token budget bar; `share` is its fraction of the bar's width."""

    name: str
    label: str
    tokens: int
    share: float

    @property
    def width_css(self) -> str:
        # Preformatted so a localized template never writes a decimal comma into CSS.
        return f"{self.share * 100:.2f}%"


@dataclass(frozen=True)
class ValueChange:
    """One cap a draft sets differently from the saved policy it is based on."""

    field: str
    saved: Any
    draft: Any


@dataclass(frozen=True)
class PromptPreview:
    task: Task
    subtask: Subtask
    turn_prompt: TurnPrompt
    policy_label: str
    policy_version: int | None
    unsaved: bool
    values: dict[str, Any]
    """The cap values previewed (before the global kill switch), for pre-filling a form."""
    kill_switch: bool
    """EXECUTOR_HISTORY_ENABLED=false turned history off whatever the policy says."""
    budget: tuple[BudgetSegment, ...]
    history_turns: tuple[HistoryTurn, ...]
    history_turns_not_listed: int
    session: NativeSession | None = None
    """The bot's native session in this task, if an earlier turn reported one."""
    resume_reason: str = ""
    """For the session's own worker: "resume", or why it would get the full prompt only."""
    resume_prompt: TurnPrompt | None = None
    """What that worker would send the resumed session: only the turns it has not seen."""
    changes: tuple[ValueChange, ...] = ()
    """For a draft: each value it changes against the saved policy (`saved_label`)."""
    saved_label: str = ""
    """For a draft: the saved policy it is based on, as the task type resolves it."""

    @property
    def text(self) -> str:
        return self.turn_prompt.build.text

    @property
    def report(self) -> BuildReport:
        return self.turn_prompt.build.report

    @property
    def model_tokens(self) -> int:
        """The prompt's size in the bot's model's tokens (at least, for an estimate)."""
        return self.turn_prompt.budget.model_tokens(self.report.tokens)

    @property
    def resolved(self) -> ResolvedPolicy:
        return self.turn_prompt.resolved

    @property
    def max_tokens(self) -> int | None:
        return self.resolved.policy.max_tokens


@dataclass(frozen=True)
class _Previewed:
    resolved: ResolvedPolicy
    values: dict[str, Any]
    label: str
    changes: tuple[ValueChange, ...] = ()
    saved_label: str = ""


def _resolve(*, task: Task, values_or_row: HistoryPolicy | Mapping[str, Any] | None) -> _Previewed:
    """The policy to preview, the cap values behind it, its label and, for a draft, what it
    changes against the saved policy."""
    if values_or_row is None:
        resolved = resolve_policy(task_type=task.task_type)
        return _Previewed(resolved, dict(resolved.values), resolved.label)
    rows = policy_rows(task_types={task.task_type})
    if isinstance(values_or_row, HistoryPolicy):
        # Resolved as if this row were the task type's own, so the kill switch and the default
        # row's values apply as at dispatch; the row may belong to another task type (try
        # `chat` caps on a code task).
        resolved = resolve_from_rows(
            task_type=task.task_type, rows={**rows, task.task_type: values_or_row}
        )
        return _Previewed(resolved, dict(resolved.values), resolved.label)
    unknown = sorted(set(values_or_row) - set(POLICY_FIELDS))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a policy field (known: {', '.join(POLICY_FIELDS)})",
            field=unknown[0],
        )
    base = resolve_from_rows(task_type=task.task_type, rows=rows)
    values = {**base.values, **values_or_row}
    # A draft row that is never saved and sets every field, resolved like a real one: the
    # same validation (InvalidInput naming the field) and the same kill switch.
    draft = HistoryPolicy(task_type=task.task_type, overrides=list(POLICY_FIELDS), **values)
    resolved = resolve_from_rows(task_type=task.task_type, rows={task.task_type: draft})
    resolved = replace(resolved, row=None, source=UNSAVED_SOURCE)
    changes = tuple(
        ValueChange(field=name, saved=base.values[name], draft=values[name])
        for name in POLICY_FIELDS
        if values[name] != base.values[name]
    )
    label = f"unsaved edit (based on {base.label})"
    return _Previewed(resolved, values, label, changes=changes, saved_label=base.label)


def _budget(report: BuildReport, max_tokens: int | None) -> tuple[BudgetSegment, ...]:
    parts = [
        ("history", "Conversation history", report.history_tokens),
        ("current", "Current message", report.current_tokens),
        ("previous_result", "Previous result", report.previous_result_tokens),
    ]
    structure = report.tokens - sum(tokens for _, _, tokens in parts)
    if structure > 0:
        parts.append(("structure", "Headers and markers", structure))
    if max_tokens is not None and max_tokens > report.tokens:
        parts.append(("unused", "Unused budget", max_tokens - report.tokens))
    whole = sum(tokens for _, _, tokens in parts)
    return tuple(
        BudgetSegment(name=name, label=label, tokens=tokens, share=tokens / whole if whole else 0)
        for name, label, tokens in parts
        if tokens > 0
    )


def _history_turns(
    *, task: Task, subtask: Subtask, report: BuildReport
) -> tuple[tuple[HistoryTurn, ...], int]:
    """The task's history turns (ids, roles, statuses only), newest first, each marked."""
    if subtask.parent_message_id is None:
        return (), 0
    rows = Subtask.objects.filter(
        TURNS,
        task_id=task.pk,
        message_id__lt=subtask.parent_message_id,
        status__in=HISTORY_STATUSES,
    ).order_by("-message_id")
    columns = ("message_id", "role", "status")
    listed = list(rows.values_list(*columns)[: HISTORY_LIST_LIMIT + 1])
    not_listed = 0
    if len(listed) > HISTORY_LIST_LIMIT:
        listed = listed[:HISTORY_LIST_LIMIT]
        not_listed = rows.count() - HISTORY_LIST_LIMIT
        older_included = set(report.included_message_ids) - {row[0] for row in listed}
        if older_included:
            listed += list(rows.filter(message_id__in=older_included).values_list(*columns))
            not_listed -= len(older_included)
    included = set(report.included_message_ids)
    removed = {item.message_id: item.removed_chars for item in report.truncated}
    in_play = report.messages_considered > 0
    role_labels = dict(ROLE_CHOICES)
    turns = []
    for message_id, role, status in listed:
        if not in_play:
            mark = TurnMark.HISTORY_OFF
        elif message_id in removed:
            mark = TurnMark.TRUNCATED
        elif message_id in included:
            mark = TurnMark.INCLUDED
        else:
            mark = TurnMark.OMITTED
        turns.append(
            HistoryTurn(
                message_id=message_id,
                role=role_labels[role],
                status=status,
                mark=mark,
                removed_chars=removed.get(message_id, 0),
            )
        )
    return tuple(turns), not_listed


def preview_prompt(
    *,
    task: Task,
    values_or_row: HistoryPolicy | Mapping[str, Any] | None = None,
    subtask: Subtask | None = None,
) -> PromptPreview:
    """The prompt the next dispatch of `task` would send, and its report, without dispatching.

    `values_or_row`: None previews the policy dispatch would resolve for the task's type; a
    `HistoryPolicy` row previews that saved row; a mapping of cap values previews an unsaved
    edit (values not given come from the task type's resolved policy). `subtask` picks the
    turn; by default the next one to dispatch (`next_turn_to_dispatch`).

    Raises InvalidInput naming the field for invalid values or a turn that cannot be
    prompted, and NotFound when the task has no assistant turn.
    """
    if subtask is None:
        subtask = next_turn_to_dispatch(task=task)
        if subtask is None:
            raise NotFound(f"Task {task.pk} has no assistant turn to preview.", field="task")
    elif subtask.task_id != task.pk:
        raise InvalidInput(
            f"Subtask {subtask.pk} is not a turn of task {task.pk}.", field="subtask"
        )
    previewed = _resolve(task=task, values_or_row=values_or_row)
    resolved = previewed.resolved
    budget = effective_max_tokens(
        policy=resolved.policy, window=turn_window(subtask), turn_cap=subtask.token_cap
    )
    try:
        full_input = prompt_input_for(subtask=subtask, task=task, policy=budget.policy)
        turn_prompt = build_turn_prompt(
            subtask=subtask, task=task, resolved=resolved, prompt_input=full_input, budget=budget
        )
        session, reason, resume_prompt = _resume_preview(
            subtask=subtask, task=task, resolved=resolved, full_input=full_input, budget=budget
        )
    except HistoryUnavailable as error:
        raise InvalidInput(str(error), field="subtask") from None
    except PromptBudgetError as error:
        raise InvalidInput(f"max_tokens: {error}", field="max_tokens") from None
    report = turn_prompt.build.report
    history_turns, not_listed = _history_turns(task=task, subtask=subtask, report=report)
    return PromptPreview(
        task=task,
        subtask=subtask,
        turn_prompt=turn_prompt,
        policy_label=previewed.label,
        policy_version=resolved.version,
        unsaved=resolved.source == UNSAVED_SOURCE,
        values=previewed.values,
        kill_switch=not settings.EXECUTOR_HISTORY_ENABLED,
        budget=_budget(report, turn_prompt.resolved.policy.max_tokens),
        history_turns=history_turns,
        history_turns_not_listed=not_listed,
        session=session,
        resume_reason=reason,
        resume_prompt=resume_prompt,
        changes=previewed.changes,
        saved_label=previewed.saved_label,
    )


def _resume_preview(
    *,
    subtask: Subtask,
    task: Task,
    resolved: ResolvedPolicy,
    full_input: Any,
    budget: TokenBudget,
) -> tuple[NativeSession | None, str, TurnPrompt | None]:
    """The bot's session, and the resume prompt its own worker would get (as dispatch builds
    it), or why it would get none."""
    session = native_sessions_for([subtask]).get(subtask.pk)
    if session is None:
        return session, "no_session", None
    reason = resume_reason(
        subtask=subtask,
        session=session,
        input_window=budget.window.input_window if budget.window is not None else None,
        policy=resolved.policy,
        worker_id=session.worker_id,
        full_input=full_input,
    )
    if reason != RESUME:
        return session, reason, None
    resume = build_turn_prompt(
        subtask=subtask,
        task=task,
        resolved=resolved,
        prompt_input=resume_input(full_input, session=session),
        budget=budget,
    )
    return session, reason, resume
