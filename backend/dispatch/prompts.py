"""Building the prompt for one ASSISTANT turn: the same path for dispatch, preview and CLI."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from backend.dispatch.budgets import TokenBudget, effective_max_tokens
from backend.dispatch.policies import ResolvedPolicy
from backend.prompting import Role
from backend.prompting.build import PromptBuild, build_prompt
from backend.prompting.inputs import PromptInput
from backend.tasks.history import prompt_input_for
from backend.tasks.models import TURNS, Subtask, SubtaskStatus, Task
from backend.tasks.transcripts import Transcript, TranscriptRequest, transcripts_for


@dataclass(frozen=True)
class TurnPrompt:
    build: PromptBuild
    resolved: ResolvedPolicy
    """The policy as resolved, with the budget's `max_tokens` and `token_encoding` in it: what
    the builder received."""
    budget: TokenBudget
    context_passing: str
    build_ms: float
    input: PromptInput
    transcript: Transcript | None = None
    """The whole conversation the omission notice points to (stored when dispatched)."""


def build_turn_prompt(
    *,
    subtask: Subtask,
    task: Task,
    resolved: ResolvedPolicy,
    prompt_input: PromptInput | None = None,
    find_transcript: bool = True,
    budget: TokenBudget | None = None,
) -> TurnPrompt:
    """The prompt the executor receives for `subtask` under `resolved` policy and `budget`,
    the policy's budget for the bot's model (`budgets.effective_max_tokens`; by default, the
    policy's own caps, as for a bot whose model is not known).

    The pipeline step's own context-passing mode wins over the policy's default. Batch callers
    pass the `prompt_input` they loaded with `prompt_inputs_for`, and `find_transcript=False`
    to add the transcripts of a whole batch at once (`needs_transcript`, `with_transcript`).
    """
    started = time.perf_counter()
    if budget is None:
        budget = effective_max_tokens(
            policy=resolved.policy, window=None, turn_cap=subtask.token_cap
        )
    resolved = replace(resolved, policy=budget.policy)
    mode = subtask.context_passing or resolved.policy.context_passing
    if prompt_input is None:
        prompt_input = prompt_input_for(subtask=subtask, task=task, policy=resolved.policy)
    build = build_prompt(prompt_input, resolved.policy, context_passing=mode)
    turn_prompt = TurnPrompt(
        build=build,
        resolved=resolved,
        budget=budget,
        context_passing=str(mode),
        build_ms=(time.perf_counter() - started) * 1000,
        input=prompt_input,
    )
    request = needs_transcript(turn_prompt, task=task) if find_transcript else None
    if request is not None:
        transcript = transcripts_for([request]).get(task.pk)
        if transcript is not None:
            return with_transcript(turn_prompt, transcript)
    return turn_prompt


def needs_transcript(turn_prompt: TurnPrompt, *, task: Task) -> TranscriptRequest | None:
    """What to read for the prompt's transcript, when its history left something out."""
    prompt_input = turn_prompt.input
    if not turn_prompt.build.report.messages_omitted or prompt_input.transcript is not None:
        return None
    return TranscriptRequest(
        task_id=task.pk,
        is_group_chat=prompt_input.is_group_chat,
        multi_bot=prompt_input.multi_bot,
        before_message_id=prompt_input.current.message_id,
    )


def with_transcript(turn_prompt: TurnPrompt, transcript: Transcript) -> TurnPrompt:
    """The prompt built again with its omission notice pointing to `transcript` (the pointer
    line takes room, so the selection may change)."""
    started = time.perf_counter()
    prompt_input = turn_prompt.input.with_transcript(transcript.pointer)
    build = build_prompt(
        prompt_input, turn_prompt.resolved.policy, context_passing=turn_prompt.context_passing
    )
    return replace(
        turn_prompt,
        build=build,
        input=prompt_input,
        transcript=transcript,
        build_ms=turn_prompt.build_ms + (time.perf_counter() - started) * 1000,
    )


def next_turn_to_dispatch(*, task: Task) -> Subtask | None:
    """The turn the next dispatch of this task would send, or, when none is waiting, the
    latest assistant turn (what a re-run would send)."""
    turns = Subtask.objects.filter(TURNS, task_id=task.pk, role=Role.ASSISTANT)
    waiting = (
        turns.filter(status__in=(SubtaskStatus.PENDING, SubtaskStatus.RUNNING))
        .order_by("message_id")
        .first()
    )
    return waiting or turns.order_by("-message_id").first()
