"""The history window: what prompt building reads from the database for one ASSISTANT turn.

It turns rows into the pure core's inputs (`backend.prompting.PromptInput`) with a constant
number of queries, reading only the bounded fields ingestion stored (history text or preview,
token counts, artifact pointer) and never a turn's full `message` or `result`, except the
current user message itself, which is bounded by the message size limit. So a build costs the
same whether the task's results were 1 KB or 1 GB each.

Which rows: the task's COMPLETED and FAILED turns older than the user message being answered,
newest first up to the policy's `max_messages`, plus the task's first user message when the
policy pins it. Older turns are only counted (by role) so the omission notice stays exact.
Summary jobs are not turns and never part of a history; with summaries on, the task's latest
finished summary comes with the anchors (no query of its own), and a summary job's own input is
read by `summary_job_inputs_for` (two queries for a batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Case, Count, F, Q, RowRange, Sum, Value, When, Window
from django.db.models.functions import Least, Length, RowNumber

from backend import sql
from backend.artifacts.models import Artifact
from backend.prompting import Role
from backend.prompting.addressing import workspace_path
from backend.prompting.inputs import (
    ArtifactPointer,
    CurrentMessage,
    HistoryMessage,
    HistorySummary,
    PromptInput,
)
from backend.prompting.policy import PromptPolicy
from backend.prompting.summary import summary_request
from backend.prompting.truncate import layout_fields
from backend.prompting.units import DEFAULT_TOKEN_ENCODING, O200K_ENCODING
from backend.tasks import transcript_spans
from backend.tasks.models import TURNS, Subtask, SubtaskKind, SubtaskStatus, Task, TranscriptPart

# The turns the conversation shows: finished ones, and those a newer message interrupted (with
# what they had written); cancelled and rolled-back turns are no part of it.
HISTORY_STATUSES = (SubtaskStatus.COMPLETED, SubtaskStatus.FAILED, SubtaskStatus.INTERRUPTED)

# A task's first turn is always its first user message (create_task allocates from 1).
FIRST_USER_MESSAGE_ID = 1

HISTORY_FIELDS = (
    "id",
    "message_id",
    "role",
    "status",
    "sender",
    "bot",
    "history_text",
    "history_text_tokens",
    "history_text_tokens_o200k",
    "history_chars",
    "preview_head",
    "preview_tail",
    "preview_layout",
    "artifact__id",
    "artifact__kind",
    "artifact__size_chars",
    "artifact__size_lines",
    "history_is_preview",
)
# A stored summary: its text as a history text, and the range it covers.
SUMMARY_FIELDS = (
    *HISTORY_FIELDS,
    "kind",
    "summary_first_message_id",
    "summary_last_message_id",
)


class HistoryUnavailable(RuntimeError):
    """The turn cannot be prompted (not an ASSISTANT turn, or its inputs are missing)."""


def _pointer(artifact: Artifact | None) -> ArtifactPointer | None:
    if artifact is None:
        return None
    return ArtifactPointer(
        artifact_id=artifact.id,
        kind=artifact.kind,
        total_chars=artifact.size_chars,
        total_lines=artifact.size_lines,
        workspace_path=workspace_path(artifact.id),
    )


def _name(value: str) -> str | None:
    return value or None


def _preview_removed_chars(turn: Subtask) -> int:
    """Characters a spilled turn's stored preview leaves out of its whole text (else 0)."""
    if not turn.history_is_preview or turn.history_chars is None:
        return 0
    kept = len(turn.preview_head) + len(turn.preview_tail)
    kept += sum(map(len, turn.preview_layout.get("middle", ())))
    return max(turn.history_chars - kept, 0)


def _preview_parts(turn: Subtask | None) -> dict[str, Any]:
    """A spilled turn's kind-aware preview parts (its middle and elisions), else nothing."""
    if turn is None or not turn.history_is_preview:
        return {}
    return layout_fields(turn.preview_layout)


CACHED_TOKEN_COUNTS = {
    DEFAULT_TOKEN_ENCODING: "history_text_tokens",
    O200K_ENCODING: "history_text_tokens_o200k",
}
"""The encodings ingestion counts every history text in, and the column each count is in."""


def cached_counts_encoding(encoding: str) -> str:
    """The encoding of the cached counts a prompt counted with `encoding` gets: its own when
    ingestion caches it (the builder then reuses the counts), else the default's."""
    return encoding if encoding in CACHED_TOKEN_COUNTS else DEFAULT_TOKEN_ENCODING


def _cached_tokens(turn: Subtask, encoding: str) -> int | None:
    column = CACHED_TOKEN_COUNTS.get(encoding)
    count: int | None = getattr(turn, column) if column is not None else None
    return count


def history_message(turn: Subtask, encoding: str = DEFAULT_TOKEN_ENCODING) -> HistoryMessage:
    """One stored turn as the prompt builder's input: its history text (or, when it spilled,
    its preview), its cached token count under `encoding` (see `cached_counts_encoding`) and,
    when stored, the artifact a cut of it points to."""
    spilled = turn.history_is_preview
    return HistoryMessage(
        message_id=turn.message_id,
        role=Role(turn.role),
        text=turn.history_text,
        sender=_name(turn.sender) if turn.role == Role.USER else None,
        bot=_name(turn.bot) if turn.role == Role.ASSISTANT else None,
        failed=turn.status == SubtaskStatus.FAILED,
        token_count=_cached_tokens(turn, encoding),
        total_chars=turn.history_chars,
        preview_head=turn.preview_head if spilled else None,
        preview_tail=turn.preview_tail if spilled else None,
        **{f"preview_{name}": value for name, value in _preview_parts(turn).items()},
        artifact=_pointer(turn.artifact),
    )


def history_summary(row: Subtask) -> HistorySummary | None:
    """A completed summary job's stored summary as the builder's input (None when it has no
    text or no artifact to point to)."""
    pointer = _pointer(row.artifact)
    if (
        row.kind != SubtaskKind.SUMMARY
        or row.status != SubtaskStatus.COMPLETED
        or not row.history_text
        or pointer is None
        or row.summary_first_message_id is None
        or row.summary_last_message_id is None
    ):
        return None
    spilled = row.history_is_preview
    return HistorySummary(
        message_id=row.message_id,
        first_message_id=row.summary_first_message_id,
        last_message_id=row.summary_last_message_id,
        text=row.history_text,
        token_count=row.history_text_tokens,
        total_chars=row.history_chars,
        preview_head=row.preview_head if spilled else None,
        preview_tail=row.preview_tail if spilled else None,
        **{f"preview_{name}": value for name, value in _preview_parts(row).items()},
        artifact=pointer,
    )


def _current_message(user_turn: Subtask, encoding: str) -> CurrentMessage:
    return CurrentMessage(
        message_id=user_turn.message_id,
        text=user_turn.message,
        sender=_name(user_turn.sender),
        token_count=None if user_turn.history_is_preview else _cached_tokens(user_turn, encoding),
        artifact=_pointer(user_turn.artifact),
    )


def _summary_request(job: Subtask, previous: Subtask | None) -> CurrentMessage:
    """A summary job's Current Message: the request to write its summary."""
    assert job.summary_first_message_id is not None and job.summary_last_message_id is not None
    return CurrentMessage(
        message_id=job.message_id,
        text=summary_request(
            first_message_id=job.summary_first_message_id,
            last_message_id=job.summary_last_message_id,
            folds=previous.summary_last_message_id if previous is not None else None,
        ),
    )


@dataclass(frozen=True)
class _Request:
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
        user message: fetched together in one query."""
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


def any_of(conditions: list[Q]) -> Q:
    """The OR of `conditions` (matches nothing when there are none): one query per batch."""
    combined = Q(pk__in=[])
    for condition in conditions:
        combined |= condition
    return combined


def prompt_inputs_for(
    *, requests: Sequence[tuple[Subtask, Task, PromptPolicy]]
) -> dict[int, PromptInput]:
    """Builder inputs for several ASSISTANT turns at once, keyed by subtask id.

    One statement for the whole batch, whatever its size and the length of the histories,
    when every policy caps messages (the shipped policies): it picks the window ids, cut per
    task's policy in the database, with per-role totals, and the anchors (the pinned first
    messages among them), and reads their rows (`_read_turns`). Two otherwise: the window ids
    are ranked by the ORM first (`_ranked_window_ids`). Dispatching ten turns costs what one
    does.
    """
    batch = [_Request(subtask, task, policy) for subtask, task, policy in requests]
    for request in batch:
        if request.subtask.role != Role.ASSISTANT or request.subtask.parent_message_id is None:
            raise HistoryUnavailable(
                f"turn {request.subtask.pk} is not an ASSISTANT turn answering a message"
            )
    if not batch:
        return {}

    table = Subtask._meta.db_table
    conditions = []
    params: list[Any] = []
    for request in batch:
        conditions.append(
            f"({table}.task_id = %s AND {table}.message_id IN "
            f"({sql.placeholders(request.anchor_ids)}))"
        )
        params += [request.task.pk, *request.anchor_ids]
    for request in batch:
        if request.summary_id is not None:
            conditions.append(f"{table}.id = %s")
            params.append(request.summary_id)
    anchor_part = (
        f"SELECT {_ANCHOR} AS part, id, task_id, 0 AS users, 0 AS assistants "  # noqa: S608
        f"FROM {table} WHERE {' OR '.join(conditions)}"
    )
    with_history = [request for request in batch if request.wants_history]
    window_parts, window_params, ranked_totals = _window_parts(with_history)
    read = _read_turns([*window_parts, anchor_part], [*window_params, *params])
    anchors = {(turn.task_id, turn.message_id): turn for turn in read.anchors}
    summaries = {turn.pk: turn for turn in anchors.values() if turn.kind == SubtaskKind.SUMMARY}
    windows, totals = _history_windows(
        with_history, anchors=anchors, rows=read.window, totals={**ranked_totals, **read.totals}
    )

    inputs: dict[int, PromptInput] = {}
    for request in batch:
        task = request.task
        user_turn = anchors.get((task.pk, request.current_id))
        if user_turn is None or user_turn.role != Role.USER:
            raise HistoryUnavailable(
                f"message {request.current_id} of task {task.pk} is not a user message"
            )
        previous_turn = (
            anchors.get((task.pk, request.previous_step_id)) if request.previous_step_id else None
        )
        newest = windows.get(request.subtask.pk, [])
        users, assistants = totals.get(request.subtask.pk, (0, 0))
        loaded_users = sum(1 for turn in newest if turn.role == Role.USER)
        summary = summaries.get(request.summary_id) if request.summary_id is not None else None
        if summary is not None and (summary.summary_last_message_id or 0) >= request.current_id:
            summary = None  # a summary of later turns (a prompt built again for an older turn)
        inputs[request.subtask.pk] = _prompt_input(
            history=newest,
            current=_current_message(
                user_turn, cached_counts_encoding(request.policy.token_encoding)
            ),
            previous_turn=previous_turn,
            summary_turn=summary,
            is_group_chat=task.is_group_chat,
            multi_bot=task.is_multi_bot,
            first_user_message_id=(
                FIRST_USER_MESSAGE_ID if request.policy.keep_first_user_message else None
            ),
            earlier_user_messages=users - loaded_users,
            earlier_assistant_messages=assistants - (len(newest) - loaded_users),
            token_count_encoding=cached_counts_encoding(request.policy.token_encoding),
        )
    return inputs


def _prompt_input(
    *,
    history: Sequence[Subtask],
    current: CurrentMessage,
    previous_turn: Subtask | None,
    summary_turn: Subtask | None = None,
    **fields: Any,
) -> PromptInput:
    """The builder input from the rows it is made of: the one place rows become an input,
    for dispatch and for replay (of turns and of summary jobs)."""
    encoding = fields.get("token_count_encoding", DEFAULT_TOKEN_ENCODING)
    return PromptInput(
        history=tuple(history_message(turn, encoding) for turn in history),
        current=current,
        summary=history_summary(summary_turn) if summary_turn is not None else None,
        previous_result=previous_turn.history_text if previous_turn is not None else None,
        previous_result_bot=_name(previous_turn.bot) if previous_turn is not None else None,
        previous_result_token_count=(
            _cached_tokens(previous_turn, encoding) if previous_turn is not None else None
        ),
        previous_result_artifact=(
            _pointer(previous_turn.artifact) if previous_turn is not None else None
        ),
        previous_result_removed_chars=(
            _preview_removed_chars(previous_turn) if previous_turn is not None else 0
        ),
        previous_result_preview_head=(
            previous_turn.preview_head
            if previous_turn is not None and previous_turn.history_is_preview
            else None
        ),
        previous_result_preview_tail=(
            previous_turn.preview_tail
            if previous_turn is not None and previous_turn.history_is_preview
            else None
        ),
        **{
            f"previous_result_preview_{name}": value
            for name, value in _preview_parts(previous_turn).items()
        },
        previous_result_message_id=previous_turn.message_id if previous_turn else None,
        **fields,
    )


# What a PromptReport keeps of a build's input to rebuild it: ids, counts and flags only (the
# texts are read again from the turns, which do not change once recorded).
_SNAPSHOT_FIELDS = (
    "is_group_chat",
    "multi_bot",
    "first_user_message_id",
    "earlier_user_messages",
    "earlier_assistant_messages",
    "token_count_encoding",
)


def input_snapshot(prompt_input: PromptInput, *, summary_job: bool = False) -> dict[str, Any]:
    """The ids, counts and flags that rebuild `prompt_input` from the task's turns: its summary
    named by its summary job's message id and, for a summary job's own prompt, that job's."""
    summary = prompt_input.summary
    return {
        "history": [message.message_id for message in prompt_input.history],
        "current": prompt_input.current.message_id,
        "previous_result": prompt_input.previous_result_message_id,
        "summary": summary.message_id if summary is not None else None,
        "summary_job": summary_job,
        **{name: getattr(prompt_input, name) for name in _SNAPSHOT_FIELDS},
    }


def prompt_input_from_snapshot(*, task_id: int, snapshot: Mapping[str, Any]) -> PromptInput:
    """The builder input an `input_snapshot` was taken of, read again from the task's turns
    (one query). Raises HistoryUnavailable when a turn it names is gone."""
    history_ids: list[int] = list(snapshot["history"])
    previous_id: int | None = snapshot["previous_result"]
    summary_id: int | None = snapshot.get("summary")
    wanted = {
        *history_ids,
        snapshot["current"],
        *([previous_id] if previous_id else []),
        *([summary_id] if summary_id else []),
    }
    rows = {
        turn.message_id: turn
        for turn in Subtask.objects.filter(task_id=task_id, message_id__in=wanted)
        .select_related("artifact")
        .only(*SUMMARY_FIELDS, "task_id", "message", "parent_message_id")
    }
    missing = sorted(wanted - rows.keys())
    if missing:
        raise HistoryUnavailable(f"turns {missing} of task {task_id} no longer exist")
    summary_turn = rows[summary_id] if summary_id else None
    if summary_id and history_summary(rows[summary_id]) is None:
        raise HistoryUnavailable(f"summary {summary_id} of task {task_id} is not usable")
    current_row = rows[snapshot["current"]]
    current = (
        _summary_request(current_row, summary_turn)
        if snapshot.get("summary_job")
        else _current_message(
            current_row, snapshot.get("token_count_encoding", DEFAULT_TOKEN_ENCODING)
        )
    )
    return _prompt_input(
        history=[rows[message_id] for message_id in history_ids],
        current=current,
        previous_turn=rows[previous_id] if previous_id else None,
        summary_turn=summary_turn,
        **{name: snapshot[name] for name in _SNAPSHOT_FIELDS},
    )


def summary_job_inputs_for(
    *, jobs: Sequence[Subtask], tasks: Mapping[int, Task]
) -> dict[int, PromptInput]:
    """Builder inputs for summary jobs, keyed by subtask id: each job's turns (the ones after
    the summary it folds in, up to the last message it covers), that summary, and the turns it
    covers counted by role for the omission notice. Two queries for the batch (one without a
    previous summary), whatever the jobs and however long the histories."""
    if not jobs:
        return {}
    conditions = []
    for job in jobs:
        previous_last = _previous_last(job)
        conditions.append(
            TURNS
            & Q(
                task_id=job.task_id,
                message_id__gt=previous_last,
                message_id__lte=job.summary_last_message_id,
                status__in=HISTORY_STATUSES,
            )
        )
        if job.summary_previous_id is not None:
            conditions.append(Q(pk=job.summary_previous_id))
    rows = list(
        Subtask.objects.filter(any_of(conditions))
        .select_related("artifact")
        .only(*SUMMARY_FIELDS, "task_id")
        .order_by("task_id", "message_id")
    )
    earlier = _covered_by_role([job for job in jobs if job.summary_previous_id is not None])
    inputs: dict[int, PromptInput] = {}
    for job in jobs:
        previous = next((row for row in rows if row.pk == job.summary_previous_id), None)
        turns = [
            row
            for row in rows
            if row.task_id == job.task_id
            and row.kind == SubtaskKind.TURN
            and _previous_last(job) < row.message_id <= (job.summary_last_message_id or 0)
        ]
        users, assistants = earlier.get(job.pk, (0, 0))
        task = tasks[job.task_id]
        inputs[job.pk] = _prompt_input(
            history=turns,
            current=_summary_request(job, previous),
            previous_turn=None,
            summary_turn=previous,
            is_group_chat=task.is_group_chat,
            multi_bot=task.is_multi_bot,
            first_user_message_id=None,
            earlier_user_messages=users,
            earlier_assistant_messages=assistants,
            token_count_encoding=DEFAULT_TOKEN_ENCODING,
        )
    return inputs


def _previous_last(job: Subtask) -> int:
    """The last message the summary a job folds in covers (0: a first summary). Callers load
    jobs with their `summary_previous` (select_related), so this costs no query."""
    previous = job.summary_previous
    if previous is None or previous.summary_last_message_id is None:
        return 0
    return previous.summary_last_message_id


def _covered_by_role(jobs: Sequence[Subtask]) -> dict[int, tuple[int, int]]:
    """Per job id: the (user, assistant) turns its folded summary covers (one query)."""
    if not jobs:
        return {}
    ends = {job.task_id: (job.pk, _previous_last(job)) for job in jobs}
    counted = (
        Subtask.objects.filter(
            any_of(
                [Q(task_id=task_id, message_id__lte=last) for task_id, (_, last) in ends.items()]
            ),
            TURNS,
            status__in=HISTORY_STATUSES,
        )
        .values("task_id")
        .annotate(
            users=Count("id", filter=Q(role=Role.USER)),
            assistants=Count("id", filter=Q(role=Role.ASSISTANT)),
        )
    )
    return {ends[row["task_id"]][0]: (row["users"], row["assistants"]) for row in counted}


def _history_condition(request: _Request) -> Q:
    return TURNS & Q(
        task_id=request.task.pk,
        message_id__lt=request.current_id,
        status__in=HISTORY_STATUSES,
    )


def _history_windows(
    batch: list[_Request],
    *,
    anchors: dict[tuple[int, int], Subtask],
    rows: list[Subtask],
    totals: dict[int, tuple[int, int]],
) -> tuple[dict[int, list[Subtask]], dict[int, tuple[int, int]]]:
    """Per subtask id: its window of history turns (oldest first, pinned first message
    included) and the (user, assistant) totals of its whole history, from the window rows
    (newest first per task) and the totals per task that `_read_turns` read."""
    by_task: dict[int, list[Subtask]] = {}
    for turn in rows:
        by_task.setdefault(turn.task_id, []).append(turn)

    windows: dict[int, list[Subtask]] = {}
    totals_out: dict[int, tuple[int, int]] = {}
    for request in batch:
        newest = by_task.get(request.task.pk, [])
        first = anchors.get((request.task.pk, FIRST_USER_MESSAGE_ID))
        if (
            request.policy.keep_first_user_message
            and first is not None
            and newest
            and newest[-1].message_id > FIRST_USER_MESSAGE_ID
        ):
            newest = [*newest, first]
        windows[request.subtask.pk] = list(reversed(newest))
        totals_out[request.subtask.pk] = totals.get(request.task.pk, (0, 0))
    return windows, totals_out


# The parts of the statement that reads a batch's turns (`_read_turns`), by its `part` column:
# a turn of a window, a task's history totals, an anchor.
_WINDOW, _TOTALS, _ANCHOR = 0, 1, 2
_WINDOW_FIELDS = (*HISTORY_FIELDS, "task_id")
_ANCHOR_FIELDS = (*SUMMARY_FIELDS, "task_id", "message", "parent_message_id")


@dataclass(frozen=True)
class _Read:
    window: list[Subtask]  # newest first within each task
    totals: dict[int, tuple[int, int]]  # per task id
    anchors: list[Subtask]


def _window_parts(
    batch: list[_Request],
) -> tuple[list[str], list[Any], dict[int, tuple[int, int]]]:
    """The parts of `_read_turns`'s statement that pick the batch's window turns (and, when
    every policy caps messages, their tasks' totals), their parameters, and the totals read
    beforehand when one does not (none for an empty batch)."""
    if not batch:
        return [], [], {}
    if all(request.policy.max_messages is not None for request in batch):
        parts, params = _capped_window_parts(batch)  # the shipped policies' case
        return parts, params, {}
    window_ids, totals = _ranked_window_ids(batch)
    if not window_ids:
        return [], [], totals
    part = (
        f"SELECT {_WINDOW} AS part, id, task_id, 0 AS users, 0 AS assistants "  # noqa: S608
        f"FROM {Subtask._meta.db_table} WHERE id IN ({sql.placeholders(window_ids)})"
    )
    return [part], list(window_ids), totals


def _read_turns(parts: list[str], params: Sequence[Any]) -> _Read:
    """The turns and totals the `parts` pick, in one statement: each part selects `(part, id,
    task_id, users, assistants)`, and a window turn's row is read as
    `.only(_WINDOW_FIELDS).select_related("artifact")` would load it, an anchor's as
    `.only(_ANCHOR_FIELDS)…` (its message too), each through its own join, so a window turn's
    message is never read. Every dispatch reads its history this way: the SQL is written out
    (see `backend.sql`)."""
    table, artifacts = Subtask._meta.db_table, Artifact._meta.db_table
    window, window_pointer = _own_and_pointer(_WINDOW_FIELDS)
    anchor, anchor_pointer = _own_and_pointer(_ANCHOR_FIELDS)
    statement = (
        "SELECT picked.part, picked.task_id, picked.users, picked.assistants, "  # noqa: S608
        f"{sql.columns(Subtask, window, table='w')}, "
        f"{sql.columns(Artifact, window_pointer, table='wa')}, "
        f"{sql.columns(Subtask, anchor, table='a')}, "
        f"{sql.columns(Artifact, anchor_pointer, table='aa')} "
        f"FROM ({' UNION ALL '.join(parts)}) AS picked "
        f"LEFT JOIN {table} AS w ON picked.part = {_WINDOW} AND w.id = picked.id "
        f"LEFT JOIN {artifacts} AS wa ON wa.id = w.artifact_id "
        f"LEFT JOIN {table} AS a ON picked.part = {_ANCHOR} AND a.id = picked.id "
        f"LEFT JOIN {artifacts} AS aa ON aa.id = a.artifact_id "
        "ORDER BY picked.part, picked.task_id, w.message_id DESC"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, list(params))
        rows = cursor.fetchall()
    window_width = sql.width(Subtask, window) + sql.width(Artifact, window_pointer)
    totals: dict[int, tuple[int, int]] = {}
    window_rows, anchor_rows = [], []
    for row in rows:
        if row[0] == _WINDOW:
            window_rows.append(row[4 : 4 + window_width])
        elif row[0] == _ANCHOR:
            anchor_rows.append(row[4 + window_width :])
        else:
            totals[row[1]] = (int(row[2]), int(row[3]))
    return _Read(
        window=sql.models_of(
            Subtask, window_rows, fields=window, joined=("artifact", window_pointer)
        ),
        totals=totals,
        anchors=sql.models_of(
            Subtask, anchor_rows, fields=anchor, joined=("artifact", anchor_pointer)
        ),
    )


def _own_and_pointer(fields: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A turn's own fields among `fields` (with its artifact's key) and its artifact's
    (`fields` names them as `artifact__…`)."""
    own = tuple(name for name in fields if "__" not in name) + ("artifact",)
    pointer = tuple(name.split("__", 1)[1] for name in fields if name.startswith("artifact__"))
    return own, pointer


def _capped_window_parts(batch: list[_Request]) -> tuple[list[str], list[Any]]:
    """For requests whose policy caps messages, `_read_turns` parts and their parameters: the
    ids of each task's newest `max_messages` history turns, and each task's (user, assistant)
    history totals. Each window is an index range read newest first and stopped at the cap
    (`subtask_message_id_unique`), so its cost does not grow with the history; the totals add
    up the counts of the transcript's sealed parts before the message and count only the
    turns after them (`transcripts`), so theirs does not either. Written as SQL, not the ORM:
    this runs on every dispatch, and compiling the ranked form cost more than running it."""
    table = Subtask._meta.db_table
    statuses = ", ".join("%s" for _ in HISTORY_STATUSES)
    history = f"kind = %s AND status IN ({statuses})"
    parts: list[str] = []
    params: list[int | str | None] = []
    for number, request in enumerate(batch):
        parts.append(
            f"SELECT * FROM (SELECT {_WINDOW} AS part, id, task_id, 0 AS users, 0 AS assistants "  # noqa: S608
            f"FROM {table} WHERE task_id = %s AND message_id < %s AND {history} "
            f"ORDER BY message_id DESC LIMIT %s) AS window_{number}"
        )
        params += [request.task.pk, request.current_id, SubtaskKind.TURN, *HISTORY_STATUSES]
        params.append(request.policy.max_messages)
    parts_table = TranscriptPart._meta.db_table
    for number, request in enumerate(batch):
        # The sealed parts of the transcript before the message hold their turns' counts:
        # only the turns after them are counted. A short part counts only after the long
        # parts (one a long part covers is not removed yet).
        sealed = (
            f"FROM {parts_table} WHERE task_id = %s AND last_message_id < %s AND (span = %s "  # noqa: S608
            f"OR first_message_id > COALESCE((SELECT MAX(last_message_id) FROM {parts_table} "
            "WHERE task_id = %s AND span = %s), 0))"
        )
        parts.append(
            f"SELECT * FROM (SELECT {_TOTALS} AS part, 0 AS id, %s AS task_id, "  # noqa: S608
            "COALESCE(SUM(users), 0) AS users, COALESCE(SUM(assistants), 0) AS assistants "
            f"FROM (SELECT users, assistants {sealed} UNION ALL "
            "SELECT CASE WHEN role = %s THEN 1 ELSE 0 END, CASE WHEN role = %s THEN 1 ELSE 0 END "
            f"FROM {table} WHERE task_id = %s AND message_id < %s AND {history} AND message_id > "
            f"COALESCE((SELECT MAX(last_message_id) {sealed}), 0)) AS counted_{number}"
            f") AS totals_{number}"
        )
        long_span = transcript_spans.TRANSCRIPT_PART_TURNS
        in_parts = [request.task.pk, request.current_id, long_span, request.task.pk, long_span]
        params += [request.task.pk, *in_parts, Role.USER, Role.ASSISTANT]
        params += [request.task.pk, request.current_id, SubtaskKind.TURN, *HISTORY_STATUSES]
        params += in_parts
    return parts, params


def _ranked_window_ids(
    batch: list[_Request],
) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """The ids of the turns that can make each request's window, ranked in the database under
    any policy, and each task's (user, assistant) history totals — one query for the batch."""
    # Rank every candidate turn newest first within its task (one task has one turn in a
    # batch: a task never has two dispatchable turns at once), count the task's history by
    # role over the same partition and, where a policy caps characters but not messages, sum
    # the (per-message capped) sizes of the newer turns. This pass reads ids and numbers only,
    # and keeps only the turns that can make each window: the texts of those are fetched
    # afterwards, so a long history costs no more than a short one.
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


def _walks_chars(policy: PromptPolicy) -> bool:
    """Whether the window is bounded by characters: no message cap, but a character cap."""
    return policy.max_messages is None and policy.max_chars is not None


def _window_condition(request: _Request) -> Q:
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


def _capped_size(batch: list[_Request]) -> Length | Case:
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


def prompt_input_for(*, subtask: Subtask, task: Task, policy: PromptPolicy) -> PromptInput:
    """The builder's input for one ASSISTANT turn."""
    return prompt_inputs_for(requests=[(subtask, task, policy)])[subtask.pk]
