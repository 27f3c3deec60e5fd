"""Building the prompt for one ASSISTANT turn: the same path for dispatch, preview and CLI."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from backend.dispatch.budgets import TokenBudget, effective_max_tokens
from backend.dispatch.policies import ResolvedPolicy
from backend.prompting import Role
from backend.prompting.build import PromptBuild, build_prompt
from backend.prompting.inputs import PromptInput
from backend.prompting.policy import ContextPassing, PromptPolicy
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
    transcript: Transcript | None = None,
) -> TurnPrompt:
    """The prompt the executor receives for `subtask` under `resolved` policy and `budget`,
    the policy's budget for the bot's model (`budgets.effective_max_tokens`; by default, the
    policy's own caps, as for a bot whose model is not known).

    The pipeline step's own context-passing mode wins over the policy's default. Batch callers
    pass the `prompt_input` they loaded with `prompt_inputs_for`, and `find_transcript=False`
    to add the transcripts of a whole batch at once: the `transcript` read beforehand for an
    input that leaves history out whatever is selected (`omits_unloaded_history`), else, once
    built, `needs_transcript` and `with_transcript`.

    A prompt whose history leaves turns out points to the transcript, and the pointer line
    takes room: when the omission is certain before building, the transcript is read first
    and the prompt built once, with it; otherwise it is built, and built again with it.
    """
    started = time.perf_counter()
    if budget is None:
        budget = effective_max_tokens(
            policy=resolved.policy, window=None, turn_cap=subtask.token_cap
        )
    resolved = replace(resolved, policy=budget.policy)
    mode = context_passing_of(subtask, resolved.policy)
    if prompt_input is None:
        prompt_input = prompt_input_for(subtask=subtask, task=task, policy=resolved.policy)
    if (
        transcript is None
        and find_transcript
        and prompt_input.transcript is None
        and omits_unloaded_history(prompt_input, resolved.policy, context_passing=mode)
    ):
        transcript = transcripts_for([transcript_request(prompt_input, task_id=task.pk)]).get(
            task.pk
        )
    if transcript is not None:
        prompt_input = prompt_input.with_transcript(transcript.pointer)
    build = build_prompt(prompt_input, resolved.policy, context_passing=mode)
    turn_prompt = TurnPrompt(
        build=build,
        resolved=resolved,
        budget=budget,
        context_passing=str(mode),
        build_ms=(time.perf_counter() - started) * 1000,
        input=prompt_input,
        transcript=transcript,
    )
    request = needs_transcript(turn_prompt, task=task) if find_transcript else None
    if request is not None:
        transcript = transcripts_for([request]).get(task.pk)
        if transcript is not None:
            return with_transcript(turn_prompt, transcript)
    return turn_prompt


def context_passing_of(subtask: Subtask, policy: PromptPolicy) -> str:
    """The turn's context-passing mode: its pipeline step's own, else the policy's default."""
    return subtask.context_passing or policy.context_passing


def omits_unloaded_history(
    prompt_input: PromptInput, policy: PromptPolicy, *, context_passing: ContextPassing | str
) -> bool:
    """Whether every build of `prompt_input` leaves history out, whatever it selects: it
    shows history, and older turns than its window were only counted, never loaded (a long
    conversation's newest window, `prompt_inputs_for`)."""
    return (
        policy.enabled
        and ContextPassing(context_passing).includes_history
        and prompt_input.earlier_user_messages + prompt_input.earlier_assistant_messages > 0
    )


def transcript_request(prompt_input: PromptInput, *, task_id: int) -> TranscriptRequest:
    """What to read for the transcript of `prompt_input`'s history (`transcripts_for`)."""
    return TranscriptRequest(
        task_id=task_id,
        is_group_chat=prompt_input.is_group_chat,
        multi_bot=prompt_input.multi_bot,
        before_message_id=prompt_input.current.message_id,
    )


def needs_transcript(turn_prompt: TurnPrompt, *, task: Task) -> TranscriptRequest | None:
    """What to read for the prompt's transcript, when its history left something out."""
    prompt_input = turn_prompt.input
    if not turn_prompt.build.report.messages_omitted or prompt_input.transcript is not None:
        return None
    return transcript_request(prompt_input, task_id=task.pk)


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
