"""Native sessions: resume an executor's own session with only the turns it has not seen.

Codex CLI and Claude Code keep each conversation in a session on the worker's disk. When a
turn's bot has a live session on the worker that claims it, the dispatch offers a
`resume_prompt` beside the full `prompt`: built by the same core, with the same sections,
escaping and caps, but holding only the turns after the last one the session saw — the current
message, and whatever happened since (other group members' messages, other bots' answers, the
previous pipeline step's result). The session already holds the rest, so the model reads
every earlier turn once instead of again on every turn.

When a result comes back, `record_session` notes what the session has now seen: the turns in
the prompt that was sent, the message it answered, its own answer and the follow-ups it was
given while it ran (steers it received, which its answer answers). Those are numbered after
its answer, so a resume leaves out every turn the session has seen (`seen_message_ids`), not
only those up to the last (`seen_through_message_id`): a steer that fell back to the queue,
numbered among them but never seen, still comes. A resume is offered only
when it is safe; `resume_reason` says why not otherwise (another worker holds the session, the
session's context is nearly full, the model refused this turn's prompt as too long, history
is off, unseen turns fell outside the window, ...). A session whose context overflowed on a
resume is forgotten (`forget_session`): the turn runs again in a fresh one (see `overflow`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection
from django.db.models import BooleanField, Case, ExpressionWrapper, F, Q, Value, When
from django.utils import timezone

from backend import executor_kinds, queries
from backend.dispatch.models import PromptReport
from backend.prompting.inputs import PromptInput
from backend.prompting.policy import PromptPolicy
from backend.queries.rows import instance_of
from backend.tasks.models import (
    NativeSession,
    Steer,
    SteerStatus,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
)

RESUME = "resume"


def native_sessions_for(subtasks: Sequence[Subtask]) -> dict[int, NativeSession]:
    """Per subtask id: the native session of its bot in its task, if any (one query)."""
    if not subtasks:
        return {}
    task_ids = sorted({subtask.task_id for subtask in subtasks})
    # A task holds one session per bot and executor: its few rows are matched here.
    rows = NativeSession.objects.filter(task_id__in=task_ids)
    by_key = {(row.task_id, row.bot, row.executor): row for row in rows}
    found = {}
    for subtask in subtasks:
        session = by_key.get((subtask.task_id, subtask.bot, subtask.executor))
        if session is not None:
            found[subtask.pk] = session
    return found


def resume_reason(
    *,
    subtask: Subtask,
    session: NativeSession | None,
    input_window: int | None,
    policy: PromptPolicy,
    worker_id: str,
    full_input: PromptInput,
) -> str:
    """ "resume" when the claiming worker may resume the session; otherwise why not.

    `input_window` is the most input the bot's model takes (`ModelWindow.input_window`; None
    when not known): a session whose last turn used more than `resume_max_context_fraction` of
    it starts fresh."""
    if subtask.context_overflows:
        # The model refused a prompt of this turn as too long, a resumed session's or a full
        # one: its retry starts a fresh session with the full prompt (see `overflow`).
        return "context_overflow"
    if session is None:
        return "no_session"
    kind = executor_kinds.KINDS.get(subtask.executor)
    if kind is None or not kind.resumable:
        return "executor_keeps_baton_prompt"
    if not policy.resume_native_sessions:
        return "policy_off"
    if not policy.enabled:
        return "history_disabled"
    if session.worker_id != worker_id:
        return "other_worker"
    if (
        input_window
        and session.context_tokens is not None
        and session.context_tokens > policy.resume_max_context_fraction * input_window
    ):
        return "context_full"
    assert subtask.parent_message_id is not None  # an ASSISTANT turn answers a message
    if session.seen_through_message_id >= subtask.parent_message_id:
        return "session_ahead"  # the session claims to have seen this turn: start over
    if not _window_covers_unseen(full_input, seen_through=session.seen_through_message_id):
        return "unseen_beyond_window"
    return RESUME


def forget_session(*, subtask: Subtask) -> int | None:
    """Forget the native session of `subtask`'s bot in its task, whose context overflowed when
    the turn resumed it: no later turn resumes it, the next one starts a fresh session.
    Returns the input tokens of that session's last completed turn (None: not known)."""
    found = NativeSession.objects.filter(
        task_id=subtask.task_id, bot=subtask.bot, executor=subtask.executor
    ).first()
    if found is None:
        return None
    found.delete()
    return found.context_tokens


def _window_covers_unseen(full_input: PromptInput, *, seen_through: int) -> bool:
    """Whether every turn after `seen_through` is in the history window the full prompt used.

    The window holds the newest turns; older ones are only counted. If turns older than the
    window exist and the window starts after the session's last seen turn, some unseen turns
    may be among the dropped ones, and only a fresh session would be told about them.
    """
    dropped_before_window = full_input.earlier_user_messages + full_input.earlier_assistant_messages
    if not dropped_before_window:
        return True
    windowed = [
        message.message_id
        for message in full_input.history
        if message.message_id != full_input.first_user_message_id
    ]
    return bool(windowed) and min(windowed) <= seen_through + 1


def resume_input(full_input: PromptInput, *, session: NativeSession) -> PromptInput:
    """The builder input of a resume prompt: the same turn, with only the unseen history.

    The session already holds the first user message, every turn up to its
    `seen_through_message_id` and the later ones it was given while it ran (the steers it
    received, in `seen_message_ids`), so nothing is pinned and nothing is reported as omitted
    before the unseen turns.
    """
    seen_through, seen = session.seen_through_message_id, set(session.seen_message_ids)
    data: dict[str, Any] = {field: getattr(full_input, field) for field in PromptInput.model_fields}
    data.update(
        history=tuple(
            m
            for m in full_input.history
            if m.message_id > seen_through and m.message_id not in seen
        ),
        summary=None,  # the session has seen what a summary would stand for
        first_user_message_id=None,
        earlier_user_messages=0,
        earlier_assistant_messages=0,
    )
    return PromptInput(**data)


def _mark_sent(
    *, subtask: Subtask, sent_kind: str, resumed: bool
) -> Iterable[tuple[str, list[int]]]:
    """Mark which prompt of the claim's dispatch was sent (`sent_kind`) and why a resume
    prompt was or was not; each prompt's kind and the turns it held (the one sent is what
    the session has now seen). On PostgreSQL one statement (`record_prompt_sent`)."""
    resume_reason = "resumed" if resumed else "resume_failed"
    if connection.vendor == "postgresql":
        rows = queries.fetch(
            "record_prompt_sent",
            {
                "sent_kind": sent_kind,
                "resume_reason": resume_reason,
                "subtask_id": subtask.pk,
                "attempt": subtask.attempts,
            },
            {"resume": RESUME},
        )
        return [(kind, _json(included)) for kind, included in rows]
    reports = PromptReport.objects.filter(subtask_id=subtask.pk, attempt=subtask.attempts)
    reports.update(
        sent=ExpressionWrapper(Q(kind=sent_kind), output_field=BooleanField()),
        resume_reason=Case(
            When(kind=RESUME, then=Value(resume_reason)), default=F("resume_reason")
        ),
    )
    # Read only if iterated: when a session is to be recorded.
    return reports.values_list("kind", "included_message_ids")


def _json(value: Any) -> Any:
    """A JSON column's value as the ORM reads it (the driver hands Django's text over)."""
    return json.loads(value) if isinstance(value, str) else value


def session_of(*, task_id: int, bot: str, executor: str) -> NativeSession | None:
    """The native session of `bot` on `executor` in the task, if any. On PostgreSQL a named
    statement (`native_session_of`)."""
    if connection.vendor == "postgresql":
        rows = queries.fetch(
            "native_session_of", {"task_id": task_id, "bot": bot, "executor": executor}
        )
        return instance_of(NativeSession, rows[0]) if rows else None
    return NativeSession.objects.filter(task_id=task_id, bot=bot, executor=executor).first()


# What `record_session` writes of a session it found (`updated_at` is set on save).
_SESSION_WRITES = (
    "session_id",
    "seen_message_ids",
    "turns",
    "worker_id",
    "seen_through_message_id",
    "context_tokens",
    "updated_at",
)


def record_session(
    *,
    subtask: Subtask,
    worker_id: str,
    session_id: str,
    resumed: bool,
    usage: dict[str, Any] | None,
) -> None:
    """After a result: mark which prompt was sent, and what the session has now seen.

    Runs in the result's transaction, under the task's lock. A failed turn updates no
    session: its session may hold a half-finished exchange, so the next turn starts fresh.
    """
    sent_kind = RESUME if resumed else "full"
    held = _mark_sent(subtask=subtask, sent_kind=sent_kind, resumed=resumed)
    if (
        not session_id
        or subtask.status != SubtaskStatus.COMPLETED
        or subtask.kind != SubtaskKind.TURN
    ):
        return  # a summary job's session is of no use to the task's turns
    sent = next((included for kind, included in held if kind == sent_kind), None)
    seen_now = {*(sent or []), subtask.parent_message_id, subtask.message_id}
    if subtask.pipeline_step:
        assert subtask.parent_message_id is not None  # an ASSISTANT turn answers a message
        seen_now.add(
            subtask.message_id - 1
        )  # the previous step: a round's answers are numbered in a row
    seen_now.update(_steers_received(subtask))
    context_tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
    existing = session_of(task_id=subtask.task_id, bot=subtask.bot, executor=subtask.executor)
    if resumed and existing is not None and existing.session_id == session_id:
        existing.seen_message_ids = sorted(set(existing.seen_message_ids) | seen_now)
        existing.turns += 1
    else:
        # A fresh session (or one that replaced a session the worker could not resume).
        existing = existing or NativeSession(
            task_id=subtask.task_id, bot=subtask.bot, executor=subtask.executor
        )
        existing.session_id = session_id
        existing.seen_message_ids = sorted(seen_now)
        existing.turns = 1
    existing.worker_id = worker_id
    existing.seen_through_message_id = subtask.message_id
    existing.context_tokens = context_tokens
    _write_session(existing)


def _steers_received(subtask: Subtask) -> list[int]:
    """The message ids of the follow-ups the completed `subtask`'s attempt received while it
    ran (its DELIVERED steers, which its answer answers).

    Each steer stores its USER turn with a message_id allocated after the turn's round, so a
    task whose next message_id is right after this turn's had none: most results ask nothing
    (the turn's own count of open steers is no guide here, its attempt's end has just reset
    it). A later pipeline step or another message allocated since costs one indexed query.
    """
    if subtask.task.next_message_id <= subtask.message_id + 1:
        return []
    return list(
        Steer.objects.filter(
            target_id=subtask.pk, attempt=subtask.attempts, status=SteerStatus.DELIVERED
        ).values_list("message__message_id", flat=True)
    )


def _write_session(session: NativeSession) -> None:
    """Insert the session, or update the row it was read from. On PostgreSQL one statement
    (`record_native_session`) either way."""
    if connection.vendor == "postgresql":
        queries.execute(
            "record_native_session",
            {
                "task_id": session.task_id,
                "bot": session.bot,
                "executor": session.executor,
                "session_id": session.session_id,
                "worker_id": session.worker_id,
                "seen_through_message_id": session.seen_through_message_id,
                "seen_message_ids": json.dumps(session.seen_message_ids),
                "context_tokens": session.context_tokens,
                "turns": session.turns,
                "now": timezone.now(),
            },
        )
    elif session.pk is None:
        session.save(force_insert=True)
    else:
        session.save(update_fields=_SESSION_WRITES)
