"""Selectors that read tasks and turns, scoped to what the caller may see."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from backend.errors import NotFound
from backend.tasks.models import Subtask, Task


def visible_tasks(*, user: AbstractBaseUser) -> QuerySet[Task]:
    """Tasks the user may read: their own, or every task for staff."""
    tasks = Task.objects.all()
    if not user.is_staff:
        tasks = tasks.filter(owner=user)
    return tasks


def task_list(
    *, user: AbstractBaseUser, status: str | None = None, task_type: str | None = None
) -> QuerySet[Task]:
    tasks = visible_tasks(user=user).select_related("owner")
    if status:
        tasks = tasks.filter(status=status)
    if task_type:
        tasks = tasks.filter(task_type=task_type)
    return tasks.order_by("-created_at", "-id")


def get_task(*, user: AbstractBaseUser, task_id: int) -> Task:
    """The task with this id, or NotFound if it does not exist or the user may not see it."""
    task = visible_tasks(user=user).select_related("owner").filter(pk=task_id).first()
    if task is None:
        raise NotFound(f"Task {task_id} does not exist.")
    return task


def task_turns(*, task: Task) -> QuerySet[Subtask]:
    """The task's turns in message_id order."""
    return Subtask.objects.filter(task_id=task.pk).order_by("message_id")
