"""The history policy: every cap on what a prompt may carry, validated once.

A :class:`PromptPolicy` is plain, frozen data. The dispatch app stores one per task type and
resolves it; the builder only reads it. Validation keeps the caps coherent so a build can never
be asked the impossible: every cap is a positive integer up to ``MAX_CAP`` or ``None`` (no
cap), ``per_message_max_chars`` never exceeds ``max_chars``, a preview is shorter than the
spill threshold, ``max_tokens`` leaves room for the prompt's own structure (headers, labels,
markers, the omission notice), and the token encoding loads locally.

Caps apply in this order (docs/architecture.md, "The prompt"): select newest-first up to
``max_messages`` → cap each message at ``per_message_max_chars`` → drop oldest until the history
fits ``max_chars`` and the prompt fits ``max_tokens`` → render oldest-first.

Context passing decides what one pipeline step sees:

=========================  ============================================================
``none``                   the Current Message only (no history, no previous result)
``original_user``          history + Current Message
``previous_bot``           history + Previous Result (no Current Message section)
``original_and_previous``  history + Current Message + Previous Result
=========================  ============================================================

Summaries of omitted history: with ``summaries_enabled``, dispatch schedules a summary job on
``summary_bot`` whenever the turns the history omits and no summary covers yet reach
``summary_threshold_turns``; the builder shows the latest finished summary after the omission
notice, cut at ``summary_max_chars`` (see ``summary``).

With ``enabled=False`` the history is left out and the rest of the mode still applies. When a
mode would show a Previous Result but there is none (the first step of a pipeline), the Current
Message is shown instead, so a step never receives a prompt without its new input.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from backend.prompting.inputs import validate_name
from backend.prompting.units import DEFAULT_TOKEN_ENCODING, bundled_encoding

MIN_MAX_TOKENS = 1024
"""Room the structure of a prompt may need: headers, two labels with 64-char names, markers."""

MAX_CAP = 2**31 - 1
"""The largest integer cap: what the 32-bit integer columns storing a policy hold. No text Baton
accepts comes near it, so a larger cap could only be a mistake."""

MAX_SUMMARY_THRESHOLD_TURNS = 10_000
"""The largest ``summary_threshold_turns``: a re-summary waits for at most this many turns."""

CAP_RANGE = f"must be a positive integer of at most {MAX_CAP}, or null (no cap)"
"""Why an integer cap is refused (the admin and the API say the same)."""


class ContextPassing(StrEnum):
    """What a pipeline step sees besides the history."""

    NONE = "none"
    ORIGINAL_USER = "original_user"
    PREVIOUS_BOT = "previous_bot"
    ORIGINAL_AND_PREVIOUS = "original_and_previous"

    @property
    def includes_history(self) -> bool:
        return self is not ContextPassing.NONE

    @property
    def includes_current(self) -> bool:
        return self is not ContextPassing.PREVIOUS_BOT

    @property
    def includes_previous_result(self) -> bool:
        return self in (ContextPassing.PREVIOUS_BOT, ContextPassing.ORIGINAL_AND_PREVIOUS)


_CAP_FIELDS = (
    "max_messages",
    "max_chars",
    "per_message_max_chars",
    "max_tokens",
    "previous_result_max_chars",
    "current_message_max_chars",
    "summary_max_chars",
)


class PromptPolicy(BaseModel):
    """Caps and switches for one task type's prompts (see the module docstring for the order)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    max_messages: int | None = 20
    max_chars: int | None = 40_000
    per_message_max_chars: int | None = 4_000
    max_tokens: int | None = None
    # Dispatch, not the builder, reads this: with the bot's model known, the prompt may take
    # this share of the model's window (after its output and the executor's own overhead), and
    # the builder receives the smaller of that and ``max_tokens`` (backend/dispatch/budgets.py).
    max_tokens_fraction: float | None = 0.5
    token_encoding: str = DEFAULT_TOKEN_ENCODING
    keep_first_user_message: bool = True
    previous_result_max_chars: int | None = 8_000
    current_message_max_chars: int | None = 32_000
    spill_threshold_chars: int = 16_000
    preview_head_chars: int = 2_000
    preview_tail_chars: int = 2_000
    context_passing: ContextPassing = ContextPassing.ORIGINAL_AND_PREVIOUS
    # Native sessions. The builder does not read these; dispatch does, to choose between the
    # full prompt and a resume prompt holding only the turns a live executor session has not
    # seen. Past this share of the bot's context window, the session starts fresh instead.
    resume_native_sessions: bool = True
    resume_max_context_fraction: float = 0.8
    # Summaries of omitted history. Dispatch reads the first three (whether to schedule a
    # summary job, on which bot, when); the builder reads the cap.
    summaries_enabled: bool = False
    summary_bot: str | None = None
    summary_threshold_turns: int = 20
    summary_max_chars: int | None = 4_000

    @field_validator("summary_bot")
    @classmethod
    def _bot_name_fits_labels(cls, value: str | None) -> str | None:
        return validate_name(value)

    @field_validator("summary_threshold_turns")
    @classmethod
    def _threshold_in_range(cls, value: int) -> int:
        if not 0 < value <= MAX_SUMMARY_THRESHOLD_TURNS:
            raise ValueError(f"must be a positive integer of at most {MAX_SUMMARY_THRESHOLD_TURNS}")
        return value

    @field_validator("resume_max_context_fraction", "max_tokens_fraction")
    @classmethod
    def _fraction_of_the_window(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= 1:
            raise ValueError("must be above 0 and at most 1 (a share of the context window)")
        return value

    @field_validator(*_CAP_FIELDS)
    @classmethod
    def _cap_is_in_range(cls, value: int | None) -> int | None:
        if value is not None and not 0 < value <= MAX_CAP:
            raise ValueError(CAP_RANGE)
        return value

    @field_validator("spill_threshold_chars", "preview_head_chars", "preview_tail_chars")
    @classmethod
    def _size_is_positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be a positive integer")
        return value

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens_leaves_room_for_structure(cls, value: int | None) -> int | None:
        if value is not None and value < MIN_MAX_TOKENS:
            raise ValueError(
                f"must be at least {MIN_MAX_TOKENS}: headers, labels, markers and the omission "
                "notice need room"
            )
        return value

    @field_validator("token_encoding")
    @classmethod
    def _encoding_is_bundled(cls, value: str) -> str:
        return bundled_encoding(value)

    @model_validator(mode="after")
    def _caps_are_coherent(self) -> PromptPolicy:
        if (
            self.per_message_max_chars is not None
            and self.max_chars is not None
            and self.per_message_max_chars > self.max_chars
        ):
            raise ValueError("per_message_max_chars must not exceed max_chars")
        if self.preview_head_chars + self.preview_tail_chars >= self.spill_threshold_chars:
            raise ValueError(
                "preview_head_chars + preview_tail_chars must be below spill_threshold_chars"
            )
        if self.summaries_enabled and self.summary_bot is None:
            raise ValueError("summary_bot must name the bot that writes summaries when enabled")
        return self
