"""A task's conversation as its admin page shows it: one entry per turn, in message order.

Each entry gives the turn's facts on one line (its name, "message 7", as Baton names a turn
everywhere: `Subtask.name`; role and sender or bot, executor, status, sizes, when) and its
text as the model sees it: `history_text`, which for a text that
spilled at ingestion is the stored kind-aware preview whose markers count what was left out of
the whole text. It is shown as stored, never cut again, with the whole text's true size beside
the preview's and a link to the whole text (the artifact's content, which honours permissions).
What an operator rarely needs (lease, usage, raw fields) is folded. A follow-up steered into a
running turn says which turn it was given to and what became of it ("steered into message 7 ·
received 12:03:04"), and that turn lists the steers it received.

Layers above tasks say more about a turn (dispatch: the prompts each assistant turn was sent)
through `register_turn_notes`, as they register their admins with the admin site: tasks never
imports them. The page costs a fixed number of queries however many turns the task has: one
for the turns, one for the task's steers and one per registered note.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.prompting.inputs import Role
from backend.prompting.truncate import truncate_middle
from backend.prompting.units import Unit
from backend.tasks.models import Steer, SteerStatus, Subtask, Task, message_name

# An error is shown in full up to this size; a longer one is cut with a marker that counts
# what was left out of it (errors are not ingested, so they have no stored preview).
ERROR_SHOWN_CHARS = 2_000

# Columns the conversation never reads: the whole texts (the preview stands for them) and the
# raw progress. `history_text` is bounded at ingestion, so reading it costs a bounded amount.
UNREAD_COLUMNS = ("message", "result", "progress_events", "partial_text", "preview_layout")

# Notes a layer above tasks puts beside turns: given the task and its turns, HTML (already
# escaped) by subtask id.
TurnNotes = Callable[[Task, Sequence[Subtask]], Mapping[int, SafeString]]
_turn_notes: list[TurnNotes] = []


def register_turn_notes(notes: TurnNotes) -> None:
    """Add `notes` beside the turns of every task page (once per function)."""
    if notes not in _turn_notes:
        _turn_notes.append(notes)


@dataclass(frozen=True)
class ConversationEntry:
    """One turn as the conversation shows it."""

    turn: Subtask
    text: str  # what the model sees: the whole text, or the stored preview of a spilled one
    shown_chars: int
    whole_text_url: str  # "" when the text shown is the whole text and no artifact holds it
    error: str
    usage: str
    notes: tuple[SafeString, ...]
    steer: str = ""  # a steered USER turn: the turn it was given to, and what became of it
    steers_received: str = ""  # an ASSISTANT turn given steers: their messages

    @property
    def is_assistant(self) -> bool:
        return self.turn.role == Role.ASSISTANT

    @property
    def who(self) -> str:
        """ "User", "User alice", "Assistant codex": the role and the sender or the bot."""
        name = self.turn.bot if self.is_assistant else self.turn.sender
        return f"{self.turn.get_role_display()} {name}".strip()


def conversation_entries(*, task: Task, turns: Sequence[Subtask]) -> list[ConversationEntry]:
    """The entries for `turns` (read by `conversation_turns`), with every registered note and
    what the task's steers say of them (one query for all of them)."""
    notes_by_source = [notes(task, turns) for notes in _turn_notes]
    steer_lines, received = _steer_facts(task=task)
    return [
        ConversationEntry(
            turn=turn,
            text=turn.history_text,
            shown_chars=len(turn.history_text),
            whole_text_url=(
                reverse("artifact-content", kwargs={"artifact_id": turn.artifact_id})
                if turn.artifact_id
                else ""
            ),
            error=truncate_middle(turn.error, ERROR_SHOWN_CHARS, Unit.CHARS),
            usage="" if turn.usage is None else json.dumps(turn.usage, indent=2, sort_keys=True),
            notes=tuple(notes[turn.pk] for notes in notes_by_source if turn.pk in notes),
            steer=steer_lines.get(turn.pk, ""),
            steers_received=received.get(turn.pk, ""),
        )
        for turn in turns
    ]


def _steer_facts(*, task: Task) -> tuple[dict[int, str], dict[int, str]]:
    """By subtask id, what the task's steers say (one query): of each steered USER turn, the
    turn it was given to and what became of it; of each turn given steers, those it received."""
    steers = (
        Steer.objects.filter(task_id=task.pk)
        .order_by("message__message_id")
        .values_list(
            "message_id",
            "message__message_id",
            "target_id",
            "target__message_id",
            "status",
            "delivered_at",
            "fallback_reason",
        )
    )
    lines: dict[int, str] = {}
    received: dict[int, list[str]] = {}
    for user_turn, message_id, target, target_message_id, status, delivered_at, reason in steers:
        outcome = _steer_outcome(status, delivered_at, reason)
        lines[user_turn] = f"steered into {message_name(target_message_id)} · {outcome}"
        if status == SteerStatus.DELIVERED:
            received.setdefault(target, []).append(message_name(message_id))
    return lines, {
        target: "received steers: " + ", ".join(names) for target, names in received.items()
    }


def _steer_outcome(status: str, delivered_at: datetime | None, fallback_reason: str) -> str:
    """What became of a steer, as its turn's fact line says it."""
    if status == SteerStatus.DELIVERED and delivered_at is not None:
        return f"received {timezone.localtime(delivered_at):%H:%M:%S}"
    if status == SteerStatus.QUEUED:
        why = f" ({fallback_reason})" if fallback_reason else ""
        return f"fell back to the queue{why}"
    if status == SteerStatus.SUPERSEDED:
        return "left to the round of the message that stopped that turn"
    if status == SteerStatus.CANCELLED:
        return "cancelled"
    return "waiting"


def conversation_turns(turns: QuerySet[Subtask]) -> QuerySet[Subtask]:
    """`turns` as the conversation reads them: in message order, without their whole texts."""
    return turns.defer(*UNREAD_COLUMNS).order_by("message_id")


class ConversationInline(ReadOnlyAdminMixin, admin.TabularInline[Subtask, Task]):
    """The task's turns as a conversation (`admin/tasks/task/conversation.html`)."""

    model = Subtask
    extra = 0
    # The template shows each turn, and the formset edits nothing: its forms have no fields
    # (every field named is read-only), so they read no deferred column.
    fields = readonly_fields = ("message_id",)
    template = "admin/tasks/task/conversation.html"
    verbose_name = "turn"
    verbose_name_plural = "conversation"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Subtask]:
        return conversation_turns(super().get_queryset(request))
