"""Services that write tasks and turns.

Each service runs in one transaction: either every turn of a request is stored or none is, so a
rejected follow-up never leaves a half-written round behind. The services that may spill text to
an artifact open it with `atomic_storing_artifacts()`, so a rollback leaves no stored file
behind either.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Case, Q, When
from django.utils import timezone

from backend import sql
from backend.artifacts.services import (
    atomic_storing_artifacts,
    locked_stored_artifact,
    restore_artifact_file,
    store_artifact,
)
from backend.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge, UploadMissing
from backend.events import log_event
from backend.prompting import ContextPassing, Role
from backend.prompting.inputs import validate_name
from backend.prompting.kinds import classify_text
from backend.tasks import task_events
from backend.tasks.fields import LONE_SURROGATE
from backend.tasks.ingestion import (
    IngestedText,
    ingest_stored_text,
    ingest_text,
    replace_unstorable_chars,
)
from backend.tasks.models import (
    ACTIVE_SUBTASK_STATUSES,
    TURNS,
    Bot,
    ExecutorKind,
    FollowUpStrategy,
    NativeSession,
    QueuedMessage,
    QueuedMessageStatus,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    Task,
    TaskStatus,
    task_type_validator,
)
from backend.tasks.transcripts import (
    TranscriptRequest,
    may_be_in_parts,
    store_transcripts,
    transcripts_for,
)
from backend.tasks.turn_events import (
    announce_ended_turns,
)
from backend.tasks.wakeups import announce_pending


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


def check_text_size(*, text: str, limit: int, field: str) -> None:
    """PayloadTooLarge naming `field` when `text` is over `limit` bytes of UTF-8.

    Measures in 1 MiB slices, so a 50 MB result is never encoded as a whole copy; text that
    cannot reach the limit (4 bytes per code point at most) is not encoded at all.
    """
    if len(text) * 4 <= limit:
        return
    size = 0
    for start in range(0, len(text), 1 << 20):
        size += len(text[start : start + (1 << 20)].encode("utf-8", "surrogatepass"))
    if size > limit:
        raise PayloadTooLarge(
            f"{field} is {size} bytes of UTF-8; the limit is {limit} bytes.", field=field
        )


def validate_message_text(*, text: str, field: str = "message") -> None:
    """Reject text Baton cannot store losslessly or that is above the hard size limit."""
    if not text.strip():
        raise InvalidInput(f"{field} must not be empty.", field=field)
    if "\x00" in text:
        raise InvalidInput(f"{field} must not contain NUL characters.", field=field)
    surrogate = LONE_SURROGATE.search(text)
    if surrogate is not None:
        raise InvalidInput(
            f"{field} is not valid Unicode (lone surrogate at position {surrogate.start()}).",
            field=field,
        )
    check_text_size(text=text, limit=settings.BATON_MAX_MESSAGE_BYTES, field=field)


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
        if step.executor is not None and step.executor not in ExecutorKind.values:
            raise InvalidInput(
                f"executor {step.executor!r} is not one of {', '.join(ExecutorKind.values)}.",
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


def allocate_message_ids(*, task_id: int, count: int) -> int:
    """Reserve `count` consecutive message_ids on the task and return the first.

    Must run inside a transaction. The UPDATE takes the task row's write lock (PostgreSQL) or
    the database write lock (SQLite), so concurrent callers serialize here and each gets its own
    range; the lock is held until the caller's transaction ends, which also makes the caller's
    later checks of the task's turns consistent.
    """
    with connection.cursor() as cursor:
        # Every message and every task runs it: one statement, written out (see `backend.sql`).
        cursor.execute(
            f"UPDATE {Task._meta.db_table} SET next_message_id = next_message_id + %s, "  # noqa: S608
            "updated_at = %s WHERE id = %s RETURNING next_message_id",
            [count, sql.when(timezone.now()), task_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"Task {task_id} does not exist.")
    return int(row[0]) - count


def lock_task(*, task_id: int) -> Task:
    """Fetch the task with its row locked until the surrounding transaction ends.

    PostgreSQL takes a row lock (SELECT ... FOR UPDATE). SQLite has no row locks, but Baton's
    SQLite connections begin every transaction IMMEDIATE, which already holds the database
    write lock, so writers are serialized there too.
    """
    task = Task.objects.select_for_update().filter(pk=task_id).first()
    if task is None:
        raise NotFound(f"Task {task_id} does not exist.")
    return task


def _create_round(*, task: Task, message: str, sender: str) -> list[Subtask]:
    """Store a USER turn and one PENDING ASSISTANT turn per pipeline step."""
    steps = task.pipeline
    first_id = allocate_message_ids(task_id=task.pk, count=1 + len(steps))
    now = timezone.now()
    session_workers = dict(
        ((bot, executor), worker_id)
        for bot, executor, worker_id in NativeSession.objects.filter(task_id=task.pk).values_list(
            "bot", "executor", "worker_id"
        )
    )
    user_turn = Subtask(
        task=task,
        message_id=first_id,
        role=Role.USER,
        status=SubtaskStatus.COMPLETED,
        sender=sender,
        message=message,
        created_at=now,
        finished_at=now,
    )
    _apply_ingestion(user_turn, ingest_text(text=message, task=task), recorded_at=now)
    turns = [user_turn]
    for index, step in enumerate(steps):
        turns.append(
            Subtask(
                task=task,
                message_id=first_id + 1 + index,
                parent_message_id=first_id,
                role=Role.ASSISTANT,
                status=SubtaskStatus.PENDING,
                bot=step["bot"],
                pipeline_step=index,
                executor=step["executor"],
                context_passing=step["context_passing"] or "",
                # Only the first step is dispatchable now; each later step becomes eligible
                # when the step before it completes.
                pending_since=now if index == 0 else None,
                created_at=now,
                session_worker=session_workers.get((step["bot"], step["executor"]), ""),
            )
        )
    Subtask.objects.bulk_create(turns)
    task_events.record(
        task_id=task.pk,
        events=[task_events.turn_event(task_events.TURN_CREATED, turn) for turn in turns],
    )
    announce_pending(executors=[steps[0]["executor"]] if steps else [])
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.PENDING, updated_at=now)
    task.status = TaskStatus.PENDING
    return turns


def _validate_label_name(*, value: str, field: str) -> None:
    """Sender and bot names appear inside prompt role labels (`User[alice]:`)."""
    try:
        validate_name(value)
    except ValueError as error:
        raise InvalidInput(f"{field} {error}.", field=field) from None


def _validate_sender(*, is_group_chat: bool, sender: str) -> None:
    if is_group_chat and not sender.strip():
        raise InvalidInput("sender is required in a group-chat task.", field="sender")
    if sender:
        _validate_label_name(value=sender, field="sender")


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


@dataclass(frozen=True)
class FollowUp:
    """What a follow-up did: the round it started now (`turns`: its USER turn and PENDING
    answers), or the queue entry it waits in (`queued`); and the turns it stopped to start now
    (`stopped`: interrupted or rolled back)."""

    strategy: str
    turns: list[Subtask]
    queued: QueuedMessage | None = None
    stopped: tuple[Subtask, ...] = ()


def _validate_strategy(value: str, *, field: str, allow_empty: bool = False) -> None:
    if value not in FollowUpStrategy.values and not (allow_empty and value == ""):
        raise InvalidInput(
            f"{field} must be one of {', '.join(FollowUpStrategy.values)}.", field=field
        )


def follow_up_strategy(*, task: Task, strategy: str | None = None) -> str:
    """The strategy a follow-up applies: its own, else its task's, else the setting."""
    return strategy or task.follow_up_strategy or settings.BATON_FOLLOW_UP_STRATEGY


def append_message(*, task: Task, message: str, sender: str = "") -> list[Subtask]:
    """A follow-up that starts its round now or not at all (the `reject` strategy): a
    COMPLETED USER turn plus one PENDING ASSISTANT turn per step. See `send_message`."""
    return send_message(
        task=task, message=message, sender=sender, strategy=FollowUpStrategy.REJECT
    ).turns


def recorded_sender(*, task: Task, author: User, sender: str) -> str:
    """The sender a follow-up by `author` is stored with (its turn's and its queued message's).

    The task's owner, the product, names its own senders. An operator writing into another
    account's task is recorded as themself, by username, so that nothing an operator writes
    can pass for the owner's words (the owner's own carry the sender the product gave, often
    none); naming any other sender is refused.
    """
    if task.owner_id == author.pk:
        return sender
    operator = author.get_username()
    if sender not in ("", operator):
        raise InvalidInput(
            "A message written into another account's task is recorded as its author's: "
            f"sender must be empty or {operator!r}.",
            field="sender",
        )
    return operator


def send_message(
    *, task: Task, message: str, sender: str = "", strategy: str | None = None
) -> FollowUp:
    """Send a follow-up: when no turn of the task is PENDING or RUNNING (a summary job is not
    a turn), a new round starts now, whatever the strategy. Otherwise the strategy decides
    (`follow_up_strategy`):

    * `reject`: Conflict, nothing stored.
    * `enqueue`: stored as a `QueuedMessage`; its round starts when every turn before it has
      finished (`start_next_queued`), queued messages in the order they arrived.
    * `interrupt`: the running turn stops as INTERRUPTED and stays in the history with what it
      had written; the round's turns that had not started are cancelled; the round starts now.
    * `rollback`: the round's active turns are cancelled (a cancelled turn is no part of the
      history) and the round starts now.

    Messages already queued stay queued behind a round started by `interrupt` or `rollback`.
    Everything runs under the task's lock, so concurrent follow-ups are applied one at a time,
    in the order they take it, and a refused one stores nothing. A cancelled task takes none.
    """
    validate_message_text(text=message)
    _validate_sender(is_group_chat=task.is_group_chat, sender=sender)
    if strategy is not None:
        _validate_strategy(strategy, field="strategy")
    with atomic_storing_artifacts():
        task = lock_task(task_id=task.pk)
        chosen = follow_up_strategy(task=task, strategy=strategy)
        if task.status == TaskStatus.CANCELLED:
            raise Conflict(f"Task {task.pk} is cancelled; it takes no more messages.")
        active = list(
            task.subtasks.filter(TURNS, status__in=ACTIVE_SUBTASK_STATUSES).order_by("message_id")
        )
        if not active:
            return FollowUp(
                strategy=chosen, turns=_create_round(task=task, message=message, sender=sender)
            )
        if chosen == FollowUpStrategy.REJECT:
            raise Conflict(
                f"Task {task.pk} has a turn {active[0].status} (message_id "
                f"{active[0].message_id}); send the follow-up when it has finished, cancel "
                "the turn, or send it with strategy enqueue, interrupt or rollback."
            )
        if chosen == FollowUpStrategy.ENQUEUE:
            queued = _enqueue(task=task, message=message, sender=sender)
            return FollowUp(strategy=chosen, turns=[], queued=queued)
        stopped = _stop_turns(
            task=task, turns=active, interrupt=chosen == FollowUpStrategy.INTERRUPT
        )
        turns = _create_round(task=task, message=message, sender=sender)
        return FollowUp(strategy=chosen, turns=turns, stopped=tuple(stopped))


def _enqueue(*, task: Task, message: str, sender: str) -> QueuedMessage:
    waiting = task.queued_messages.filter(status=QueuedMessageStatus.QUEUED).count()
    if waiting >= settings.BATON_MAX_QUEUED_MESSAGES:
        raise Conflict(
            f"Task {task.pk} already has {waiting} queued messages (the most "
            f"BATON_MAX_QUEUED_MESSAGES allows); wait for them to be sent, or withdraw one."
        )
    queued = QueuedMessage.objects.create(task=task, message=message, sender=sender)
    task_events.record(
        task_id=task.pk,
        events=[task_events.Event(task_events.MESSAGE_QUEUED, data=_queued_data(queued))],
    )
    # The task's status stays that of its running round; its updated_at says it changed.
    Task.objects.filter(pk=task.pk).update(updated_at=queued.created_at)
    return queued


def _stop_confirmed_at(turn: Subtask, *, now: Any) -> Any:
    """For a turn being stopped: None while a worker may be running it (its worker confirms
    the stop, `backend.dispatch.reports.confirm_stopped`), else `now` — nothing ran."""
    return None if turn.status == SubtaskStatus.RUNNING else now


def _queued_data(queued: QueuedMessage) -> dict[str, Any]:
    return {"queued_id": queued.pk, "status": queued.status, "sender": queued.sender}


INTERRUPTED_NOTE = "Interrupted by the next message before it finished."


def interrupted_history_text(partial_text: str) -> str:
    """What an interrupted turn shows the model: that it was stopped, and what it had written
    (its streamed partial answer) — the work it did may show in the workspace."""
    if not partial_text.strip():
        return f"{INTERRUPTED_NOTE} It had not written any text yet."
    return f"{INTERRUPTED_NOTE} What it had written by then:\n\n{partial_text}"


def _stop_turns(*, task: Task, turns: list[Subtask], interrupt: bool) -> list[Subtask]:
    """Stop a round's active turns for a follow-up that starts now. `interrupt`: a RUNNING
    turn becomes INTERRUPTED and keeps what it wrote in the history; every other one (and
    every one on a rollback) is CANCELLED. The worker holding a stopped turn is told to stop
    its executor by its next heartbeat, and a late result from it is refused."""
    now = timezone.now()
    code = "interrupted" if interrupt else "rolled_back"
    for turn in turns:
        turn.stop_confirmed_at = _stop_confirmed_at(turn, now=now)
        if interrupt and turn.status == SubtaskStatus.RUNNING:
            turn.status = SubtaskStatus.INTERRUPTED
            turn.error = INTERRUPTED_NOTE
            text = interrupted_history_text(turn.partial_text)
            _apply_ingestion(turn, ingest_text(text=text, task=task), recorded_at=now)
        else:
            turn.status = SubtaskStatus.CANCELLED
        turn.error_code = code
        turn.lease_expires_at = None
        turn.not_before = None
        turn.finished_at = now
        turn.save()
    task_events.record(task_id=task.pk, events=[task_events.finished_event(t) for t in turns])
    announce_ended_turns(task=task, turns=turns, occurred_at=now)
    return turns


def cancel_task(*, task: Task) -> Task:
    """Cancel the task, every turn still PENDING or RUNNING and every queued message.
    Cancelling twice is a no-op."""
    with transaction.atomic():
        task = lock_task(task_id=task.pk)
        if task.status == TaskStatus.CANCELLED:
            return task
        now = timezone.now()
        stopped = list(
            task.subtasks.filter(TURNS, status__in=ACTIVE_SUBTASK_STATUSES).order_by("message_id")
        )
        task.subtasks.filter(status__in=ACTIVE_SUBTASK_STATUSES).update(
            status=SubtaskStatus.CANCELLED,
            error_code="cancelled",
            lease_expires_at=None,
            not_before=None,
            finished_at=now,
            updated_at=now,
            stop_confirmed_at=Case(When(status=SubtaskStatus.RUNNING, then=None), default=now),
        )
        task.queued_messages.filter(status=QueuedMessageStatus.QUEUED).update(
            status=QueuedMessageStatus.CANCELLED, cancelled_at=now
        )
        for turn in stopped:
            turn.status, turn.error_code = SubtaskStatus.CANCELLED, "cancelled"
        task_events.record(
            task_id=task.pk, events=[task_events.finished_event(turn) for turn in stopped]
        )
        task.status = TaskStatus.CANCELLED
        task.save(update_fields=["status", "updated_at"])
        announce_ended_turns(task=task, turns=stopped, occurred_at=now)
    return task


def cancel_turn(*, task: Task, subtask_id: int) -> list[Subtask]:
    """Stop one PENDING or RUNNING assistant turn ("stop generating"); the task stays open.

    The later pipeline steps of the same round are cancelled with it (they would have had
    nothing to build on). A worker running the turn learns it from its next heartbeat or
    progress report (HTTP 409 with code `cancelled`) and stops the executor. The next queued
    message, if any, then starts its round (`refresh_task_status`). Returns the turns
    cancelled, in message order.
    """
    with atomic_storing_artifacts():
        task = lock_task(task_id=task.pk)
        subtask = (
            Subtask.objects.select_for_update()
            .filter(TURNS, pk=subtask_id, task_id=task.pk, role=Role.ASSISTANT)
            .first()
        )
        if subtask is None:
            raise NotFound(f"Task {task.pk} has no assistant turn {subtask_id}.")
        if subtask.status not in ACTIVE_SUBTASK_STATUSES:
            raise Conflict(
                f"Turn {subtask_id} is already {subtask.status}; only pending or running "
                "turns can be cancelled."
            )
        turns = list(
            Subtask.objects.select_for_update()
            .filter(
                task_id=task.pk,
                parent_message_id=subtask.parent_message_id,
                role=Role.ASSISTANT,
                status__in=ACTIVE_SUBTASK_STATUSES,
                pipeline_step__gte=subtask.pipeline_step or 0,
            )
            .order_by("message_id")
        )
        now = timezone.now()
        for turn in turns:
            turn.stop_confirmed_at = _stop_confirmed_at(turn, now=now)
            turn.status = SubtaskStatus.CANCELLED
            turn.error_code = "cancelled"
            turn.lease_expires_at = None
            turn.not_before = None
            turn.finished_at = now
        Subtask.objects.bulk_update(
            turns,
            [
                "status",
                "error_code",
                "lease_expires_at",
                "not_before",
                "finished_at",
                "stop_confirmed_at",
            ],
        )
        Subtask.objects.filter(pk__in=[turn.pk for turn in turns]).update(updated_at=now)
        task_events.record(
            task_id=task.pk, events=[task_events.finished_event(turn) for turn in turns]
        )
        refresh_task_status(task=task)
        announce_ended_turns(task=task, turns=turns, occurred_at=now)
    return turns


def _ingestion_fields(ingested: IngestedText, *, recorded_at: Any) -> dict[str, Any]:
    """The turn's columns that ingestion fills in, by name."""
    return {
        "history_text": ingested.history_text,
        "history_text_tokens": ingested.history_text_tokens,
        "history_text_tokens_o200k": ingested.history_text_tokens_o200k,
        "preview_head": ingested.preview_head,
        "preview_tail": ingested.preview_tail,
        "preview_layout": ingested.preview_layout,
        "history_chars": ingested.chars,
        "history_bytes": ingested.bytes,
        "history_lines": ingested.lines,
        "history_tokens": ingested.tokens,
        "history_tokens_estimated": ingested.tokens_estimated,
        "history_replaced_chars": ingested.replaced_chars,
        "artifact": ingested.artifact,
        "history_is_preview": ingested.artifact is not None,
        "recorded_at": recorded_at,
    }


def _apply_ingestion(subtask: Subtask, ingested: IngestedText, *, recorded_at: Any) -> list[str]:
    """Set the turn's ingestion columns; return their names."""
    fields = _ingestion_fields(ingested, recorded_at=recorded_at)
    for name, value in fields.items():
        setattr(subtask, name, value)
    return list(fields)


# The other columns a result sets (`record_result`); nothing else of the row is written.
_RESULT_FIELDS = (
    "status",
    "result",
    "result_value_in_artifact",
    "error",
    "error_code",
    "usage",
    "native_session_id",
    "lease_expires_at",
    "finished_at",
    "updated_at",
)


def canonical_json(value: Any) -> str:
    """Results without a `value` appear in history as this: sorted keys, UTF-8, compact."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def history_text_for_result(
    *, status: str, result: dict[str, Any] | None, error: str
) -> tuple[str, bool]:
    """The text an ASSISTANT turn contributes to history, and whether it is serialized JSON.

    `result.value` when it is a string; a `value` of any other JSON type (a number, a list, an
    object) as its canonical JSON; without a `value` (absent or null), the whole result as
    canonical JSON. A FAILED turn contributes its error message.
    """
    if status == SubtaskStatus.FAILED:
        return error, False
    if result is None:
        return "", False
    value = result.get("value")
    if isinstance(value, str):
        return value, False
    if value is not None:
        return canonical_json(value), True
    return canonical_json(result), True


def _validate_result_payload(*, status: str, result: Any, error: str, usage: Any) -> None:
    if status not in (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED):
        raise InvalidInput("status must be COMPLETED or FAILED.", field="status")
    if result is not None and not isinstance(result, dict):
        raise InvalidInput(
            f"result must be a JSON object, not {type(result).__name__}.", field="result"
        )
    if status == SubtaskStatus.COMPLETED and result is None:
        raise InvalidInput("result is required when status is COMPLETED.", field="result")
    if status == SubtaskStatus.FAILED and not error.strip():
        raise InvalidInput("error is required when status is FAILED.", field="error")
    if usage is not None and not isinstance(usage, dict):
        raise InvalidInput("usage must be a JSON object.", field="usage")


def result_with_uploaded_value(*, status: str, result: Any) -> dict[str, Any]:
    """The result a report that names a value upload records, its `value` still null: `result`
    holds every other key, its `value` null or absent (an absent or null result: none).
    InvalidInput when the report cannot name an upload."""
    if status != SubtaskStatus.COMPLETED:
        raise InvalidInput("value_upload goes with status COMPLETED only.", field="value_upload")
    if result is None:
        result = {}
    if not isinstance(result, dict):
        raise InvalidInput(
            f"result must be a JSON object, not {type(result).__name__}.", field="result"
        )
    if result.get("value") is not None:
        raise InvalidInput(
            "result.value must be null or absent when value_upload names the value.",
            field="result",
        )
    return {"value": None, **{key: item for key, item in result.items() if key != "value"}}


def record_result(
    *,
    subtask: Subtask,
    status: str,
    result: dict[str, Any] | None = None,
    error: str = "",
    error_code: str = "",
    usage: dict[str, Any] | None = None,
    native_session_id: str = "",
    value_upload: str = "",
    locked: Task | None = None,
) -> Subtask:
    """Record an ASSISTANT turn's outcome and, for pipelines, make the next step dispatchable.

    A failed step fails the steps after it (they would have nothing to build on). A summary
    job's outcome is recorded the same way, and then `_finish_summary` applies.

    `value_upload` is the sha256 of a result value the worker uploaded as a stream (stored by
    `ingestion.store_uploaded_text`): the turn is recorded exactly as if `result.value` were
    that text (see `result_with_uploaded_value`), and the text is never held whole
    (`ingestion.ingest_stored_text`). UploadMissing when Baton does not hold it whole.

    `locked` is the task when the caller's transaction already holds its lock and read
    `subtask` under it (a worker's report does): nothing is locked or read again then.
    """
    if subtask.role != Role.ASSISTANT:
        raise InvalidInput("Only ASSISTANT turns have results.", field="subtask")
    if value_upload:
        result = result_with_uploaded_value(status=status, result=result)
    _validate_result_payload(status=status, result=result, error=error, usage=usage)
    # An uploaded value is measured where it is stored, under the lock (see below).
    text, serialized_json = (
        ("", False)
        if value_upload
        else history_text_for_result(status=status, result=result, error=error)
    )
    check_text_size(text=text, limit=settings.BATON_MAX_RESULT_BYTES, field="result")
    with atomic_storing_artifacts() if locked is None else nullcontext():
        if locked is None:
            task = lock_task(task_id=subtask.task_id)
            subtask.refresh_from_db()
        else:
            task = locked
        if subtask.status not in ACTIVE_SUBTASK_STATUSES:
            raise Conflict(
                f"Turn {subtask.message_id} of task {task.pk} is already {subtask.status}."
            )
        now = timezone.now()
        if value_upload:
            assert result is not None  # result_with_uploaded_value made one
            ingested = _ingest_uploaded_value(sha256=value_upload, task=task)
            if ingested.artifact is None:
                # Short enough to stay in the row, as the same value reported inline does.
                result = {**result, "value": ingested.history_text}
        else:
            ingested = ingest_text(text=text, task=task, serialized_json=serialized_json)
        ingested_fields = _apply_ingestion(subtask, ingested, recorded_at=now)
        subtask.status = status
        subtask.result = result
        subtask.result_value_in_artifact = False
        if (
            ingested.artifact is not None
            and ingested.replaced_chars == 0
            and not serialized_json
            and status == SubtaskStatus.COMPLETED
        ):
            # The artifact holds exactly result["value"]; keep the row small.
            assert result is not None  # a COMPLETED report has one (validated above)
            subtask.result = {key: None if key == "value" else item for key, item in result.items()}
            subtask.result_value_in_artifact = True
        # PostgreSQL text cannot hold NUL or lone surrogates; an error message is diagnostic
        # text, so those characters are shown as U+FFFD there.
        subtask.error = replace_unstorable_chars(error)[0]
        subtask.error_code = error_code if status == SubtaskStatus.FAILED else ""
        subtask.usage = usage
        subtask.native_session_id = native_session_id
        # claimed_by and lease_owner stay: they name who delivered this result.
        subtask.lease_expires_at = None
        subtask.finished_at = now
        if subtask.kind == SubtaskKind.SUMMARY:
            _finish_summary(subtask=subtask, task=task)
            return subtask
        # Every result report writes it: the statement is written out (see `backend.sql`).
        sql.update(subtask, [*ingested_fields, *_RESULT_FIELDS])
        finished = [subtask, *_advance_pipeline(subtask=subtask, task=task, now=now)]
        task_events.record(
            task_id=task.pk, events=[task_events.finished_event(turn) for turn in finished]
        )
        status_now = refresh_task_status(task=task)
        announce_ended_turns(task=task, turns=finished, occurred_at=now)
        if (
            task.transcript_id is not None
            and status_now in IDLE_TASK_STATUSES
            and may_be_in_parts(turns=task.next_message_id - 1)
        ):
            # The next message's dispatch points to this history: store it now (see
            # `store_next_transcript`), once the result is committed.
            transaction.on_commit(lambda: store_next_transcript(task=task))
    return subtask


# The statuses of a task whose every turn has finished: the next turn answers a new message.
IDLE_TASK_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED})


def store_next_transcript(*, task: Task) -> None:
    """Store the transcript (and turn index and turn files) that the dispatch of the task's
    next message will point to, as its current one: that dispatch then finds it stored and
    lists it without writing (`transcripts.store_transcripts`), so the latency between a
    message and its prompt does not pay for the history's files. Only for a task whose
    history a prompt has left out already (it has a transcript) and that may have sealed
    parts (a transcript rendered whole is stored by its dispatch again); a failure is logged
    and costs nothing else: the dispatch stores what it needs itself."""
    request = TranscriptRequest(
        task_id=task.pk,
        is_group_chat=task.is_group_chat,
        multi_bot=task.is_multi_bot,
        before_message_id=task.next_message_id,
    )
    try:
        store_transcripts(
            transcripts_for([request]),
            current={task.pk: (task.transcript_id, task.turn_index_id)},
        )
    except Exception as error:  # noqa: BLE001 - the result is recorded; the dispatch stores it
        log_event(
            "transcript_store_failed",
            level=logging.WARNING,
            task=task.pk,
            error_type=type(error).__name__,
        )


def _advance_pipeline(*, subtask: Subtask, task: Task, now: datetime) -> list[Subtask]:
    """After a pipeline step's result: a completed step makes the next one dispatchable; a
    failed one fails the steps after it, which it returns (they never ran)."""
    if subtask.pipeline_step is not None and subtask.pipeline_step + 1 >= len(task.pipeline):
        return []  # a pipeline is fixed when its task is created: nothing follows its last step
    later_steps = Subtask.objects.filter(
        task_id=task.pk,
        parent_message_id=subtask.parent_message_id,
        role=Role.ASSISTANT,
        status=SubtaskStatus.PENDING,
        pipeline_step__gt=subtask.pipeline_step,
    ).order_by("pipeline_step")
    if subtask.status == SubtaskStatus.COMPLETED:
        next_step = later_steps.first()
        if next_step is not None:
            next_step.pending_since = now
            next_step.save(update_fields=["pending_since", "updated_at"])
            announce_pending(executors=[next_step.executor])
        return []
    # The steps that never ran show the model why, like any failed turn.
    reason = f"Not run: pipeline step {subtask.pipeline_step} ({subtask.bot}) failed."
    not_run = list(later_steps)
    later_steps.update(
        status=SubtaskStatus.FAILED,
        error=reason,
        finished_at=now,
        updated_at=now,
        **_ingestion_fields(ingest_text(text=reason, task=task), recorded_at=now),
    )
    for turn in not_run:
        turn.status = SubtaskStatus.FAILED
    return not_run


def _ingest_uploaded_value(*, sha256: str, task: Task) -> IngestedText:
    """Ingest the uploaded value stored under `sha256`, its artifact row locked (in the
    caller's transaction) and its stored copy checked whole first."""
    artifact = locked_stored_artifact(sha256=sha256)
    if artifact is None:
        raise UploadMissing(
            f"value_upload {sha256[:16]}… names no value Baton holds whole (removed since it "
            "was uploaded, or its stored copy is damaged); upload the value again.",
            field="value_upload",
        )
    limit = settings.BATON_MAX_RESULT_BYTES
    if artifact.size_bytes > limit:
        raise PayloadTooLarge(
            f"result is {artifact.size_bytes} bytes of UTF-8; the limit is {limit} bytes.",
            field="result",
        )
    return ingest_stored_text(artifact=artifact, task=task)


def _finish_summary(*, subtask: Subtask, task: Task) -> None:
    """Store a summary job's outcome: a completed summary is stored as an artifact (whatever
    its length: prompts point to it when they cut it) and becomes the task's summary when it
    covers more than the one prompts show now. A failed job changes nothing else; the next
    dispatch that omits enough turns schedules another."""
    summary = subtask.history_text
    if subtask.status == SubtaskStatus.COMPLETED and subtask.artifact is None and summary:
        subtask.artifact = store_artifact(
            text=summary, kind=classify_text(summary), task_id=task.pk
        )
    subtask.save()
    if subtask.status != SubtaskStatus.COMPLETED or not summary.strip():
        return
    assert subtask.summary_last_message_id is not None  # a summary job covers a range
    Task.objects.filter(pk=task.pk).filter(
        Q(summary__isnull=True)
        | Q(summary__summary_last_message_id__lt=subtask.summary_last_message_id)
    ).update(summary=subtask)
    log_event(
        "summary_recorded",
        task=task.pk,
        subtask=subtask.pk,
        first_message_id=subtask.summary_first_message_id,
        last_message_id=subtask.summary_last_message_id,
        chars=subtask.history_chars,
        tokens=subtask.history_tokens,
    )


def restore_spilled_text(
    *, subtask: Subtask, status: str, result: dict[str, Any] | None, error: str
) -> bool:
    """Store the turn's spilled text again from a report that repeats the recorded one.

    The artifact's stored copy is checked against its sha256 and written anew only when it is
    missing or damaged (`artifacts.services.restore_artifact_file`); an intact copy is left as
    it is. Only the artifact's own content is ever written: a text with another sha256 (which a
    true repeat never has) is left alone. Returns whether the copy was written.
    """
    artifact = subtask.artifact
    if not subtask.history_is_preview or artifact is None:
        return False
    text = replace_unstorable_chars(
        history_text_for_result(status=status, result=result, error=error)[0]
    )[0]
    written = restore_artifact_file(artifact=artifact, text=text)
    if written:
        log_event(
            "artifact_restored",
            level=logging.WARNING,
            task=subtask.task_id,
            subtask=subtask.pk,
            artifact=artifact.pk,
        )
    return written


def refresh_task_status(*, task: Task) -> str:
    """Recompute the task's status from its latest round of turns and store it; when that
    round has finished and a message is queued, start the queued message's round first.
    Runs under the task's lock, after every change that can finish a turn."""
    if task.status == TaskStatus.CANCELLED:
        return task.status
    statuses, queued = _latest_round_statuses(task=task)
    if queued and not statuses & set(ACTIVE_SUBTASK_STATUSES) and start_next_queued(task=task):
        statuses = {SubtaskStatus.PENDING}
    if SubtaskStatus.RUNNING in statuses:
        status = TaskStatus.RUNNING
    elif SubtaskStatus.PENDING in statuses:
        status = TaskStatus.PENDING
    elif SubtaskStatus.FAILED in statuses:
        status = TaskStatus.FAILED
    else:
        status = TaskStatus.COMPLETED
    if status != task.status:
        task.status, task.updated_at = status, timezone.now()
        with connection.cursor() as cursor:
            # Every result report runs it: its SQL is written out (see `backend.sql`).
            cursor.execute(
                f"UPDATE {Task._meta.db_table} SET status = %s, updated_at = %s "  # noqa: S608
                "WHERE id = %s",
                [str(status), sql.when(task.updated_at), task.pk],
            )
    return status


def _latest_round_statuses(*, task: Task) -> tuple[set[str], bool]:
    """The statuses of the turns answering the task's latest USER message, and whether a
    message is queued, in one statement (every result report asks: its SQL is written out, see
    `backend.sql`)."""
    table, queue = Subtask._meta.db_table, QueuedMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT status, 0 FROM {table} WHERE task_id = %s "  # noqa: S608
            f"AND role = %s AND parent_message_id = (SELECT message_id FROM {table} "
            "WHERE task_id = %s AND role = %s ORDER BY message_id DESC LIMIT 1) "
            f"UNION ALL SELECT '', 1 WHERE EXISTS (SELECT 1 FROM {queue} WHERE task_id = %s "
            "AND status = %s)",
            [
                task.pk,
                Role.ASSISTANT.value,
                task.pk,
                Role.USER.value,
                task.pk,
                QueuedMessageStatus.QUEUED.value,
            ],
        )
        rows = cursor.fetchall()
    return {status for status, marker in rows if not marker}, any(marker for _, marker in rows)


def start_next_queued(*, task: Task) -> list[Subtask]:
    """Start the round of the task's oldest queued message (its message_ids are allocated
    now, after every turn before it); none when nothing is queued. The caller holds the task's
    lock and has checked that no turn of the task is active."""
    found = sql.rows_of(
        QueuedMessage,
        f"SELECT {sql.columns(QueuedMessage)} FROM {QueuedMessage._meta.db_table} "  # noqa: S608
        "WHERE task_id = %s AND status = %s ORDER BY id LIMIT 1",
        [task.pk, QueuedMessageStatus.QUEUED.value],
    )
    if not found:
        return []
    queued = found[0]
    turns = _create_round(task=task, message=queued.message, sender=queued.sender)
    queued.status = QueuedMessageStatus.SENT
    queued.subtask = turns[0]
    queued.sent_at = turns[0].created_at
    queued.save(update_fields=["status", "subtask", "sent_at"])
    return turns


def withdraw_queued_message(*, task: Task, queued_id: int) -> QueuedMessage:
    """Take a queued message out of the queue before its round starts (it stays, CANCELLED).
    Conflict once it was sent or withdrawn; NotFound when the task has no such message."""
    with transaction.atomic():
        task = lock_task(task_id=task.pk)
        queued = task.queued_messages.filter(pk=queued_id).first()
        if queued is None:
            raise NotFound(f"Task {task.pk} has no queued message {queued_id}.")
        if queued.status != QueuedMessageStatus.QUEUED:
            raise Conflict(
                f"Queued message {queued_id} was already {queued.status}; only a message "
                "still waiting can be withdrawn."
            )
        queued.status = QueuedMessageStatus.CANCELLED
        queued.cancelled_at = timezone.now()
        queued.save(update_fields=["status", "cancelled_at"])
        Task.objects.filter(pk=task.pk).update(updated_at=queued.cancelled_at)
        task_events.record(
            task_id=task.pk,
            events=[task_events.Event(task_events.MESSAGE_WITHDRAWN, data=_queued_data(queued))],
        )
    return queued
