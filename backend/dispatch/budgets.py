"""A turn's token budget from its bot's model: the one place the effective `max_tokens` is decided.

An absolute cap knows nothing of the model that will read the prompt. With the bot's model in
the model table (`LanguageModel`), the budget follows the model's window, the way Deep Agents
and Wegent size their compaction as a share of `max_input_tokens`:

    window  = the bot's own context_window, else the model table's
    reserve = min(the model's max output, clamp(10 % of the window, 16,000, 48,000))
    room    = min(window - reserve, the model's max_input_tokens) - overhead
    share   = floor(max_tokens_fraction × room)
    budget  = min(share, max_tokens)        (whichever are set; at least MIN_MAX_TOKENS)

`reserve` is Wegent's output reserve, held below what the model can emit at all. `overhead` is
what the executor itself puts before Baton's prompt (its system prompt and tool definitions):
learned per bot from the executor's usage reports (`learn_overhead`: about the smallest input
tokens minus the prompt's tokens of its recent full prompts, so that no one report moves it),
and until then a conservative default per executor. The budget is in the model's own tokens;
the builder counts with the encoding of the model's tokenizer (`prompting.tokenizers`), exactly
for OpenAI's models, and for Claude with an estimate that overcounts, so it receives the budget
converted to counted tokens. The same
usage reports teach that estimate's factor per bot (`learn_token_ratio`: a fit of reported
input tokens against counted prompt tokens over the bot's recent full-prompt turns,
`tokenizers.fit_ratio`, bounded on the safe side), stored on the bot and used here in place of
the shipped factor; a PromptReport records the factor it was converted with.

Without a known model, the policy applies as it is: `max_tokens` counted with its
`token_encoding`. The policy the builder receives carries the resolved `max_tokens` and
`token_encoding`, and a PromptReport snapshots that policy, so a replay rebuilds the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import F

from backend.configuration_cache import CONFIGURATION
from backend.dispatch.models import PromptReport
from backend.events import log_event
from backend.executor_kinds import EXECUTOR_KINDS
from backend.prompting.policy import MIN_MAX_TOKENS, PromptPolicy
from backend.prompting.tokenizers import TokenCounting, counting_for, fit_ratio, unknown_counting
from backend.tasks.models import Bot, LanguageModel, Subtask, SubtaskStatus
from backend.tasks.selectors import bots_for_turns

OUTPUT_RESERVE_SHARE = 0.10
OUTPUT_RESERVE_MIN = 16_000
OUTPUT_RESERVE_MAX = 48_000
"""Wegent's reserve for the model's answer: clamp(10 % of the window, 16k, 48k) tokens."""

DEFAULT_OVERHEAD_TOKENS = {kind.name: kind.default_overhead_tokens for kind in EXECUTOR_KINDS}
"""Until a bot's usage reports teach Baton better: per executor kind, a generous guess of what
its own system prompt and tool definitions take (`ExecutorKindSpec.default_overhead_tokens`)."""

RATIO_SAMPLES = 50
"""The bot's most recent full-prompt turns a learned token ratio is fitted on."""


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """What a budget needs to know of a bot's model."""

    model: str
    context_window: int
    max_output_tokens: int | None
    max_input_tokens: int | None
    counting: TokenCounting | None
    """None: the model table does not list the model (counted with the policy's encoding)."""
    overhead_tokens: int
    overhead_learned: bool

    @property
    def input_window(self) -> int:
        """The most input the model takes: its input cap, else its whole window."""
        if self.max_input_tokens is not None:
            return min(self.max_input_tokens, self.context_window)
        return self.context_window


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """A turn's budget and how it came about (a PromptReport records it)."""

    policy: PromptPolicy
    """The policy the builder receives: `max_tokens` and `token_encoding` resolved."""
    window: ModelWindow | None
    max_tokens_fraction: float | None
    output_reserve_tokens: int
    overhead_tokens: int
    effective_max_tokens: int | None
    """The budget in the model's tokens (the policy's `max_tokens` without a known model)."""
    counting: TokenCounting | None
    """How the prompt's tokens become the model's (None: counted with the policy's encoding)."""

    @property
    def context_window(self) -> int | None:
        return self.window.context_window if self.window is not None else None

    def model_tokens(self, counted: int) -> int:
        """The prompt's size in the model's tokens (at least, for an estimate)."""
        return self.counting.model_tokens(counted) if self.counting is not None else counted

    @property
    def estimated(self) -> bool:
        return self.counting is not None and self.counting.estimated


def output_reserve(*, context_window: int, max_output_tokens: int | None) -> int:
    """Tokens kept free for the model's answer."""
    reserve = round(context_window * OUTPUT_RESERVE_SHARE)
    reserve = min(max(reserve, OUTPUT_RESERVE_MIN), OUTPUT_RESERVE_MAX)
    return min(reserve, max_output_tokens) if max_output_tokens is not None else reserve


def effective_max_tokens(
    *, policy: PromptPolicy, window: ModelWindow | None, turn_cap: int | None = None
) -> TokenBudget:
    """The budget a turn's prompt gets under `policy` for a bot whose model is `window`.

    Every bound on the prompt's tokens is a candidate and the smallest wins: the policy's
    absolute `max_tokens`, its `max_tokens_fraction` of the model's room, and the turn's own
    `turn_cap` (`Subtask.token_cap`, what a context overflow taught, in the tokens the builder
    counts: half of what the refused prompt counted, see `overflow`).
    """
    fraction = policy.max_tokens_fraction
    if window is None:
        capped = _smallest(policy.max_tokens, turn_cap)
        if capped != policy.max_tokens:
            policy = policy.model_copy(update={"max_tokens": capped})
        return TokenBudget(
            policy=policy,
            window=None,
            max_tokens_fraction=fraction,
            output_reserve_tokens=0,
            overhead_tokens=0,
            effective_max_tokens=capped,
            counting=None,
        )
    counting = window.counting or unknown_counting(policy.token_encoding)
    reserve = output_reserve(
        context_window=window.context_window, max_output_tokens=window.max_output_tokens
    )
    room = window.context_window - reserve
    if window.max_input_tokens is not None:
        room = min(room, window.max_input_tokens)
    room -= window.overhead_tokens
    bounds = [policy.max_tokens]
    if fraction is not None:
        bounds.append(math.floor(fraction * max(room, 0)))
    effective = min((bound for bound in bounds if bound is not None), default=None)
    counted: int | None = None
    if effective is not None:
        # The builder needs room for the prompt's structure: a window too small for that gets
        # the smallest budget a prompt can have, and the report says so.
        counted = max(counting.counted_budget(effective), MIN_MAX_TOKENS)
        effective = max(effective, counting.model_tokens(counted))
    if turn_cap is not None and (counted is None or turn_cap < counted):
        counted = turn_cap
        effective = counting.model_tokens(counted)
    return TokenBudget(
        policy=policy.model_copy(
            update={"max_tokens": counted, "token_encoding": counting.encoding}
        ),
        window=window,
        max_tokens_fraction=fraction,
        output_reserve_tokens=reserve,
        overhead_tokens=window.overhead_tokens,
        effective_max_tokens=effective,
        counting=counting,
    )


def _smallest(*bounds: int | None) -> int | None:
    return min((bound for bound in bounds if bound is not None), default=None)


def model_windows_for(
    bots: Iterable[Bot], *, configuration_version: int | None = None
) -> dict[int, ModelWindow]:
    """Per bot id: its model's window, for the bots whose model the table lists or whose
    own `context_window` is set (one query, none when this process read the same entries
    under `configuration_version`, see `backend.configuration_cache`)."""
    bots = list(bots)
    names = {name for bot in bots if bot.model for name in LanguageModel.lookup_names(bot.model)}
    listed = tuple(sorted(names))
    rows = (
        {
            row.name: row
            for row in CONFIGURATION.read(
                version=configuration_version,
                key=("models", listed),
                load=lambda: tuple(LanguageModel.objects.filter(name__in=listed)),
            )
        }
        if listed
        else {}
    )
    windows = {}
    for bot in bots:
        window = model_window(bot=bot, row=_listed(bot.model, rows))
        if window is not None:
            windows[bot.pk] = window
    return windows


def _listed(model: str, rows: dict[str, LanguageModel]) -> LanguageModel | None:
    """`model`'s row among `rows`, under its own name or its undated one."""
    if not model:
        return None
    return next((rows[name] for name in LanguageModel.lookup_names(model) if name in rows), None)


def turn_window(subtask: Subtask) -> ModelWindow | None:
    """The model window of the bot that answers `subtask` (None when not known)."""
    bot = bots_for_turns([subtask]).get(subtask.pk)
    return model_windows_for([bot]).get(bot.pk) if bot is not None else None


def model_window(*, bot: Bot, row: LanguageModel | None) -> ModelWindow | None:
    """`bot`'s model window: its own context window over the table's `row` (None when neither
    is known). A model the table does not list is counted with the policy's encoding, and its
    counts are reported as estimates."""
    context_window = bot.context_window or (row.context_window if row is not None else None)
    if context_window is None:
        return None
    learned = bot.overhead_tokens is not None
    return ModelWindow(
        model=bot.model,
        context_window=context_window,
        max_output_tokens=row.max_output_tokens if row is not None else None,
        max_input_tokens=row.max_input_tokens if row is not None else None,
        counting=(
            counting_for(row.tokenizer).with_learned(bot.token_ratio_per_mille)
            if row is not None
            else None
        ),
        overhead_tokens=(
            bot.overhead_tokens
            if bot.overhead_tokens is not None
            else DEFAULT_OVERHEAD_TOKENS.get(bot.executor, 0)
        ),
        overhead_learned=learned,
    )


def budget_columns(budget: TokenBudget, *, counted_tokens: int) -> dict[str, Any]:
    """The PromptReport columns that record `budget` for a prompt of `counted_tokens`."""
    return {
        "context_window": budget.context_window,
        "max_tokens_fraction": budget.max_tokens_fraction,
        "output_reserve_tokens": budget.output_reserve_tokens,
        "overhead_tokens": budget.overhead_tokens,
        "effective_max_tokens": budget.effective_max_tokens,
        "model_tokens": budget.model_tokens(counted_tokens),
        "tokens_estimated": budget.estimated,
        "token_ratio_per_mille": budget.counting.per_mille if budget.counting else None,
        "token_ratio_learned": budget.counting is not None and budget.counting.learned,
    }


def learn_from_usage(*, subtask: Subtask, usage: Any) -> bool:
    """After a completed turn that ran its full prompt and reported its input tokens: learn
    its bot's overhead and token ratio again from its recent reports (see `learn_overhead`,
    `learn_token_ratio`). Returns whether the bot changed."""
    input_tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
    if input_tokens is None:
        return False
    bot = bots_for_turns([subtask]).get(subtask.pk)
    if bot is None:
        return False
    changed = learn_overhead(bot=bot)
    return learn_token_ratio(bot=bot) or changed


def _usage_samples(bot: Bot, *, encoding: str | None = None) -> list[tuple[int, int]]:
    """(counted prompt tokens, reported input tokens) of `bot`'s most recent RATIO_SAMPLES
    turns completed with a full prompt built since the bot last changed (its model,
    instructions or tools change what the executor reads), counted with `encoding` when
    given, that reported input tokens."""
    sent = PromptReport.objects.filter(
        subtask__bot=bot.name,
        subtask__status=SubtaskStatus.COMPLETED,
        attempt=F("subtask__attempts"),
        kind="full",
        sent=True,
        created_at__gte=bot.updated_at,
    )
    if encoding is not None:
        sent = sent.filter(token_encoding=encoding)
    return [
        (tokens, input_tokens)
        for tokens, usage in sent.order_by("-id").values_list("tokens", "subtask__usage")[
            :RATIO_SAMPLES
        ]
        if isinstance(usage, dict)
        and isinstance(input_tokens := usage.get("input_tokens"), int)
        and not isinstance(input_tokens, bool)
    ]


def learn_token_ratio(*, bot: Bot) -> bool:
    """Fit `bot`'s token ratio on its recent full-prompt turns (see `tokenizers.fit_ratio`)
    and store it, when its model's tokens are estimated with a factor usage may lower.
    Samples are the turns completed with a full prompt built since the bot last changed (its
    model, instructions or tools change what the executor reads), counted with its model's
    encoding, that reported input tokens. Returns whether the bot changed."""
    bot.refresh_from_db(fields=["overhead_tokens", "token_ratio_per_mille", "updated_at"])
    row = _listed(bot.model, {row.name: row for row in _model_rows(bot)})
    window = model_window(bot=bot, row=row)
    if window is None or row is None:
        return False  # no model table row: counted with the policy's encoding, nothing to fit
    shipped = counting_for(row.tokenizer)
    if shipped.floor_per_mille is None:
        return False  # an exact count, or nothing bounds a learned factor
    samples = _usage_samples(bot, encoding=shipped.encoding)
    fit = fit_ratio(samples, counting=shipped, overhead_tokens=window.overhead_tokens)
    per_mille = fit.per_mille if fit.learned else None
    if per_mille == bot.token_ratio_per_mille:
        return False  # written only when the factor moves: every write is a configuration change
    log_event(
        "token_ratio_learned",
        bot=bot.pk,
        samples=fit.samples,
        slope=round(fit.slope, 4) if fit.slope is not None else None,
        intercept=round(fit.intercept) if fit.intercept is not None else None,
        per_mille=fit.per_mille,
        learned=fit.learned,
    )
    changed = Bot.objects.filter(pk=bot.pk).update(
        token_ratio_per_mille=per_mille, token_ratio_samples=fit.samples
    )
    return changed > 0


def _model_rows(bot: Bot) -> list[LanguageModel]:
    names = LanguageModel.lookup_names(bot.model) if bot.model else []
    return list(LanguageModel.objects.filter(name__in=list(names)))


OVERHEAD_MAX_SHARE = 0.5
"""A reading above this share of the model's window is not what the executor adds to one model
request (its system prompt and tools): a tool loop's sum of many requests, or a report gone
wrong. It is left out; taken, it would leave the prompts no room."""


def learned_overhead(readings: Sequence[int], *, ceiling: int) -> int | None:
    """The executor's overhead from `readings`, each a full-prompt turn's reported input tokens
    minus its prompt's counted tokens: the smallest plausible reading (above 0, at most
    `ceiling`), or with three or more the second smallest. None when no reading is plausible.

    A turn whose agent made several model requests reads the context again each time, so it
    reads high and the smallest reading is the closest; the second smallest keeps that while
    one reading far below the others (a stand-in model, a report gone wrong) cannot set it,
    nor one far above (under the ceiling, it is never the second smallest of three)."""
    plausible = sorted(reading for reading in readings if 0 < reading <= ceiling)
    if not plausible:
        return None
    return plausible[1] if len(plausible) >= 3 else plausible[0]


def learn_overhead(*, bot: Bot) -> bool:
    """Learn what the executor adds to a full prompt (`learned_overhead`) from `bot`'s recent
    usage reports (`_usage_samples`) and store it when it moved.

    The counted tokens, not the estimate, are subtracted: an estimate overcounts, and would
    make the overhead look smaller than it is. Without a known model window nothing is learned
    (only a window's budget subtracts it). Returns whether the bot changed."""
    bot.refresh_from_db(fields=["overhead_tokens", "token_ratio_per_mille", "updated_at"])
    window = model_window(
        bot=bot, row=_listed(bot.model, {row.name: row for row in _model_rows(bot)})
    )
    if window is None:
        return False
    readings = [input_tokens - tokens for tokens, input_tokens in _usage_samples(bot)]
    overhead = learned_overhead(
        readings, ceiling=math.floor(OVERHEAD_MAX_SHARE * window.context_window)
    )
    if overhead is None:
        return False
    return set_learned_overhead(bot=bot, overhead=overhead)


def set_learned_overhead(*, bot: Bot, overhead: int) -> bool:
    """Store `bot`'s learned overhead, written only when it moves: every write is a
    configuration change. Returns whether the bot changed."""
    changed = Bot.objects.filter(pk=bot.pk).exclude(overhead_tokens=overhead)
    return changed.update(overhead_tokens=overhead) > 0
