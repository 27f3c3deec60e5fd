"""Which rows a batch of prompts is built from: each request's window of history turns, its
history's totals by role, and its anchors (the user message answered, the previous pipeline
step, the pinned first user message, the task's latest summary).

PostgreSQL reads them in one statement (`history_selection` in `backend/queries/history.sql`);
SQLite runs the ORM's three queries (`_selected_by_orm`), which are also that statement's test
oracle. Neither reads a window turn's `message` (the whole text a user sent): its history text
is what a prompt shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Case, Count, F, Model, Q, RowRange, Sum, Value, When, Window
from django.db.models.functions import Least, Length, RowNumber

from backend import queries
from backend.artifacts.models import Artifact
from backend.prompting import Role
from backend.prompting.policy import PromptPolicy
from backend.queries.rows import instance_of
from backend.tasks import transcript_spans
from backend.tasks.history.rows import (
    FIRST_USER_MESSAGE_ID,
    HISTORY_FIELDS,
    HISTORY_STATUSES,
    STEERED_INTO_BOT,
    SUMMARY_FIELDS,
    with_steered_into_bot,
)
from backend.tasks.models import TURNS, Subtask, SubtaskKind, Task

WINDOW_FIELDS = (*HISTORY_FIELDS, "task_id")
ANCHOR_FIELDS = (*SUMMARY_FIELDS, "task_id", "message", "parent_message_id")


def any_of(conditions: list[Q]) -> Q:
    """The OR of `conditions` (matches nothing when there are none): one query per batch."""
    combined = Q(pk__in=[])
    for condition in conditions:
        combined |= condition
    return combined


@dataclass(frozen=True)
class HistoryRequest:
    """One ASSISTANT turn whose prompt is built, with its task and policy."""

    subtask: Subtask
    task: Task
    policy: PromptPolicy

    @property
    def current_id(self) -> int:
        parent_id = self.subtask.parent_message_id
        assert parent_id is not None  # prompts are built for ASSISTANT turns, which answer one
        return parent_id

    @property
    def previous_step_id(self) -> int | None:
        # Pipeline steps are numbered right after their user message.
        step = self.subtask.pipeline_step or 0
        return self.current_id + step if step > 0 else None

    @property
    def anchor_ids(self) -> list[int]:
        """The user message answered, the previous pipeline step, and the pinned first
        user message: fetched together."""
        ids = [self.current_id]
        if self.previous_step_id:
            ids.append(self.previous_step_id)
        if self.wants_history and self.policy.keep_first_user_message:
            ids.append(FIRST_USER_MESSAGE_ID)
        return ids

    @property
    def wants_history(self) -> bool:
        return self.policy.enabled and self.current_id > FIRST_USER_MESSAGE_ID

    @property
    def summary_id(self) -> int | None:
        """The task's latest summary, when the policy shows summaries."""
        if not (self.wants_history and self.policy.summaries_enabled):
            return None
        return self.task.summary_id


@dataclass(frozen=True)
class Selection:
    """The rows a batch's prompts are built from."""

    window: list[Subtask]  # newest first within each task, read as `WINDOW_FIELDS`
    totals: dict[int, tuple[int, int]]  # (user, assistant) history turns per task id
    anchors: list[Subtask]  # read as `ANCHOR_FIELDS` (the message too)
    # Each turn of both also has `STEERED_INTO_BOT` (`rows.with_steered_into_bot`).


def select_turns(batch: Sequence[HistoryRequest]) -> Selection:
    """The window, totals and anchors of every request of `batch` (one task has one request
    in a batch: a task never has two dispatchable turns at once)."""
    if connection.vendor == "postgresql":
        return _selected_by_statement(batch)
    return _selected_by_orm(batch)


def _selected_by_orm(batch: Sequence[HistoryRequest]) -> Selection:
    """`select_turns` in the ORM: the window ids ranked with the totals, then the window
    turns' rows, then the anchors' (three queries, one when no request wants a history)."""
    window_ids, totals = _ranked_window_ids([request for request in batch if request.wants_history])
    window = (
        list(
            with_steered_into_bot(Subtask.objects.filter(pk__in=window_ids))
            .select_related("artifact")
            .only(*WINDOW_FIELDS)
            .order_by("task_id", "-message_id")
        )
        if window_ids
        else []
    )
    conditions = [
        Q(task_id=request.task.pk, message_id__in=request.anchor_ids) for request in batch
    ]
    conditions += [Q(pk=request.summary_id) for request in batch if request.summary_id is not None]
    anchors = list(
        with_steered_into_bot(Subtask.objects.filter(any_of(conditions)))
        .select_related("artifact")
        .only(*ANCHOR_FIELDS)
    )
    return Selection(window=window, totals=totals, anchors=anchors)


def _ranked_window_ids(
    batch: list[HistoryRequest],
) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """The ids of the turns that can make each request's window, ranked in the database under
    any policy, and each task's (user, assistant) history totals — one query for the batch."""
    if not batch:
        return [], {}
    # Rank every candidate turn newest first within its task, count the task's history by role
    # over the same partition and, where a policy caps characters but not messages, sum the
    # (per-message capped) sizes of the newer turns. This pass reads ids and numbers only, and
    # keeps only the turns that can make each window: the texts of those are read afterwards,
    # so a long history costs no more than a short one.
    task = [F("task_id")]
    newest_first = F("message_id").desc()
    ranked = Subtask.objects.filter(any_of([_history_condition(request) for request in batch]))
    ranked = ranked.annotate(
        rank=Window(RowNumber(), partition_by=task, order_by=newest_first),
        users_total=Window(Count("id", filter=Q(role=Role.USER)), partition_by=task),
        assistants_total=Window(Count("id", filter=Q(role=Role.ASSISTANT)), partition_by=task),
    )
    if any(_walks_chars(request.policy) for request in batch):
        ranked = ranked.annotate(
            newer_chars=Window(
                Sum(_capped_size(batch)),
                partition_by=task,
                order_by=newest_first,
                frame=RowRange(start=None, end=-1),
            )
        )
    ranked = ranked.filter(any_of([_window_condition(request) for request in batch]))
    window_ids: list[int] = []
    totals_by_task: dict[int, tuple[int, int]] = {}
    for subtask_id, task_id, users_total, assistants_total in ranked.values_list(
        "id", "task_id", "users_total", "assistants_total"
    ):
        window_ids.append(subtask_id)
        totals_by_task[task_id] = (users_total, assistants_total)
    return window_ids, totals_by_task


def _history_condition(request: HistoryRequest) -> Q:
    return TURNS & Q(
        task_id=request.task.pk,
        message_id__lt=request.current_id,
        status__in=HISTORY_STATUSES,
    )


def _walks_chars(policy: PromptPolicy) -> bool:
    """Whether the window is bounded by characters: no message cap, but a character cap."""
    return policy.max_messages is None and policy.max_chars is not None


def _window_condition(request: HistoryRequest) -> Q:
    """The newest history turns that can matter under the request's policy.

    With `max_messages` set, that many. Without it but with `max_chars`, every turn whose
    newer turns (each counted at most `per_message_max_chars`) leave room under `max_chars`:
    the newest one always, and no text that cannot fit. With neither cap, all of them.
    """
    policy = request.policy
    in_task = Q(task_id=request.task.pk)
    if policy.max_messages is not None:
        return in_task & Q(rank__lte=policy.max_messages)
    if policy.max_chars is not None:
        return in_task & (Q(rank=1) | Q(newer_chars__lte=policy.max_chars))
    return in_task


def _capped_size(batch: list[HistoryRequest]) -> Length | Case:
    """A turn's history text length, capped at its task's `per_message_max_chars` (for the
    tasks whose window is bounded by characters)."""
    size = Length("history_text")
    capped = [
        When(
            task_id=request.task.pk,
            then=Least(size, Value(request.policy.per_message_max_chars)),
        )
        for request in batch
        if _walks_chars(request.policy) and request.policy.per_message_max_chars is not None
    ]
    return Case(*capped, default=size) if capped else size


# The columns `history_selection` reads of a turn and of its artifact, in its order; a window
# turn's row keeps only `WINDOW_FIELDS` of them, as the ORM's `.only()` would load it.
_TURN_COLUMNS = (
    "id",
    "task_id",
    "message_id",
    "parent_message_id",
    "kind",
    "role",
    "status",
    "sender",
    "bot",
    "message",
    "history_text",
    "history_text_tokens",
    "history_text_tokens_o200k",
    "history_chars",
    "preview_head",
    "preview_tail",
    "preview_layout",
    "history_is_preview",
    "summary_first_message_id",
    "summary_last_message_id",
    "steered_into_message_id",
    "artifact_id",
)
_ARTIFACT_COLUMNS = ("id", "kind", "size_chars", "size_lines")
_WINDOW_COLUMNS = frozenset(name for name in WINDOW_FIELDS if "__" not in name) | {"artifact_id"}


def _selected_by_statement(batch: Sequence[HistoryRequest]) -> Selection:
    """`select_turns` on PostgreSQL: the rows of `history_selection`, as model instances."""
    window: list[Subtask] = []
    totals: dict[int, tuple[int, int]] = {}
    anchors: list[Subtask] = []
    turn_end = 4 + len(_TURN_COLUMNS)
    artifact_end = turn_end + len(_ARTIFACT_COLUMNS)
    for row in _history_selection(batch):
        part, task_id, users, assistants = row[:4]
        if part == "totals":
            totals[task_id] = (int(users), int(assistants))
            continue
        fields, picked = _WINDOW_PICK if part == "window" else _ANCHOR_PICK
        subtask = instance_of(Subtask, [row[4 + index] for index in picked], fields)
        if subtask.artifact_id is not None:
            fields, picked = _ARTIFACT_PICK
            artifact = [row[turn_end + index] for index in picked]
            subtask.artifact = instance_of(Artifact, artifact, fields)
        setattr(subtask, STEERED_INTO_BOT, row[artifact_end])
        (window if part == "window" else anchors).append(subtask)
    return Selection(window=window, totals=totals, anchors=anchors)


def _picked(
    model: type[Model], columns: tuple[str, ...], kept: Iterable[str]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The fields of `model` a part keeps (`kept`: attribute names) in the model's field
    order, and where each is among the statement's `columns`: what `instance_of` takes."""
    fields = [field for field in model._meta.concrete_fields if field.attname in set(kept)]
    return (
        tuple(field.name for field in fields),
        tuple(columns.index(field.attname) for field in fields),
    )


_WINDOW_PICK = _picked(Subtask, _TURN_COLUMNS, _WINDOW_COLUMNS)
_ANCHOR_PICK = _picked(Subtask, _TURN_COLUMNS, _TURN_COLUMNS)
_ARTIFACT_PICK = _picked(Artifact, _ARTIFACT_COLUMNS, _ARTIFACT_COLUMNS)


def _history_selection(batch: Sequence[HistoryRequest]) -> list[tuple[Any, ...]]:
    """Run `history_selection` for `batch`: one row per window turn, per task's totals (of the
    requests that want a history) and per anchor."""
    with_history = [request for request in batch if request.wants_history]
    anchors = [
        (request.task.pk, message_id) for request in batch for message_id in request.anchor_ids
    ]
    summaries = [request.summary_id for request in batch if request.summary_id is not None]
    return queries.fetch(
        "history_selection",
        {
            "task_ids": [request.task.pk for request in with_history],
            "current_ids": [request.current_id for request in with_history],
            "max_messages": [request.policy.max_messages for request in with_history],
            "max_chars": [request.policy.max_chars for request in with_history],
            "per_message_max_chars": [
                request.policy.per_message_max_chars for request in with_history
            ],
            "anchor_task_ids": [task_id for task_id, _ in anchors],
            "anchor_message_ids": [message_id for _, message_id in anchors],
            "summary_ids": summaries,
            "long_span": transcript_spans.TRANSCRIPT_PART_TURNS,
        },
        {
            "request_count": len(with_history),
            "anchor_count": len(anchors),
            "summary_count": len(summaries),
            "turn_kind": SubtaskKind.TURN,
            **{status.lower(): status for status in HISTORY_STATUSES},
            "user_role": Role.USER,
            "assistant_role": Role.ASSISTANT,
        },
    )
