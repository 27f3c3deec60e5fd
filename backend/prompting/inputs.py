"""The plain, typed inputs of a prompt build.

The Django side turns rows into these models; the core never sees a model instance or a
queryset. Everything here is frozen and validated at construction, so the builder can trust it:

* ``history`` is oldest first with strictly increasing ``message_id``s, all older than the
  current message, and holds only COMPLETED or FAILED turns (the caller filters PENDING, RUNNING
  and CANCELLED ones).
* A spilled message carries only its bounded preview: ``preview_head`` and ``preview_tail`` are
  the first and last code points of the original, ``total_chars`` is the original length,
  ``text`` must equal the rendered preview ``head + …N chars truncated… + tail`` with
  ``N = total_chars - len(head) - len(tail)`` (build it with :func:`make_preview`), and
  ``artifact`` says where the whole text is. A message that did not spill may carry an
  ``artifact`` too (its whole text stored when an earlier prompt cut it).
* ``token_count``, when given, is the exact count of ``text`` under ``token_count_encoding``
  (:func:`count_tokens`); the builder trusts it instead of re-encoding.
* A FAILED assistant turn has ``failed=True``; its ``error`` (or, when ``error`` is ``None``,
  its ``text``) is what the prompt shows, marked as failed.
* ``summary``, when given, is a rolling summary of messages ``first_message_id`` to
  ``last_message_id`` (all older than the current message), stored like a message (whole, or
  its preview when it spilled) and always as an artifact, which a cut of it points to.
* A USER turn sent while an ASSISTANT turn was answering, and given to it (a steer), has
  ``steered_into_message_id`` (that turn's) and ``steered_into_bot`` (its bot, when known): its
  label line says so. Its message_id is larger than that turn's, so it comes after the answer.
* Names (``sender``, ``bot``, ``steered_into_bot``) appear inside ``User[…]`` /
  ``Assistant[…]`` labels, so they are 1–64 printable characters without square brackets.

The O(n) work on the history — checking the order, counting turns by role for the omission
notice, finding the task's first user message — happens here, once, when the input is built
(the caller already pays O(n) to build the tuple). :func:`build_prompt` itself then only touches
the messages it may include, so its cost grows with the budget, not with the history.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from backend.prompting.truncate import Elision, Preview
from backend.prompting.units import DEFAULT_TOKEN_ENCODING

NAME_MAX_CHARS = 64
_ARTIFACT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_ARTIFACT_KIND = re.compile(r"[a-z0-9_]{1,64}")


class Role(StrEnum):
    """Who speaks in a turn; the values are the ones turns are stored with."""

    USER = "USER"
    ASSISTANT = "ASSISTANT"


def validate_name(value: str | None) -> str | None:
    """A sender or bot name that can sit inside a role label's brackets."""
    if value is None:
        return None
    if not 1 <= len(value) <= NAME_MAX_CHARS:
        raise ValueError(f"must be 1 to {NAME_MAX_CHARS} characters")
    if not value.isprintable() or "[" in value or "]" in value:
        raise ValueError("must be printable, on one line and without square brackets")
    return value


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ArtifactPointer(_Frozen):
    """Where the executor finds the full text of a message that was spilled into an artifact."""

    artifact_id: str
    kind: str
    total_chars: int = Field(ge=0)
    total_lines: int = Field(ge=0)
    workspace_path: str

    @field_validator("artifact_id")
    @classmethod
    def _id_is_token(cls, value: str) -> str:
        if not _ARTIFACT_ID.fullmatch(value):
            raise ValueError("must be 1-128 characters of [A-Za-z0-9_-]")
        return value

    @field_validator("kind")
    @classmethod
    def _kind_is_slug(cls, value: str) -> str:
        if not _ARTIFACT_KIND.fullmatch(value):
            raise ValueError("must be 1-64 characters of [a-z0-9_]")
        return value

    @field_validator("workspace_path")
    @classmethod
    def _path_is_one_line(cls, value: str) -> str:
        if not value or len(value) > 1024 or not value.isprintable():
            raise ValueError("must be 1-1024 printable characters on one line")
        return value


class _StoredText(_Frozen):
    """A text as ingestion stored it: whole, or (when it spilled) as its bounded preview."""

    text: str
    token_count: int | None = Field(default=None, ge=0)
    total_chars: int | None = Field(default=None, ge=0)
    preview_head: str | None = None
    preview_tail: str | None = None
    preview_middle: tuple[str, ...] = ()
    preview_elisions: tuple[Elision, ...] = ()
    """A kind-aware preview's parts between head and tail, and its elisions (see
    :class:`~backend.prompting.truncate.Preview`); empty for a head + tail preview."""
    artifact: ArtifactPointer | None = None

    @model_validator(mode="after")
    def _preview_is_consistent(self) -> _StoredText:
        if (self.preview_head is None) != (self.preview_tail is None):
            raise ValueError("preview_head and preview_tail come together")
        if self.preview_head is not None and self.preview_tail is not None:
            kept = (
                len(self.preview_head) + len(self.preview_tail) + sum(map(len, self.preview_middle))
            )
            if self.total_chars is None or self.total_chars < kept:
                raise ValueError("a preview needs total_chars >= the code points it keeps")
            if self.text != self.preview.text:  # type: ignore[union-attr]
                raise ValueError("text must be the rendered preview (see make_preview)")
            if self.artifact is None:
                raise ValueError("a preview needs the artifact that holds the whole text")
        elif self.preview_middle or self.preview_elisions:
            raise ValueError("preview_middle and preview_elisions need preview_head and _tail")
        elif self.total_chars is not None and self.total_chars != len(self.text):
            raise ValueError("total_chars must equal len(text) for a message without preview")
        return self

    @property
    def preview(self) -> Preview | None:
        if self.preview_head is None or self.preview_tail is None or self.total_chars is None:
            return None
        return Preview(
            head=self.preview_head,
            tail=self.preview_tail,
            total_chars=self.total_chars,
            middle=self.preview_middle,
            elisions=self.preview_elisions,
        )


class HistoryMessage(_StoredText):
    """One COMPLETED or FAILED turn of the task, as ingestion stored it."""

    message_id: int
    role: Role
    sender: str | None = None
    bot: str | None = None
    failed: bool = False
    error: str | None = None
    steered_into_message_id: int | None = None
    """A USER turn given to a running ASSISTANT turn (a steer): that turn's message_id."""
    steered_into_bot: str | None = None
    """The bot of the turn ``steered_into_message_id`` (None when it has none or is not known)."""

    @field_validator("sender", "bot", "steered_into_bot")
    @classmethod
    def _names_fit_labels(cls, value: str | None) -> str | None:
        return validate_name(value)

    @model_validator(mode="after")
    def _is_consistent(self) -> HistoryMessage:
        if self.failed and self.role is not Role.ASSISTANT:
            raise ValueError("only assistant turns can be failed")
        if self.steered_into_message_id is not None:
            if self.role is not Role.USER:
                raise ValueError("only user turns are steered into a running turn")
            if self.steered_into_message_id >= self.message_id:
                raise ValueError("a steer is sent after the turn it is given to started")
        if self.steered_into_bot is not None and self.steered_into_message_id is None:
            raise ValueError("steered_into_bot needs steered_into_message_id")
        return self

    @property
    def shows_error(self) -> bool:
        """A failed turn shows its error message instead of its text."""
        return self.failed and self.error is not None

    @property
    def original_chars(self) -> int:
        """Length of the full original content, in code points."""
        if self.shows_error:
            return len(self.error or "")
        return self.total_chars if self.total_chars is not None else len(self.text)


class HistorySummary(_StoredText):
    """A rolling summary of the task's messages ``first_message_id`` to ``last_message_id``:
    a summary job's stored result (``text``, or its preview when it spilled), whole in
    ``artifact``. The builder shows it right after the omission notice when the history omits
    messages (see ``summary``)."""

    first_message_id: int = Field(ge=1)
    last_message_id: int = Field(ge=1)
    artifact: ArtifactPointer
    """Where the whole summary is: a cut of it points there."""
    message_id: int | None = None
    """The stored summary's own id (its summary job's), for the record; never shown."""

    @model_validator(mode="after")
    def _covers_a_range(self) -> HistorySummary:
        if self.first_message_id > self.last_message_id:
            raise ValueError("first_message_id must not be after last_message_id")
        if not self.text:
            raise ValueError("a summary has text")
        return self


class CurrentMessage(_Frozen):
    """The user message this turn answers; it is never dropped, only cut when too long."""

    message_id: int
    text: str
    sender: str | None = None
    token_count: int | None = Field(default=None, ge=0)
    artifact: ArtifactPointer | None = None
    """Where the whole message is, when it was stored as an artifact: a cut points there."""

    @field_validator("sender")
    @classmethod
    def _names_fit_labels(cls, value: str | None) -> str | None:
        return validate_name(value)


class PromptInput(_Frozen):
    """Everything one build needs besides the policy."""

    history: tuple[HistoryMessage, ...] = ()
    current: CurrentMessage
    previous_result: str | None = None
    previous_result_bot: str | None = None
    previous_result_token_count: int | None = Field(default=None, ge=0)
    previous_result_artifact: ArtifactPointer | None = None
    """Where the whole previous result is, when it was stored as an artifact."""
    previous_result_removed_chars: int = Field(default=0, ge=0)
    """Characters of the whole result that ``previous_result`` (its stored preview) leaves out."""
    previous_result_preview_head: str | None = None
    previous_result_preview_tail: str | None = None
    previous_result_preview_middle: tuple[str, ...] = ()
    previous_result_preview_elisions: tuple[Elision, ...] = ()
    """When the previous result spilled: the parts its stored preview (``previous_result``)
    keeps, so a further cut counts against the whole result."""
    previous_result_message_id: int | None = None
    """The previous step's turn: a cut of its unstored result points to the content address."""
    is_group_chat: bool = False
    multi_bot: bool = False
    first_user_message_id: int | None = None
    earlier_user_messages: int = Field(default=0, ge=0)
    """USER turns older than ``history`` that the caller did not load (counted as omitted)."""
    earlier_assistant_messages: int = Field(default=0, ge=0)
    """ASSISTANT turns older than ``history`` that the caller did not load."""
    token_count_encoding: str = DEFAULT_TOKEN_ENCODING
    """The encoding the cached ``token_count``s were computed with."""
    transcript: ArtifactPointer | None = None
    """Where the whole conversation before the current message is (a transcript rendered by
    ``backend.prompting.transcript``, also split into one file per turn by ``turn_files``):
    the omission notice points there."""
    summary: HistorySummary | None = None
    """The latest finished summary of earlier messages (all older than the current message):
    shown after the omission notice when the history omits messages and it fits."""

    _user_messages: int = PrivateAttr(default=0)
    _assistant_messages: int = PrivateAttr(default=0)
    _first_user_index: int | None = PrivateAttr(default=None)

    @field_validator("previous_result_bot")
    @classmethod
    def _names_fit_labels(cls, value: str | None) -> str | None:
        return validate_name(value)

    @model_validator(mode="after")
    def _previous_preview_is_consistent(self) -> PromptInput:
        head, tail = self.previous_result_preview_head, self.previous_result_preview_tail
        if (head is None) != (tail is None):
            raise ValueError("previous_result_preview_head and _tail come together")
        if head is not None and tail is not None:
            if self.previous_result != self.previous_result_preview.text:  # type: ignore[union-attr]
                raise ValueError("previous_result must be the rendered preview of its parts")
        elif self.previous_result_preview_middle or self.previous_result_preview_elisions:
            raise ValueError("a preview's middle and elisions need its head and tail")
        return self

    @property
    def previous_result_preview(self) -> Preview | None:
        head, tail = self.previous_result_preview_head, self.previous_result_preview_tail
        if head is None or tail is None:
            return None
        middle = self.previous_result_preview_middle
        total = len(head) + len(tail) + sum(map(len, middle)) + self.previous_result_removed_chars
        return Preview(
            head=head,
            tail=tail,
            total_chars=total,
            middle=middle,
            elisions=self.previous_result_preview_elisions,
        )

    @model_validator(mode="after")
    def _history_is_ordered(self) -> PromptInput:
        previous_id: int | None = None
        users = 0
        for message in self.history:
            if previous_id is not None and message.message_id <= previous_id:
                raise ValueError("history must be oldest first with increasing message_id")
            previous_id = message.message_id
            if message.role is Role.USER:
                users += 1
        if previous_id is not None and previous_id >= self.current.message_id:
            raise ValueError("history must be older than the current message")
        if self.summary is not None and self.summary.last_message_id >= self.current.message_id:
            raise ValueError("a summary covers messages older than the current message")
        self._user_messages = users + self.earlier_user_messages
        self._assistant_messages = len(self.history) - users + self.earlier_assistant_messages
        self._first_user_index = self._find_first_user_message()
        return self

    def _find_first_user_message(self) -> int | None:
        if self.first_user_message_id is None:
            if self.earlier_user_messages:
                return None  # the first user message is older than the loaded history
            return next(
                (i for i, message in enumerate(self.history) if message.role is Role.USER), None
            )
        index = bisect_left(self.history, self.first_user_message_id, key=_message_id)
        if index == len(self.history) or self.history[index].message_id != (
            self.first_user_message_id
        ):
            return None
        if self.history[index].role is not Role.USER:
            raise ValueError("first_user_message_id names an assistant turn")
        return index

    def with_transcript(self, transcript: ArtifactPointer) -> PromptInput:
        """The same input, its omission notice pointing to ``transcript``: a copy, not
        validated again (the pointer is a validated model, and no check relates it to the
        other fields)."""
        return self.model_copy(update={"transcript": transcript})

    @property
    def user_messages(self) -> int:
        """USER turns of the whole history, loaded or not."""
        return self._user_messages

    @property
    def assistant_messages(self) -> int:
        """ASSISTANT turns of the whole history, loaded or not."""
        return self._assistant_messages

    @property
    def first_user_index(self) -> int | None:
        """Index in ``history`` of the task's first user message, when it is loaded."""
        return self._first_user_index


def _message_id(message: HistoryMessage) -> int:
    return message.message_id
