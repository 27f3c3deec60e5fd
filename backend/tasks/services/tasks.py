"""Creating a task: its pipeline resolved to registered bots, its first message and first round.

Every check (title, task type, message, pipeline, sender, strategy) runs before anything is
stored; the task and its first round are then stored in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from backend import executor_kinds
from backend.artifacts.services import (
    atomic_storing_artifacts,
)
from backend.errors import InvalidInput
from backend.prompting import ContextPassing
from backend.tasks.models import (
    Bot,
    Task,
    task_type_validator,
)
from backend.tasks.services.rounds import _create_round
from backend.tasks.services.validation import (
    _validate_sender,
    _validate_strategy,
    validate_message_text,
)


@dataclass(frozen=True)
class PipelineStep:
    """One step of a task's pipeline, as given when the task is created.

    It names a registered bot, or only an executor (that executor's default bot). Naming both
    is allowed when they agree.
    """

    bot: str | None = None
    executor: str | None = None
    # None: the history policy of the task's type decides when the step is dispatched.
    context_passing: str | None = None


def check_pipeline_length(*, steps: int) -> None:
    """InvalidInput naming `pipeline` when it has more steps than BATON_MAX_PIPELINE_STEPS.

    Each step is one turn of every round, all created in one request, so the length is checked
    before anything else is looked at.
    """
    limit = settings.BATON_MAX_PIPELINE_STEPS
    if steps > limit:
        raise InvalidInput(
            f"pipeline has {steps} steps; at most {limit} are allowed.", field="pipeline"
        )


def resolve_pipeline(
    pipeline: Sequence[PipelineStep] | PipelineStep,
) -> list[dict[str, str | None]]:
    """The task's stored pipeline: each step's registered bot, its executor and context mode.

    A single step (not in a list) is a single-agent task, whose errors name `bot` or
    `executor`; a pipeline's errors name `pipeline.N.<field>`, or `pipeline` when it has no
    steps or more than BATON_MAX_PIPELINE_STEPS. Two queries at most.
    """
    single = isinstance(pipeline, PipelineStep)
    requested = [pipeline] if isinstance(pipeline, PipelineStep) else pipeline

    def _step_field(index: int, name: str) -> str:
        return name if single else f"pipeline.{index}.{name}"

    if not requested:
        raise InvalidInput("pipeline must have at least one step.", field="pipeline")
    check_pipeline_length(steps=len(requested))
    for index, step in enumerate(requested):
        if step.executor is not None and step.executor not in executor_kinds.NAMES:
            raise InvalidInput(
                f"executor {step.executor!r} is not one of {', '.join(executor_kinds.NAMES)}.",
                field=_step_field(index, "executor"),
            )
        if step.context_passing is not None and step.context_passing not in {
            mode.value for mode in ContextPassing
        }:
            raise InvalidInput(
                f"context_passing {step.context_passing!r} is not one of "
                f"{', '.join(mode.value for mode in ContextPassing)}.",
                field=_step_field(index, "context_passing"),
            )
        if step.bot is None and step.executor is None:
            raise InvalidInput("Name a bot or an executor.", field=_step_field(index, "executor"))
    named = {step.bot for step in requested if step.bot is not None}
    bots = {bot.name: bot for bot in Bot.objects.filter(name__in=named)}
    default_kinds = {step.executor for step in requested if step.bot is None}
    defaults = (
        {
            bot.executor: bot
            for bot in Bot.objects.filter(is_default=True, executor__in=default_kinds)
        }
        if default_kinds
        else {}
    )
    steps = []
    for index, step in enumerate(requested):
        if step.bot is not None:
            bot = bots.get(step.bot)
            if bot is None:
                raise InvalidInput(
                    f"bot {step.bot!r} is not registered; GET /api/bots/ lists the bots "
                    "(operators add them in the admin).",
                    field=_step_field(index, "bot"),
                )
            if step.executor is not None and step.executor != bot.executor:
                raise InvalidInput(
                    f"bot {bot.name!r} runs on {bot.executor}, not {step.executor}.",
                    field=_step_field(index, "executor"),
                )
        else:
            assert step.executor is not None  # checked above: a step names a bot or an executor
            bot = defaults.get(step.executor)
            if bot is None:
                raise InvalidInput(
                    f"executor {step.executor!r} has no default bot; name a bot instead.",
                    field=_step_field(index, "executor"),
                )
        steps.append(
            {"bot": bot.name, "executor": bot.executor, "context_passing": step.context_passing}
        )
    return steps


def create_task(
    *,
    owner: User,
    title: str,
    task_type: str,
    message: str,
    pipeline: Sequence[PipelineStep] | PipelineStep,
    sender: str = "",
    is_group_chat: bool = False,
    follow_up_strategy: str = "",
) -> Task:
    """Create a task with its first USER message and the PENDING turns that answer it.

    `pipeline` is a list of steps (at most BATON_MAX_PIPELINE_STEPS), or one step for a
    single-agent task. Every check runs before anything is stored.
    """
    if not title.strip():
        raise InvalidInput("title must not be empty.", field="title")
    try:
        task_type_validator(task_type)
    except ValidationError as error:
        raise InvalidInput(error.messages[0], field="task_type") from None
    validate_message_text(text=message)
    steps = resolve_pipeline(pipeline)
    _validate_sender(is_group_chat=is_group_chat, sender=sender)
    _validate_strategy(follow_up_strategy, field="follow_up_strategy", allow_empty=True)
    with atomic_storing_artifacts():
        task = Task.objects.create(
            owner=owner,
            title=title.strip(),
            task_type=task_type,
            is_group_chat=is_group_chat,
            pipeline=steps,
            follow_up_strategy=follow_up_strategy,
        )
        _create_round(task=task, message=message, sender=sender)
    return task
