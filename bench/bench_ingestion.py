"""Issue 4 benchmark: recording big results, and prompt cost vs. result size, database in the loop.

Run from the repository root:

    .venv/bin/python bench/bench_ingestion.py                      # SQLite
    .venv/bin/python bench/bench_ingestion.py --postgres postgres://postgres@127.0.0.1:5432/postgres

It prints, for the chosen database:
1. recording a 10 MB result (record_result with ingestion and artifact spill): median seconds
   over several runs, and the peak extra Python memory (tracemalloc) as a multiple of the
   result size;
2. building the prompt for the next turn of a task whose history holds 200 results of 1 MB
   each vs. 200 results of 1 KB each (history window selection + pure build): median
   milliseconds, their ratio, and the number of queries per build.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import time
import tracemalloc

from _django import bench_database


def make_text(size: int, seed: int) -> str:
    """Mixed English, code and Chinese, like real tool output."""
    rng = random.Random(seed)
    pieces = [
        "def handler(event):\n    return process(event['body'])\n",
        "INFO 2026-11-25 worker started pid=4242\n",
        "统一的任务历史记录和工件存储。\n",
        "The quick brown fox jumps over the lazy dog. ",
        "".join(rng.choice(string.ascii_letters) for _ in range(40)) + "\n",
    ]
    out: list[str] = []
    total = 0
    while total < size:
        piece = rng.choice(pieces)
        out.append(piece)
        total += len(piece)
    return "".join(out)[:size]


def bench_record(runs: int) -> tuple[float, float]:
    from django.contrib.auth import get_user_model

    from backend.prompting import Role
    from backend.tasks.models import SubtaskStatus
    from backend.tasks.services import PipelineStep, create_task, record_result

    owner, _ = get_user_model().objects.get_or_create(username="bench")
    size = 10 * 1024 * 1024
    timings = []
    peaks = []
    for run in range(runs):
        text = make_text(size, seed=run)  # distinct content: every run writes a new artifact
        task = create_task(
            owner=owner,
            title="record",
            task_type="code",
            message="go",
            pipeline=[PipelineStep(executor="codex")],
        )
        turn = task.subtasks.get(role=Role.ASSISTANT)
        result = {"value": text}
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result=result)
        timings.append(time.perf_counter() - started)
        peaks.append((tracemalloc.get_traced_memory()[1] - base) / len(text.encode()))
        tracemalloc.stop()
    return statistics.median(timings), max(peaks)


def seed_history(result_size: int, turns: int, title: str):
    from django.contrib.auth import get_user_model

    from backend.tasks.factories import conversation

    owner, _ = get_user_model().objects.get_or_create(username="bench")
    base = make_text(result_size, seed=result_size)
    return conversation(
        owner=owner,
        title=title,
        messages=["start"] + [f"follow-up {number}" for number in range(turns)],
        # A distinct prefix per turn, so each big result is its own artifact; a generator, so
        # only one big result is in memory at a time.
        answers=(f"result {number}\n" + base[: result_size - 20] for number in range(turns)),
    )


def bench_build(task, repeats: int) -> tuple[float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from backend.prompting import PromptPolicy, Role, build_prompt
    from backend.tasks.history import prompt_input_for
    from backend.tasks.models import SubtaskStatus

    policy = PromptPolicy()
    turn = task.subtasks.get(role=Role.ASSISTANT, status=SubtaskStatus.PENDING)
    timings = []
    queries = 0
    for _ in range(repeats):
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            build_prompt(prompt_input_for(subtask=turn, task=task, policy=policy), policy)
            timings.append(time.perf_counter() - started)
        queries = len(captured.captured_queries)
    return statistics.median(timings) * 1000, queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", help="PostgreSQL server URL (default: SQLite)")
    parser.add_argument("--record-runs", type=int, default=7)
    parser.add_argument("--build-repeats", type=int, default=50)
    args = parser.parse_args()

    with bench_database(args.postgres) as vendor:
        record_median, peak = bench_record(args.record_runs)
        big = seed_history(1024 * 1024, 200, "200 x 1 MB")
        small = seed_history(1024, 200, "200 x 1 KB")
        bench_build(small, 5)  # warm up (encoding load, connection)
        big_ms, big_queries = bench_build(big, args.build_repeats)
        small_ms, small_queries = bench_build(small, args.build_repeats)

    print(f"database: {vendor}")
    print(f"record 10 MB result: median {record_median:.3f} s, peak extra memory {peak:.2f}x")
    print(f"build, 200 x 1 MB history: median {big_ms:.2f} ms, {big_queries} queries")
    print(f"build, 200 x 1 KB history: median {small_ms:.2f} ms, {small_queries} queries")
    print(f"ratio 1 MB / 1 KB: {big_ms / small_ms:.2f}x")


if __name__ == "__main__":
    main()
