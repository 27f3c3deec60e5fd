"""Building the prompt for one ASSISTANT turn: the same path for dispatch, preview and CLI."""

from __future__ import annotations

import time
from dataclasses import dataclass

from backend.dispatch.policies import ResolvedPolicy
from backend.prompting import Role
from backend.prompting.build import PromptBuild, build_prompt
from backend.prompting.inputs import PromptInput
from backend.tasks.history import prompt_input_for
from backend.tasks.models import Subtask, SubtaskStatus, Task


@dataclass(frozen=True)
class TurnPrompt:
    build: PromptBuild
    resolved: ResolvedPolicy
    context_passing: str
    build_ms: float
    input: PromptInput


def build_turn_prompt(
    *,
    subtask: Subtask,
    task: Task,
    resolved: ResolvedPolicy,
    prompt_input: PromptInput | None = None,
) -> TurnPrompt:
    """The prompt the executor receives for `subtask` under `resolved` policy.

    The pipeline step's own context-passing mode wins over the policy's default. Batch callers
    pass the `prompt_input` they loaded with `prompt_inputs_for`.
    """
    started = time.perf_counter()
    mode = subtask.context_passing or resolved.policy.context_passing
    if prompt_input is None:
        prompt_input = prompt_input_for(subtask=subtask, task=task, policy=resolved.policy)
    build = build_prompt(prompt_input, resolved.policy, context_passing=mode)
    return TurnPrompt(
        build=build,
        resolved=resolved,
        context_passing=str(mode),
        build_ms=(time.perf_counter() - started) * 1000,
        input=prompt_input,
    )


def next_turn_to_dispatch(*, task: Task) -> Subtask | None:
    """The turn the next dispatch of this task would send, or, when none is waiting, the
    latest assistant turn (what a re-run would send)."""
    turns = Subtask.objects.filter(task_id=task.pk, role=Role.ASSISTANT)
    waiting = (
        turns.filter(status__in=(SubtaskStatus.PENDING, SubtaskStatus.RUNNING))
        .order_by("message_id")
        .first()
    )
    return waiting or turns.order_by("-message_id").first()
