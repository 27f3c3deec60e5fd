"""Recovery from context overflow: a prompt the model refused as too long is tried again.

When a claim reports that its run ended with error code `context_overflow` (status FAILED or
RETRY), Baton does not fail the turn at once. What it retries depends on what overflowed:

- The run resumed the bot's native session with a resume prompt (the report says
  `session_resumed`, and the dispatch offered that attempt a resume prompt): the session's own
  accumulated context overflowed, not Baton's few unseen turns, so making that prompt smaller
  would not help. Baton forgets the session and requeues the turn once to run in a FRESH session
  with the full prompt under its normal budget (no turn cap is set); its PromptReport's
  `retry_reason` is `resumed_session_overflow`.
- A full prompt overflowed: Baton requeues the turn with half the budget of that prompt — the
  tokens it took, which never exceed the cap it was built under — as the turn's own cap
  (`Subtask.token_cap`); its PromptReport's `retry_reason` is `context_overflow`, with
  `previous_token_budget` and `token_budget`.

The next dispatch builds the prompt under the smallest of its bounds, the turn cap one of them
(`budgets.effective_max_tokens`), and offers no resume prompt once the turn has overflowed
(`sessions.resume_reason`), so every retry runs a fresh session with the full prompt. These
requeues do not use up BATON_MAX_ATTEMPTS: BATON_CONTEXT_OVERFLOW_RETRIES bounds the halvings,
and the fresh-session retry happens at most once per turn (no later attempt resumes).

A turn whose full prompt overflows again once its retries are used up — a thrash loop, which
Claude Code itself stops after three refills in a row — fails, as does one whose prompt cannot
be made smaller (it took no more than the smallest budget a policy allows, or its fixed
sections alone exceed the budget). It fails with error code `context_overflow` and an error
that says what was tried: every overflowing attempt, a resumed session's as such, with its
prompt's size and budget. That error is what later prompts show of the turn, so they carry
Baton's account of the failure, not a bare provider message; the attempts that were requeued
leave nothing in history (the turn stays one turn, PENDING between its attempts).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from django.conf import settings

from backend.dispatch.leases import requeue
from backend.dispatch.models import PromptReport
from backend.dispatch.sessions import RESUME, forget_session
from backend.events import log_event
from backend.prompting.policy import MIN_MAX_TOKENS
from backend.tasks.models import Subtask, SubtaskStatus
from backend.tasks.services import record_result

CONTEXT_OVERFLOW = "context_overflow"
"""The error code of an overflow, and the retry reason of a prompt built smaller after one."""
RESUMED_OVERFLOW = "resumed_session_overflow"
"""The retry reason of a full prompt in a fresh session after a resumed session overflowed."""
# The executor's own words are kept to this many characters of their first line.
LAST_ERROR_CHARS = 300


class Overflow(TypedDict):
    """One attempt whose prompt overflowed (an entry of `Subtask.context_overflows`)."""

    attempt: int
    tokens: int | None  # what its sent prompt took (None: no report of it)
    max_tokens: int | None  # the budget it was built under (None: no cap)
    # The attempt ran a resume prompt in the bot's native session (absent: it did not).
    resumed: NotRequired[bool]
    # That session's input tokens on its last completed turn (None: not reported).
    session_tokens: NotRequired[int | None]


def tighter_budget(*, tokens: int | None) -> int | None:
    """The cap for the retry of a prompt that took `tokens` and overflowed: half of it, never
    below the smallest budget a policy allows (MIN_MAX_TOKENS). None when no smaller prompt can
    be asked for (the prompt already fits that smallest budget, or its size is unknown)."""
    if tokens is None:
        return None
    budget = max(tokens // 2, MIN_MAX_TOKENS)
    return budget if budget < tokens else None


def overflow_columns(subtask: Subtask) -> dict[str, Any]:
    """The PromptReport columns saying why the turn's prompt is built again, if it is."""
    if not subtask.context_overflows:
        return {}
    previous: Overflow = subtask.context_overflows[-1]
    if previous.get("resumed"):
        return {"retry_reason": RESUMED_OVERFLOW}
    if subtask.token_cap is None:
        return {}
    return {"retry_reason": CONTEXT_OVERFLOW, "previous_token_budget": previous["tokens"]}


def halvings(overflows: list[Overflow]) -> int:
    """How many of `overflows` were full prompts (each retried, or given up, halved)."""
    return sum(1 for overflow in overflows if not overflow.get("resumed"))


def recover_from_overflow(*, subtask: Subtask, error: str, session_resumed: bool) -> None:
    """The claim running `subtask` (locked, RUNNING) reports that the model refused its prompt
    as too long (`error`, the executor's words; `session_resumed`, the worker's word that the
    run resumed the native session the dispatch offered): requeue it in a fresh session, or
    with a tighter budget, or fail it with an error saying what was tried (see the module
    docstring)."""
    reports = {
        report.kind: report
        for report in PromptReport.objects.filter(subtask=subtask, attempt=subtask.attempts)
        .only("kind", "tokens", "token_budget")
        .order_by("id")
    }
    # A resume counts only where the dispatch offered one: its report is what was sent.
    resumed = session_resumed and RESUME in reports
    report = reports.get(RESUME if resumed else "full")
    overflow = Overflow(
        attempt=subtask.attempts,
        tokens=report.tokens if report is not None else None,
        max_tokens=report.token_budget if report is not None else None,
    )
    if resumed:
        overflow["resumed"] = True
        # The session cannot take more: no later turn of the bot resumes it.
        overflow["session_tokens"] = forget_session(subtask=subtask)
    overflows: list[Overflow] = [*subtask.context_overflows, overflow]
    retries = halvings(subtask.context_overflows)
    budget = None if resumed else tighter_budget(tokens=overflow["tokens"])
    retrying = resumed or (budget is not None and retries < settings.BATON_CONTEXT_OVERFLOW_RETRIES)
    log_event(
        CONTEXT_OVERFLOW,
        task=subtask.task_id,
        subtask=subtask.pk,
        attempt=subtask.attempts,
        resumed=resumed,
        prompt_tokens=overflow["tokens"],
        max_tokens=overflow["max_tokens"],
        token_cap=budget if retrying else None,
        retries=retries,
        gave_up=not retrying,
    )
    # A fresh session may run on any worker: the turn is no longer held for the session's.
    Subtask.objects.filter(pk=subtask.pk).update(
        context_overflows=overflows,
        token_cap=budget if retrying and budget is not None else subtask.token_cap,
        session_worker="" if retrying else subtask.session_worker,
    )
    subtask.context_overflows = overflows
    if retrying:
        requeue(subtask=subtask, error=error, error_code=CONTEXT_OVERFLOW)
        return
    reason = _why_not_smaller(overflow) if budget is None else _retries_used_up(overflows)
    record_result(
        subtask=subtask,
        status=SubtaskStatus.FAILED,
        error=overflow_failure(overflows=overflows, reason=reason, last_error=error),
        error_code=CONTEXT_OVERFLOW,
    )


def fail_unbuildable(*, subtask: Subtask, max_tokens: int) -> None:
    """Fail a requeued overflow turn (locked, RUNNING) whose prompt cannot be built under its
    tightened budget `max_tokens`: the fixed sections alone exceed it."""
    reason = (
        f"A smaller prompt cannot be built: its fixed sections alone exceed the "
        f"{max_tokens}-token budget."
    )
    record_result(
        subtask=subtask,
        status=SubtaskStatus.FAILED,
        error=overflow_failure(overflows=subtask.context_overflows, reason=reason, last_error=""),
        error_code=CONTEXT_OVERFLOW,
    )


def overflow_failure(*, overflows: list[Overflow], reason: str, last_error: str) -> str:
    """The error of a turn that failed for context overflow: what was tried, and why no more."""
    tried = "; ".join(_attempt_line(overflow) for overflow in overflows)
    text = f"The prompt did not fit the model's context window ({tried}). {reason}"
    first_line = last_error.strip().split("\n", 1)[0]
    if first_line:
        if len(first_line) > LAST_ERROR_CHARS:
            first_line = first_line[: LAST_ERROR_CHARS - 1] + "…"
        text += f" The executor's last error: {first_line}"
    return text


def _attempt_line(overflow: Overflow) -> str:
    if overflow.get("resumed"):
        size = "a resume prompt of unknown size"
        if overflow["tokens"] is not None:
            size = f"a {overflow['tokens']}-token resume prompt"
        line = f"attempt {overflow['attempt']}: {size} in a resumed native session"
        session_tokens = overflow.get("session_tokens")
        if session_tokens is not None:
            line += f" whose last turn took {session_tokens} input tokens"
        return line
    size = "size unknown" if overflow["tokens"] is None else f"{overflow['tokens']} tokens"
    cap = overflow["max_tokens"]
    budget = "no token cap" if cap is None else f"a {cap}-token budget"
    return f"attempt {overflow['attempt']}: {size} under {budget}"


def _why_not_smaller(overflow: Overflow) -> str:
    if overflow["tokens"] is None:
        return "Baton has no report of the prompt's size to tighten its budget from."
    return (
        f"A smaller prompt cannot be built: it took {overflow['tokens']} tokens, and no "
        f"budget goes below {MIN_MAX_TOKENS} tokens."
    )


def _retries_used_up(overflows: list[Overflow]) -> str:
    """Why a full prompt that overflowed (the last of `overflows`) is not retried smaller."""
    retries = halvings(overflows) - 1
    setting = f"BATON_CONTEXT_OVERFLOW_RETRIES={settings.BATON_CONTEXT_OVERFLOW_RETRIES}"
    fresh = any(overflow.get("resumed") for overflow in overflows)
    if not retries:
        off = f"Retrying with a tighter budget is off ({setting})."
        return f"Baton retried in a fresh session; {off[0].lower()}{off[1:]}" if fresh else off
    plural = "retry" if retries == 1 else "retries"
    after = f"a fresh session and {retries} {plural}" if fresh else f"{retries} {plural}"
    return f"Baton gave up after {after} with a halved budget ({setting})."
