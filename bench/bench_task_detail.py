"""A task's view over real HTTP, by its number of turns: what a product waits for to show one.

Run from the repository root (PostgreSQL is the target; SQLite works for comparison):

    .venv/bin/python bench/bench_task_detail.py --postgres postgres://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/bench_task_detail.py --turns 10,100,400 --rounds 100

Baton runs under gunicorn (4 sync workers) on a throwaway database. For each `--turns` entry a
task is stored with that many answered turns (through the real services: user messages of
80-1,200 chars, answers of 200-4,000), then one client (httpx, keep-alive) reads
`GET /api/tasks/{id}/` for the sizes in turn, round after round (in alternating order, so they
share the machine's noise), the first `--warmup` rounds untimed. It prints each size's median
and p90, the response's size, and the time per turn beyond the smallest task's.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import live_baton  # noqa: E402
from bench.bench_dispatch_latency import answer_of, text_of  # noqa: E402


def seed_task(*, turns: int, rng: random.Random) -> int:
    """A task with `turns` answered turns (`turns` even), stored through the services."""
    from django.contrib.auth import get_user_model

    from backend.tasks.factories import conversation

    owner, _ = get_user_model().objects.get_or_create(username="bench-product")
    rounds = turns // 2
    task = conversation(
        owner=owner,
        messages=[
            text_of(rng, label=f"Message {number}:", low=80, high=1200) for number in range(rounds)
        ],
        answers=({"value": answer_of(rng, number)} for number in range(rounds)),
    )
    return task.pk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", help="PostgreSQL server URL (default: SQLite)")
    parser.add_argument("--turns", default="10,100,400", help="turns per task, comma-separated")
    parser.add_argument("--rounds", type=int, default=100, help="timed reads per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    args = parser.parse_args()
    sizes = [int(size) for size in args.turns.split(",")]
    if any(size < 2 or size % 2 for size in sizes) or args.rounds < 2:
        raise SystemExit("--turns: even numbers (answered rounds), at least 2; --rounds: >= 2")
    rng = random.Random(15)
    with bench_database(args.postgres) as vendor:
        from django.db import connection

        task_ids = {size: seed_task(turns=size, rng=rng) for size in sizes}
        if vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        connection.close()
        load_before = os.getloadavg()
        times: dict[int, list[float]] = {size: [] for size in sizes}
        response_bytes: dict[int, int] = {}
        with live_baton() as baton:
            for number in range(args.warmup + args.rounds):
                for size in sizes if number % 2 else list(reversed(sizes)):
                    began = time.perf_counter()
                    response = baton.product.get(f"/api/tasks/{task_ids[size]}/")
                    elapsed = time.perf_counter() - began
                    response.raise_for_status()
                    if len(response.json()["turns"]) != size:
                        raise SystemExit(f"the task of {size} turns showed another number")
                    if number >= args.warmup:
                        times[size].append(elapsed)
                    response_bytes[size] = len(response.content)
        load_after = os.getloadavg()
    print(
        f"database: {vendor}; gunicorn 4 sync workers; one client; {args.rounds} timed reads "
        f"per size after {args.warmup} untimed; load {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after"
    )
    print(f"{'turns':>6} {'median':>9} {'p90':>9} {'response':>10} {'per turn beyond':>16}")
    smallest = min(sizes)
    base = statistics.median(times[smallest])
    for size in sizes:
        median = statistics.median(times[size])
        p90 = statistics.quantiles(times[size], n=10)[-1]
        per_turn = (median - base) / (size - smallest) * 1000 if size > smallest else 0.0
        print(
            f"{size:>6} {median * 1000:>7.1f} ms {p90 * 1000:>6.1f} ms "
            f"{response_bytes[size] / 1024:>6.0f} KiB {per_turn:>12.3f} ms"
        )


if __name__ == "__main__":
    main()
