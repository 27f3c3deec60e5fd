"""Benchmark: prompt budgets from the bot's model against the fixed caps alone.

Run from the repository root::

    .venv/bin/python bench/bench_model_budgets.py          # ~30 s

A 500-turn conversation with a mix of long results (sizes from 100 chars to 1 MB: English prose,
Python code and Chinese; texts over the spill threshold stored as previews with an artifact
pointer, every stored text with its ``cl100k_base`` and ``o200k_base`` counts cached, as
ingestion does — the history input holds the counts of the encoding the prompt is counted in,
as ``tasks.history`` loads them) is built
for two models from the shipped model table: ``gpt-4o`` (a 128,000-token window, counted exactly
with ``o200k_base``) and ``claude-sonnet-4-5`` (200,000 tokens, counted with the Claude
estimate), each with its executor's default overhead.

For each model it prints the effective budget (``budgets.effective_max_tokens``), the prompt's
size and build time under three policies:

* fixed caps — Baton's built-in policy (20 messages, 40,000 chars, 4,000 per message), no token
  budget, counted with ``cl100k_base``: what every bot got before budgets followed the model;
* fixed caps + model budget — the same caps, and ``max_tokens_fraction`` 0.5 of the model's room,
  counted in the model's tokens. Timed interleaved with the first: the ratio is the cost of the
  model-aware budget (target: no slower than 1.2x);
* model budget alone — message and char caps off (4,000 per message kept): the window's share
  is what bounds the prompt.

Only ``build_prompt`` is timed. Nothing here is a test: no timing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

import django  # noqa: E402

django.setup()  # the budget reads the bot's model (no query runs here)

from bench_prompt_build import (  # noqa: E402
    _ingest,
    _original_texts,
    interleaved_ms,
    prompt_input,
)

from backend.dispatch.budgets import (  # noqa: E402
    DEFAULT_OVERHEAD_TOKENS,
    ModelWindow,
    TokenBudget,
    effective_max_tokens,
)
from backend.prompting import PromptInput, PromptPolicy, build_prompt  # noqa: E402
from backend.prompting.tokenizers import counting_for  # noqa: E402
from backend.prompting.units import DEFAULT_TOKEN_ENCODING, count_tokens  # noqa: E402
from backend.tasks.history import CACHED_TOKEN_COUNTS, cached_counts_encoding  # noqa: E402

TURNS = 500
FIXED = PromptPolicy(max_tokens_fraction=None)
MODEL_AWARE = PromptPolicy(max_tokens_fraction=0.5)
BUDGET_ALONE = PromptPolicy(max_messages=None, max_chars=None, max_tokens_fraction=0.5)

# The shipped model table's rows (backend/tasks/migrations/0013_budget_model_table.py).
MODELS = {
    "gpt-4o (128k)": ModelWindow(
        model="gpt-4o",
        context_window=128_000,
        max_output_tokens=16_384,
        max_input_tokens=None,
        counting=counting_for("o200k_base"),
        overhead_tokens=DEFAULT_OVERHEAD_TOKENS["codex"],
        overhead_learned=False,
    ),
    "claude-sonnet-4-5 (200k)": ModelWindow(
        model="claude-sonnet-4-5",
        context_window=200_000,
        max_output_tokens=64_000,
        max_input_tokens=None,
        counting=counting_for("claude_3"),
        overhead_tokens=DEFAULT_OVERHEAD_TOKENS["claude_code"],
        overhead_learned=False,
    ),
}


def history_input(encoding: str) -> PromptInput:
    """The conversation as dispatch loads it for a prompt counted in `encoding`."""
    rng = random.Random(3)
    texts = _original_texts(TURNS, seed=7)
    history = [_ingest(index + 1, text, rng) for index, text in enumerate(texts)]
    cached = cached_counts_encoding(encoding)
    if cached != DEFAULT_TOKEN_ENCODING:
        history = [
            message.model_copy(update={"token_count": count_tokens(message.text, cached)})
            for message in history
        ]
    loaded = prompt_input(history)
    current = loaded.current.model_copy(
        update={"token_count": count_tokens(loaded.current.text, cached)}
    )
    return loaded.model_copy(update={"current": current, "token_count_encoding": cached})


def size(budget: TokenBudget, prompt: PromptInput) -> str:
    """What the prompt holds, checked: its count is exact and within the budget."""
    build = build_prompt(prompt, budget.policy)
    report = build.report
    exact = count_tokens(build.text, budget.policy.token_encoding)
    assert report.tokens == exact, (report.tokens, exact)
    model_tokens = budget.model_tokens(report.tokens)
    if budget.effective_max_tokens is not None:
        assert model_tokens <= budget.effective_max_tokens
    unit = "est. model" if budget.estimated else budget.policy.token_encoding
    return (
        f"{report.messages_included:3} messages, {report.chars:7,} chars, "
        f"{model_tokens:7,} tokens ({unit})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="timed builds per policy")
    args = parser.parse_args()

    fixed = effective_max_tokens(policy=FIXED, window=None)
    inputs = {encoding: history_input(encoding) for encoding in CACHED_TOKEN_COUNTS}
    whole = sum(message.original_chars for message in inputs[DEFAULT_TOKEN_ENCODING].history)
    print(f"{TURNS}-turn conversation, {whole:,} chars")
    for name, window in MODELS.items():
        aware = effective_max_tokens(policy=MODEL_AWARE, window=window)
        alone = effective_max_tokens(policy=BUDGET_ALONE, window=window)
        budgets = (fixed, aware, alone)
        prompts = [inputs[budget.policy.token_encoding] for budget in budgets]
        gc.collect()
        gc.freeze()
        samples = interleaved_ms(
            [
                lambda b=budget, p=prompt: build_prompt(p, b.policy)
                for budget, prompt in zip(budgets, prompts, strict=True)
            ],
            args.runs,
        )
        gc.unfreeze()
        medians = [statistics.median(times) for times in samples]
        print(
            f"\n{name}: reserve {aware.output_reserve_tokens:,}, overhead "
            f"{aware.overhead_tokens:,}, effective budget {aware.effective_max_tokens:,} tokens "
            f"(builder: {aware.policy.max_tokens:,} {aware.policy.token_encoding})"
        )
        for label, budget, prompt, median in zip(
            ("fixed caps", "fixed caps + model budget", "model budget alone"),
            budgets,
            prompts,
            medians,
            strict=True,
        ):
            print(f"  {label:<26} {median:7.2f} ms  {size(budget, prompt)}")
        print(f"  {'model-aware / fixed':<26} {medians[1] / medians[0]:7.2f}x  (target <= 1.2x)")


if __name__ == "__main__":
    main()
