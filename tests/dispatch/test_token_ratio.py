"""The token ratio learned from usage: the fit and its bounds, the budget using it, the report
recording it, and a long English message Claude's shipped factor cut that now fits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.dispatch.budgets import (
    ModelWindow,
    effective_max_tokens,
    learn_token_ratio,
    model_windows_for,
)
from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.dispatch.replay import replay_prompt
from backend.prompting import PromptPolicy
from backend.prompting.tokenizers import COUNTINGS, Tokenizer, counting_for, fit_ratio
from backend.tasks.models import Bot, LanguageModel
from tests.dispatch.test_dispatch_api import create, dispatch, report

CLAUDE_3 = counting_for(Tokenizer.CLAUDE_3)
CLAUDE_4_7 = counting_for(Tokenizer.CLAUDE_4_7)
SIZES = [1_000, 2_500, 4_000, 6_000, 9_000, 12_000, 16_000, 21_000, 28_000, 40_000]


def line(ratio: float, intercept: int, sizes=SIZES) -> list[tuple[int, int]]:
    """Samples exactly on input = ratio × counted + intercept."""
    return [(x, round(ratio * x) + intercept) for x in sizes]


def min_overhead(samples) -> int:
    """What `learn_overhead` keeps from these samples: the smallest input − counted."""
    return min(y - x for x, y in samples)


# --- the fit ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "counting", "overhead", "per_mille", "learned"),
    [
        # Claude 3 reading English at 1.2×: the slope, plus 10 %.
        (line(1.2, 19_000), CLAUDE_3, None, 1_320, True),
        # Text cheaper than the floor (the highest English ratio measured): the floor.
        (line(1.05, 19_000), CLAUDE_3, None, 1_260, True),
        # Dearer than the shipped factor allows after the margin: the shipped factor.
        (line(1.5, 19_000), CLAUDE_3, None, 1_600, False),
        (line(1.5, 19_000), CLAUDE_4_7, None, 1_830, True),
        # A budget subtracting less overhead than the samples show: the samples must still
        # fit what it predicts for them, so the factor rises (here to the shipped one).
        (line(1.2, 19_000), CLAUDE_3, 10_000, 1_600, False),
        (
            line(1.2, 19_000, sizes=[9_000 + 100 * n for n in range(10)]),
            CLAUDE_3,
            None,
            1_600,
            False,
        ),
        (line(1.2, 19_000)[:7], CLAUDE_3, None, 1_600, False),  # too few samples
        # Tool loops read the prompt several times: noise, not a ratio.
        (
            [(x, y * (3 if n % 3 == 0 else 1)) for n, (x, y) in enumerate(line(1.2, 19_000))],
            CLAUDE_3,
            None,
            1_600,
            False,
        ),
        (line(1.2, 19_000), counting_for(Tokenizer.O200K_BASE), None, 1_000, False),  # exact
    ],
    ids=[
        "english",
        "floor",
        "over-shipped",
        "claude-4.7",
        "envelope",
        "narrow-spread",
        "few",
        "tool-loops",
        "exact-count",
    ],
)
def test_the_fit(samples, counting, overhead, per_mille, learned):
    fit = fit_ratio(
        samples,
        counting=counting,
        overhead_tokens=min_overhead(samples) if overhead is None else overhead,
    )
    assert (fit.per_mille, fit.learned) == (per_mille, learned)


def test_the_fit_reports_the_line_it_found():
    fit = fit_ratio(line(1.2, 19_000), counting=CLAUDE_3, overhead_tokens=19_200)
    assert fit.samples == 10
    assert fit.slope == pytest.approx(1.2, abs=1e-4)
    assert fit.intercept == pytest.approx(19_000, abs=5)


samples_strategy = st.lists(
    st.tuples(st.integers(1, 200_000), st.integers(1, 600_000)), min_size=0, max_size=30
)


def noisy_line(draw_ratio, draw_intercept, noise, sizes):
    return [
        (x, max(1, round((draw_ratio * x + draw_intercept) * (1 + e))))
        for x, e in zip(sizes, noise, strict=True)
    ]


line_strategy = st.integers(8, 30).flatmap(
    lambda n: st.builds(
        noisy_line,
        st.floats(0.9, 2.5),
        st.integers(0, 40_000),
        st.lists(st.floats(-0.03, 0.03), min_size=n, max_size=n),
        st.lists(st.integers(200, 150_000), min_size=n, max_size=n),
    )
)


@settings(max_examples=300, deadline=None)
@given(
    samples=st.one_of(samples_strategy, line_strategy),
    tokenizer=st.sampled_from(list(COUNTINGS)),
    overhead=st.integers(0, 60_000),
)
def test_a_learned_ratio_stays_in_its_bounds_and_no_sample_outgrows_the_room(
    samples, tokenizer, overhead
):
    counting = counting_for(tokenizer)
    fit = fit_ratio(samples, counting=counting, overhead_tokens=overhead)
    if not fit.learned:
        assert fit.per_mille == counting.per_mille
        return
    assert counting.floor_per_mille is not None
    assert counting.floor_per_mille <= fit.per_mille < counting.per_mille
    learned = counting.with_learned(fit.per_mille)
    assert (learned.per_mille, learned.learned) == (fit.per_mille, True)
    # A budget converting with it admits a sample's prompt only if the model's room holds
    # what that turn really read: the predicted size is never under the reported one.
    for counted, input_tokens in samples:
        assert learned.model_tokens(counted) + overhead >= input_tokens


def test_a_stored_factor_is_kept_within_its_bounds():
    assert CLAUDE_3.with_learned(None) is CLAUDE_3
    assert CLAUDE_3.with_learned(1_000).per_mille == 1_260  # below the floor: the floor
    assert CLAUDE_3.with_learned(2_000) is CLAUDE_3  # above the shipped factor: shipped
    assert CLAUDE_3.with_learned(1_320).learned
    exact = counting_for(Tokenizer.O200K_BASE)
    assert exact.with_learned(500) is exact  # an exact count learns nothing


# --- the budget ---------------------------------------------------------------------------------


def sonnet(per_mille: int | None, overhead: int = 19_200) -> ModelWindow:
    return ModelWindow(
        model="claude-sonnet-4-5",
        context_window=200_000,
        max_output_tokens=64_000,
        max_input_tokens=None,
        counting=CLAUDE_3.with_learned(per_mille),
        overhead_tokens=overhead,
        overhead_learned=True,
    )


@pytest.mark.parametrize(
    ("per_mille", "counted", "ratio", "learned"),
    [
        (None, 50_250, 1_600, False),  # 0.5 × (200,000 − 20,000 − 19,200) = 80,400 ÷ 1.6
        (1_320, 60_909, 1_320, True),  # ÷ 1.32
        (1_000, 63_809, 1_260, True),  # never below the floor: ÷ 1.26
    ],
)
def test_the_budget_converts_with_the_learned_ratio(per_mille, counted, ratio, learned):
    budget = effective_max_tokens(policy=PromptPolicy(), window=sonnet(per_mille))
    assert budget.effective_max_tokens == 80_400
    assert budget.policy.max_tokens == counted
    assert budget.model_tokens(counted) <= 80_400
    assert budget.counting is not None
    assert (budget.counting.per_mille, budget.counting.learned) == (ratio, learned)


@pytest.mark.django_db
def test_a_bots_window_converts_with_its_learned_ratio():
    bot = Bot.objects.get(name="claude-code")
    assert bot.model == "claude-sonnet-4-5"
    [window] = model_windows_for([bot]).values()
    assert window.counting is not None and window.counting.per_mille == 1_600
    Bot.objects.filter(pk=bot.pk).update(token_ratio_per_mille=1_320, token_ratio_samples=12)
    bot.refresh_from_db()
    [window] = model_windows_for([bot]).values()
    assert window.counting is not None
    assert (window.counting.per_mille, window.counting.learned) == (1_320, True)


# --- learned from the executor's reports, end to end over HTTP ----------------------------------

WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "that",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "it",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
    "they",
    "were",
    "has",
    "been",
    "more",
    "one",
    "all",
    "would",
    "there",
    "when",
    "can",
    "who",
    "about",
    "out",
    "if",
    "so",
    "what",
    "deployment",
    "migration",
    "release",
    "version",
    "server",
    "client",
    "request",
    "response",
    "cache",
    "replica",
    "database",
    "query",
    "index",
    "table",
    "schema",
    "backup",
    "latency",
    "timeout",
    "retry",
    "budget",
    "error",
    "warning",
    "incident",
    "outage",
    "customer",
    "support",
    "engineer",
    "review",
    "change",
    "commit",
    "branch",
    "merge",
    "build",
    "test",
    "failure",
    "metric",
    "graph",
    "dashboard",
    "alert",
    "threshold",
    "memory",
    "disk",
    "network",
    "cluster",
    "service",
    "endpoint",
    "payload",
    "header",
    "token",
    "session",
    "worker",
    "queue",
    "message",
    "history",
    "summary",
    "report",
    "policy",
    "slowly",
    "quickly",
    "twice",
    "nearly",
    "already",
    "still",
    "usually",
    "often",
    "later",
    "expected",
    "noticed",
    "agreed",
    "decided",
    "explained",
    "checked",
    "measured",
    "reported",
    "moved",
    "kept",
    "lowered",
    "raised",
    "fixed",
    "shipped",
]
RARE = [
    "reconciliation",
    "idempotency",
    "acknowledgement",
    "serialisation",
    "throttling",
    "backpressure",
    "misconfigured",
    "deduplicated",
    "heartbeat",
    "failover",
    "quorum",
    "sharding",
    "tombstones",
    "compaction",
    "Kubernetes",
    "PostgreSQL",
    "Grafana",
    "Prometheus",
    "Terraform",
    "OAuth",
    "JSON",
    "YAML",
    "gRPC",
    "TLS",
    "Wednesday",
    "Frankfurt",
    "Singapore",
    "Oregon",
    "Priya",
    "Okonkwo",
    "Jürgen",
    "Haruto",
    "Delacroix",
    "unambiguously",
    "counterintuitive",
    "retroactively",
    "provisioned",
    "reindexing",
    "ephemeral",
    "bottleneck",
    "mitigations",
    "postmortem",
    "runbook",
    "escalation",
    "rollback",
    "canary",
]


def english(chars: int, *, seed: int) -> str:
    """Technical English prose of `chars` characters: common words, names, product names,
    numbers with units and punctuation (about 4.4 characters per cl100k token)."""
    rng = random.Random(seed)
    sentences, size = [], 0
    while size < chars:
        words = []
        for _ in range(rng.randint(8, 24)):
            draw = rng.random()
            if draw < 0.22:
                words.append(rng.choice(RARE))
            elif draw < 0.30:
                words.append(f"{rng.randint(2, 99_999)}{rng.choice(['', 'ms', '%', ' GB', 'k'])}")
            elif draw < 0.34:
                words.append(f"({rng.choice(WORDS)} {rng.choice(RARE)})")
            elif draw < 0.37:
                words.append(f'"{rng.choice(WORDS)}-{rng.choice(WORDS)}"')
            else:
                words.append(rng.choice(WORDS))
        for _ in range(rng.randint(0, 2)):
            words[rng.randint(1, len(words) - 1)] += rng.choice([",", ";", ":"])
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([". ", ". ", "? ", ".\n\n"])
        sentences.append(sentence)
        size += len(sentence)
    return "".join(sentences)[:chars]


# Claude Code's own system prompt and tools, and Claude 3's reading of English (about 1.1–1.26×
# cl100k by the tokenizers module's measurements): what realistic reports of it say.
CLAUDE_CODE_OVERHEAD = 19_000
ENGLISH_RATIO = 1.18
LONG_MESSAGE_CHARS = 237_780


def claude_turn(api, worker_api, message: str) -> tuple[dict, PromptReport]:
    create(
        api, {"title": "Read", "task_type": "code", "message": message, "executor": "claude_code"}
    )
    [turn] = dispatch(worker_api, kinds=("claude_code",))
    return turn, PromptReport.objects.get(subtask_id=turn["subtask_id"], kind="full")


def answer_with_usage(worker_api, turn, row: PromptReport, *, jitter: float) -> None:
    input_tokens = round(row.tokens * ENGLISH_RATIO * (1 + jitter)) + CLAUDE_CODE_OVERHEAD
    usage = {"input_tokens": input_tokens, "output_tokens": 40}
    response = report(worker_api, turn, result={"value": "Read."}, usage=usage)
    assert response.status_code == 200, response.json()


@pytest.mark.django_db
@pytest.mark.usefixtures("pipeline_bots")
def test_a_long_english_message_is_no_longer_cut_once_the_ratio_is_learned(api, worker_api):
    # No character cap on the current message: only the token budget can cut it.
    HistoryPolicy.objects.filter(task_type="code").update(
        current_message_max_chars=None, overrides=["current_message_max_chars"]
    )
    assert LanguageModel.objects.get(name="claude-sonnet-4-5").tokenizer == "claude_3"
    long_message = english(LONG_MESSAGE_CHARS, seed=1)

    turn, before = claude_turn(api, worker_api, long_message)
    assert (before.token_ratio_per_mille, before.token_ratio_learned) == (1_600, False)
    assert before.current_truncated  # 1.6 × its cl100k tokens is over half the room
    assert before.model_tokens <= before.effective_max_tokens
    report(worker_api, turn, result={"value": "Too long."})  # no usage: teaches nothing

    for number, chars in enumerate([4_000, 9_000, 15_000, 24_000, 36_000, 52_000, 70_000, 95_000]):
        turn, row = claude_turn(api, worker_api, english(chars, seed=10 + number))
        assert not row.current_truncated
        answer_with_usage(worker_api, turn, row, jitter=0.004 * (-1) ** number)
    bot = Bot.objects.get(name="claude-code")
    assert bot.token_ratio_samples == 8
    assert 1_260 <= bot.token_ratio_per_mille < 1_600

    turn, after = claude_turn(api, worker_api, long_message)
    assert (after.token_ratio_per_mille, after.token_ratio_learned) == (
        bot.token_ratio_per_mille,
        True,
    )
    assert after.overhead_tokens == bot.overhead_tokens < 24_000
    assert not after.current_truncated
    assert long_message in turn["prompt"]
    assert after.model_tokens == -(-after.tokens * bot.token_ratio_per_mille // 1000)
    assert after.model_tokens <= after.effective_max_tokens
    # The budget was in the policy the report snapshots: the same bytes again.
    assert replay_prompt(report=after).matches


@pytest.mark.django_db
def test_a_bot_with_few_reports_keeps_the_shipped_factor():
    bot = Bot.objects.get(name="claude-code")
    assert not learn_token_ratio(bot=bot)
    bot.refresh_from_db()
    assert (bot.token_ratio_per_mille, bot.token_ratio_samples) == (None, None)


@pytest.mark.django_db
def test_the_bot_admin_shows_the_learned_ratio_beside_the_overhead(admin_client):
    bot = Bot.objects.get(name="claude-code")
    page = admin_client.get(f"/admin/tasks/bot/{bot.pk}/change/").content.decode()
    assert "the shipped estimate (not learned)" in page
    Bot.objects.filter(pk=bot.pk).update(
        overhead_tokens=19_100, token_ratio_per_mille=1_302, token_ratio_samples=8
    )
    page = admin_client.get(f"/admin/tasks/bot/{bot.pk}/change/").content.decode()
    assert "1.302 model tokens per counted token, learned from 8 full-prompt turns" in page
    assert "19100" in page
    assert 'name="token_ratio_per_mille"' not in page  # learned, not edited
