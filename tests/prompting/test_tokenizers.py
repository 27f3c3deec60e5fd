"""Counting a model's tokens: o200k_base offline and exact, Claude's estimate on the safe side."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import tiktoken_ext.openai_public
from hypothesis import given
from hypothesis import strategies as st

from backend.prompting.tokenizers import (
    COUNTINGS,
    EXACT,
    TokenCounting,
    Tokenizer,
    counting_for,
    unknown_counting,
)
from backend.prompting.units import O200K_ENCODING, O200K_PATTERN, count_tokens, load_encoding

# --- o200k_base, offline ----------------------------------------------------------------------


def test_o200k_offline_is_tiktokens_o200k_base() -> None:
    encoding = load_encoding(O200K_ENCODING)
    # The pre-tokenizer is tiktoken's own, alternative for alternative.
    source = inspect.getsource(tiktoken_ext.openai_public.o200k_base)
    for alternative in O200K_PATTERN.split("|"):
        assert alternative in source
    # Token ids only o200k_base gives (cl100k_base says [15339, 1917]).
    assert encoding.encode_ordinary("hello world") == [24912, 2375]
    assert encoding.n_vocab == 200_019
    assert count_tokens("你好，世界", O200K_ENCODING) < count_tokens("你好，世界")


def test_o200k_offline_loads_without_the_network_or_a_cache(tmp_path) -> None:
    # A fresh interpreter with no tiktoken cache and every socket refused still counts.
    script = (
        "import socket\n"
        "def refuse(*args, **kwargs):\n"
        "    raise OSError('no network here')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "from backend.prompting.units import count_tokens\n"
        "print(count_tokens('hello world', 'o200k_base_offline'))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty"), "DATA_GYM_CACHE_DIR": ""}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "2"
    assert not (tmp_path / "empty").exists()


# --- converting counted tokens and model tokens -----------------------------------------------


@pytest.mark.parametrize(
    ("tokenizer", "encoding", "per_mille", "estimated"),
    [
        ("o200k_base", "o200k_base_offline", 1000, False),
        ("cl100k_base", "cl100k_base_offline", 1000, False),
        ("claude_3", "cl100k_base_offline", 1600, True),
        ("claude_4_7", "cl100k_base_offline", 2100, True),
    ],
)
def test_each_tokenizer_is_counted_with_an_offline_encoding(
    tokenizer, encoding, per_mille, estimated
) -> None:
    counting = counting_for(tokenizer)
    assert (counting.encoding, counting.per_mille, counting.estimated) == (
        encoding,
        per_mille,
        estimated,
    )
    load_encoding(counting.encoding)


def test_the_table_covers_every_tokenizer_and_refuses_others() -> None:
    assert set(COUNTINGS) == set(Tokenizer)
    with pytest.raises(ValueError, match="unknown tokenizer 'llama'"):
        counting_for("llama")
    assert unknown_counting("cl100k_base_offline") == TokenCounting(
        "unknown", "cl100k_base_offline", EXACT, True
    )


@pytest.mark.parametrize(
    ("per_mille", "counted", "model_tokens"),
    [
        (1000, 0, 0),
        (1000, 777, 777),
        (1600, 1, 2),
        (1600, 5, 8),
        (1600, 1000, 1600),
        (2100, 3, 7),
        (2100, 10_000, 21_000),
    ],
)
def test_model_tokens_round_up(per_mille, counted, model_tokens) -> None:
    assert (
        TokenCounting("t", "cl100k_base_offline", per_mille).model_tokens(counted) == model_tokens
    )


@pytest.mark.parametrize(
    ("per_mille", "budget", "counted"),
    [
        (1000, 9_600, 9_600),
        (1600, 9_600, 6_000),
        (1600, 9_601, 6_000),
        (1600, 9_599, 5_999),
        (2100, 128_000, 60_952),
    ],
)
def test_counted_budgets_round_down(per_mille, budget, counted) -> None:
    assert TokenCounting("t", "cl100k_base_offline", per_mille).counted_budget(budget) == counted


@given(st.sampled_from([1000, 1001, 1350, 1600, 2100, 3000]), st.integers(0, 2**31))
def test_a_counted_budget_is_the_most_that_stays_within_the_budget(per_mille, budget) -> None:
    counting = TokenCounting("t", "cl100k_base_offline", per_mille)
    counted = counting.counted_budget(budget)
    assert counting.model_tokens(counted) <= budget < counting.model_tokens(counted + 1)


# --- Claude's estimate overcounts ---------------------------------------------------------------
# Claude's token counts of these texts (the message content, without the request's frame), as
# ctok 1.3.0 reconstructs them offline for the Claude 3 to Opus 4.6 vocabulary and for Opus
# 4.7's; ctok matches Anthropic's count_tokens exactly on its published corpora. The estimate
# must never be below them, nor so far above that it wastes most of the budget.

ENGLISH = (
    "Baton sits between a product where people talk to agents and the agents that do the work. "
    "It stores every turn of every task, and each time an agent must act it hands over one "
    "prompt that carries the context the agent needs: bounded, deterministic and honest about "
    "what it left out. When a result is recorded, Baton measures it once, keeps a short preview "
    "in the row and moves anything long into an artifact, so building the next prompt never "
    "reads megabytes of old tool logs. An operator who wants a different balance between recent "
    "detail and older history changes one policy row; the next dispatch already follows it.\n"
)
CODE = '''class HistoryWindow:
    """The newest turns a prompt may show, oldest first."""

    def __init__(self, turns, *, limit=20):
        self.turns = list(turns)[-limit:]

    def render(self, labels):
        lines = []
        for turn in self.turns:
            if turn.role == "user":
                lines.append(f"{labels['user']}:\\n{turn.text}")
            else:
                for part in turn.parts:
                    if part.kind == "code":
                        lines.append("```\\n" + part.text + "\\n```")
                    else:
                        lines.append(part.text)
        return "\\n\\n".join(lines)
'''
CHINESE = (
    "Baton 位于用户与智能体之间：它保存每个任务的每一轮对话，并在智能体需要行动时交给它一份"
    "有界、确定且如实说明省略内容的提示。结果被记录时只测量一次，长文本存为附件，"
    "行中只保留简短的预览，因此构建下一份提示时不会读取大量旧日志。\n"
)
JAPANESE = (
    "Baton は、利用者とエージェントの間に立ち、すべてのタスクのすべての発言を保存します。"
    "エージェントが動くたびに、必要な文脈を含み、上限があり、何を省いたかを正直に示すプロンプトを一つ渡します。"
    "長い結果は成果物として保存され、行には短いプレビューだけが残ります。\n"
)
KOREAN = (
    "Baton은 사용자와 에이전트 사이에서 모든 작업의 모든 대화를 저장합니다. "
    "에이전트가 움직일 때마다 "
    "필요한 맥락을 담고, 크기가 제한되며, 무엇을 생략했는지 정직하게 밝히는 "
    "프롬프트 하나를 건넵니다. "
    "긴 결과는 아티팩트로 저장되고 행에는 짧은 미리보기만 남습니다.\n"
)

CLAUDE_COUNTS = [
    # sample, claude_3, claude_4_7
    (ENGLISH * 4, 515, 695),
    (CODE * 3, 524, 635),
    (CHINESE * 4, 463, 463),
    (JAPANESE * 4, 471, 471),
    (KOREAN * 4, 619, 619),
]


@pytest.mark.parametrize(("text", "claude_3", "claude_4_7"), CLAUDE_COUNTS)
def test_the_claude_estimate_overcounts_english_code_and_cjk(text, claude_3, claude_4_7) -> None:
    for tokenizer, claude in [("claude_3", claude_3), ("claude_4_7", claude_4_7)]:
        counting = counting_for(tokenizer)
        estimate = counting.model_tokens(count_tokens(text, counting.encoding))
        assert claude <= estimate < 2.5 * claude, tokenizer
