"""Selectors that read tasks and turns, scoped to what the caller may see."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from backend.artifacts.storage import verified_chunks
from backend.errors import NotFound
from backend.tasks.models import Bot, Subtask, Task


def visible_tasks(*, user: User) -> QuerySet[Task]:
    """Tasks the user may read: their own, or every task for staff."""
    tasks = Task.objects.all()
    if not user.is_staff:
        tasks = tasks.filter(owner=user)
    return tasks


def task_list(
    *, user: User, status: str | None = None, task_type: str | None = None
) -> QuerySet[Task]:
    tasks = visible_tasks(user=user).select_related("owner")
    if status:
        tasks = tasks.filter(status=status)
    if task_type:
        tasks = tasks.filter(task_type=task_type)
    return tasks.order_by("-created_at", "-id")


def get_task(*, user: User, task_id: int) -> Task:
    """The task with this id, or NotFound if it does not exist or the user may not see it."""
    task = visible_tasks(user=user).select_related("owner").filter(pk=task_id).first()
    if task is None:
        raise NotFound(f"Task {task_id} does not exist.")
    return task


def task_turns(*, task: Task) -> QuerySet[Subtask]:
    """The task's turns in message_id order."""
    return (
        Subtask.objects.filter(task_id=task.pk)
        .select_related("artifact")
        .defer("history_text", "preview_head", "preview_tail", "preview_layout")
        .order_by("message_id")
    )


def turn_result(*, subtask: Subtask) -> dict[str, Any] | None:
    """The turn's result exactly as the executor sent it.

    Long values live in the turn's artifact (see `Subtask.result_value_in_artifact`); this
    reads them back, checked against the artifact's sha256.
    """
    result: dict[str, Any] | None = subtask.result
    if not subtask.result_value_in_artifact or result is None:
        return result
    artifact = subtask.artifact
    assert artifact is not None  # the value lives in the turn's artifact, which the turn protects
    value = b"".join(
        verified_chunks(
            storage_key=artifact.storage_key, sha256=artifact.sha256, artifact_id=artifact.id
        )
    ).decode("utf-8")
    return {key: value if key == "value" else item for key, item in result.items()}


def bot_list() -> QuerySet[Bot]:
    return Bot.objects.order_by("name")


def get_bot(*, name: str) -> Bot:
    bot = Bot.objects.filter(name=name).first()
    if bot is None:
        raise NotFound(f"Bot {name!r} does not exist.")
    return bot


def bots_for_turns(subtasks: Sequence[Subtask]) -> dict[int, Bot]:
    """Per subtask id: its registered bot (one query). Turns stored before the registry, or
    whose bot is gone, get their executor's default bot."""
    kinds = {subtask.executor for subtask in subtasks}
    names = {subtask.bot for subtask in subtasks}
    rows = list(Bot.objects.filter(Q(name__in=names) | Q(is_default=True, executor__in=kinds)))
    by_name = {bot.name: bot for bot in rows}
    defaults = {bot.executor: bot for bot in rows if bot.is_default}
    found = {}
    for subtask in subtasks:
        bot = by_name.get(subtask.bot)
        if bot is None or bot.executor != subtask.executor:
            bot = defaults.get(subtask.executor)
        if bot is not None:
            found[subtask.pk] = bot
    return found
