"""Selectors that read tasks and turns, scoped to what the caller may see."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Case, F, Q, QuerySet, TextField, Value, When

from backend.artifacts.models import Artifact
from backend.artifacts.storage import verified_chunks
from backend.configuration_cache import CONFIGURATION
from backend.errors import NotFound
from backend.model_permissions import VIEW, operator_may
from backend.prompting import Role
from backend.prompting.addressing import content_sha256
from backend.tasks.fields import LosslessJSONField
from backend.tasks.models import (
    TURNS,
    Bot,
    QueuedMessage,
    QueuedMessageStatus,
    Subtask,
    SubtaskStatus,
    Task,
)


def visible_tasks(*, user: User) -> QuerySet[Task]:
    """Tasks the user may read: their own, and every account's for an operator with the view
    (or change) permission on tasks, as the admin shows them (`backend.model_permissions`).
    Whether the user may change a task they see is the API's permission classes' question."""
    tasks = Task.objects.all()
    if not operator_may(user, VIEW, Task):
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


def get_own_task(*, user: User, task_id: int) -> Task:
    """The user's own task with this id, or NotFound (staff included: seeing a task is not
    owning it)."""
    task = Task.objects.filter(pk=task_id, owner=user).first()
    if task is None:
        raise NotFound(f"Task {task_id} does not exist.")
    return task


# Where a spilled text stood in its turn (see `spilled_place`).
SPILLED_MESSAGE, SPILLED_ERROR = "message", "error"
SPILLED_VALUE, SPILLED_RESULT = "result.value", "result"

# The turns whose column holds a text that spilled: views show its preview instead.
_SPILLED_MESSAGE = Q(history_is_preview=True, role=Role.USER)
_SPILLED_ERROR = Q(history_is_preview=True, role=Role.ASSISTANT, status=SubtaskStatus.FAILED)
_SPILLED_RESULT = Q(
    history_is_preview=True, role=Role.ASSISTANT, result_value_in_artifact=False
) & ~Q(status=SubtaskStatus.FAILED)


def spilled_place(subtask: Subtask) -> str | None:
    """Where the turn's text stood if it spilled to its artifact, else None.

    `message` for a USER turn, `error` for a FAILED turn; for a result, `result.value` when
    the artifact holds exactly its string `value` (the row keeps every other key, see
    `Subtask.result_value_in_artifact`), else `result`: a value that is not a string, a result
    without one, or a value with characters the artifact shows as U+FFFD, whose whole result
    stays in the row. Mirrors the conditions `task_turns` reads the columns by.
    """
    if not subtask.history_is_preview:
        return None
    if subtask.role == Role.USER:
        return SPILLED_MESSAGE
    if subtask.status == SubtaskStatus.FAILED:
        return SPILLED_ERROR
    return SPILLED_VALUE if subtask.result_value_in_artifact else SPILLED_RESULT


def _unless(spilled: Q, column: str, *, output_field: TextField[Any, Any]) -> Case:
    """The column, or empty where it holds a spilled text (which is then never read)."""
    empty = Value(None) if isinstance(output_field, LosslessJSONField) else Value("")
    return Case(When(spilled, then=empty), default=F(column), output_field=output_field)


def task_turns(*, task: Task) -> QuerySet[Subtask]:
    """The task's turns in message_id order, as the task views show them (one query). Summary
    jobs are not turns: they are left out.

    Views never read a spilled text, neither from its artifact nor from the row: `message`,
    `error` and `result` are deferred and come back as `shown_message`, `shown_error` and
    `shown_result`, empty (or None) where they hold the text that spilled (`spilled_place`);
    a spilled turn brings its stored preview (head, marker, tail) as `shown_preview` instead.
    A turn therefore costs the same bounded read whatever its text's size, and a damaged or
    missing artifact cannot hide it.
    """
    turns = (
        Subtask.objects.filter(TURNS, task_id=task.pk)
        .select_related("artifact")
        .defer(
            "message",
            "error",
            "result",
            "history_text",
            "preview_head",
            "preview_tail",
            "preview_layout",
        )
        .order_by("message_id")
    )
    # The model declares the shown_* names for its readers; the stubs see them as redefined.
    return turns.annotate(  # type: ignore[no-redef]
        shown_message=_unless(_SPILLED_MESSAGE, "message", output_field=TextField()),
        shown_error=_unless(_SPILLED_ERROR, "error", output_field=TextField()),
        shown_result=_unless(_SPILLED_RESULT, "result", output_field=LosslessJSONField()),
        shown_preview=Case(
            When(history_is_preview=True, then=F("history_text")),
            default=Value(""),
            output_field=TextField(),
        ),
    )


def spilled_text_artifact(*, task: Task, subtask_id: int) -> Artifact:
    """The artifact that holds the whole text of the task's turn `subtask_id` (one query).

    NotFound when the task has no such turn, or when the turn's text did not spill (the task
    views show it whole).
    """
    turn = (
        Subtask.objects.filter(TURNS, task_id=task.pk, pk=subtask_id)
        .select_related("artifact")
        .only("id", "task_id", "message_id", "history_is_preview", "artifact")
        .first()
    )
    if turn is None:
        raise NotFound(f"Task {task.pk} has no turn of subtask id {subtask_id}.")
    if not turn.history_is_preview or turn.artifact is None:
        raise NotFound(
            f"{turn.name_in_task.capitalize()}'s text did not spill: the turn shows it whole."
        )
    return turn.artifact


def turn_result(*, subtask: Subtask) -> dict[str, Any] | None:
    """The turn's result exactly as the executor sent it.

    Long values live in the turn's artifact (see `Subtask.result_value_in_artifact`); this
    reads them back, checked against the artifact's sha256 (ArtifactIntegrityError when the
    stored copy is missing or damaged). The task API never calls it: it shows a spilled
    value's preview and streams the whole text on request.
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


def is_recorded_result(*, subtask: Subtask, result: dict[str, Any] | None) -> bool:
    """Whether `result` equals the result recorded on the turn, without reading its artifact.

    A value kept in the artifact is compared by its size and sha256 with the artifact's, so a
    repeated report is recognised whatever state the stored copy is in (missing, damaged).
    """
    recorded: dict[str, Any] | None = subtask.result
    if not subtask.result_value_in_artifact or recorded is None or result is None:
        return recorded == result
    value = result.get("value")
    if not isinstance(value, str):
        return False
    if {key: None if key == "value" else item for key, item in result.items()} != recorded:
        return False
    artifact = subtask.artifact
    assert artifact is not None  # the value lives in the turn's artifact, which the turn protects
    return len(value) == artifact.size_chars and content_sha256(value) == artifact.sha256


def is_recorded_upload(*, subtask: Subtask, result: dict[str, Any], value_sha256: str) -> bool:
    """Whether `result` — a report's result whose value was uploaded, `value` null in it
    (`services.result_with_uploaded_value`) — with the uploaded value of sha256 `value_sha256`
    equals the result recorded on the turn. Like `is_recorded_result`, no stored text is read:
    a value kept in the artifact is compared by the artifact's sha256, one kept in the row by
    its own."""
    recorded: dict[str, Any] | None = subtask.result
    if recorded is None or {**recorded, "value": None} != result:
        return False
    if subtask.result_value_in_artifact:
        artifact = subtask.artifact
        assert artifact is not None  # the value lives in the turn's artifact
        return artifact.sha256 == value_sha256
    value = recorded.get("value")
    return isinstance(value, str) and content_sha256(value) == value_sha256


def bot_list() -> QuerySet[Bot]:
    return Bot.objects.order_by("name")


def get_bot(*, name: str) -> Bot:
    bot = Bot.objects.filter(name=name).first()
    if bot is None:
        raise NotFound(f"Bot {name!r} does not exist.")
    return bot


def bots_for_turns(
    subtasks: Sequence[Subtask], *, configuration_version: int | None = None
) -> dict[int, Bot]:
    """Per subtask id: its registered bot (one query, none when this process read the same
    bots under `configuration_version`, see `backend.configuration_cache`). Turns stored
    before the registry, or whose bot is gone, get their executor's default bot."""
    if not subtasks:
        return {}
    kinds = tuple(sorted({subtask.executor for subtask in subtasks}))
    names = tuple(sorted({subtask.bot for subtask in subtasks}))
    rows = CONFIGURATION.read(
        version=configuration_version,
        key=("bots", names, kinds),
        load=lambda: tuple(
            Bot.objects.filter(Q(name__in=names) | Q(is_default=True, executor__in=kinds))
        ),
    )
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


def queued_messages(*, task: Task) -> QuerySet[QueuedMessage]:
    """The task's follow-ups still waiting to be sent, in the order they will be."""
    return task.queued_messages.filter(status=QueuedMessageStatus.QUEUED).order_by("id")
