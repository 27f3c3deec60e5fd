"""Issue 5 benchmark: 8 concurrent workers claiming from 20,000 pending turns, prompts included.

Run from the repository root (PostgreSQL is the target; SQLite works for comparison):

    .venv/bin/python bench/bench_dispatch.py --postgres postgres://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/bench_dispatch.py --postgres ... --turns 20000 --workers 8 --limit 10

Seeds `--turns` tasks, each with a short history (two answered rounds) and one pending
ASSISTANT turn, then starts `--workers` processes at once. Each process is one executor worker
calling `claim_turns` (claim + history window + prompt build + PromptReport) in a loop until
nothing is left. Prints claims per second over the whole drain, and verifies by counting that
no turn was claimed twice and none was lost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

from _django import bench_database


def seed(turns: int) -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from backend.prompting import Role
    from backend.tasks.ingestion import ingest_text
    from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskStatus

    owner, _ = get_user_model().objects.get_or_create(username="bench-owner")
    now = timezone.now()
    texts = {
        "q1": "Please look at the failing upload test and explain the cause.",
        "a1": "The test shares a temporary directory with another test; cleanup races.",
        "q2": "Good. Fix it and keep the retry logic.",
        "a2": "Done: each test gets its own tmp_path; the retry constant is unchanged.",
        "q3": "Now add a regression test for the race.",
    }
    measured = {key: ingest_text(text=text, task=None) for key, text in texts.items()}
    pipeline = [
        {"bot": "assistant", "executor": "codex", "context_passing": "original_and_previous"}
    ]
    batch = 1000
    for start in range(0, turns, batch):
        tasks = Task.objects.bulk_create(
            [
                Task(
                    owner=owner,
                    title=f"bench {number}",
                    task_type="code",
                    status=TaskStatus.PENDING,
                    pipeline=pipeline,
                    next_message_id=7,
                )
                for number in range(start, min(start + batch, turns))
            ]
        )
        rows = []
        for task in tasks:
            for message_id, key in enumerate(["q1", "a1", "q2", "a2", "q3"], start=1):
                ingested = measured[key]
                user = key.startswith("q")
                rows.append(
                    Subtask(
                        task=task,
                        message_id=message_id,
                        parent_message_id=None if user else message_id - 1,
                        role=Role.USER if user else Role.ASSISTANT,
                        status=SubtaskStatus.COMPLETED,
                        bot="" if user else "assistant",
                        executor="" if user else "codex",
                        message=texts[key] if user else "",
                        result=None if user else {"value": texts[key]},
                        history_text=ingested.history_text,
                        history_text_tokens=ingested.history_text_tokens,
                        history_text_tokens_o200k=ingested.history_text_tokens_o200k,
                        history_chars=ingested.chars,
                        history_bytes=ingested.bytes,
                        history_lines=ingested.lines,
                        history_tokens=ingested.tokens,
                        recorded_at=now,
                    )
                )
            rows.append(
                Subtask(
                    task=task,
                    message_id=6,
                    parent_message_id=5,
                    role=Role.ASSISTANT,
                    status=SubtaskStatus.PENDING,
                    bot="assistant",
                    pipeline_step=0,
                    executor="codex",
                    context_passing="original_and_previous",
                    pending_since=now,
                )
            )
        Subtask.objects.bulk_create(rows)


def worker_loop(index: int, limit: int, start_at: float, queue) -> None:
    import django

    django.setup()
    from backend.dispatch.claims import claim_turns
    from backend.dispatch.workers import ensure_worker_account

    worker, _ = ensure_worker_account(username=f"bench-worker-{index}")
    while time.time() < start_at:
        time.sleep(0.001)
    claimed: list[int] = []
    while True:
        turns = claim_turns(worker=worker, worker_id=f"w{index}", kinds=["codex"], limit=limit)
        if not turns:
            break
        claimed.extend(turn.subtask.pk for turn in turns)
    queue.put((index, claimed, time.time()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", help="PostgreSQL server URL (default: SQLite)")
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--limit", type=int, default=10, help="turns per dispatch call")
    args = parser.parse_args()

    with bench_database(args.postgres) as vendor:
        from django.db import connection

        seeding = time.perf_counter()
        seed(args.turns)
        seeded_in = time.perf_counter() - seeding
        connection.close()  # never share a connection with the worker processes

        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        start_at = time.time() + 2.0  # let every process set up, then start together
        processes = [
            context.Process(target=worker_loop, args=(index, args.limit, start_at, queue))
            for index in range(args.workers)
        ]
        for process in processes:
            process.start()
        results = [queue.get() for _ in processes]
        for process in processes:
            process.join()
        finished = max(result[2] for result in results)
        elapsed = finished - start_at

        from backend.dispatch.models import PromptReport
        from backend.tasks.models import Subtask

        claimed = [subtask_id for _, ids, _ in results for subtask_id in ids]
        running = Subtask.objects.filter(status="RUNNING").count()
        pending = Subtask.objects.filter(status="PENDING").count()
        reports = PromptReport.objects.count()

    print(f"database: {vendor}; seeded {args.turns} pending turns in {seeded_in:.1f} s")
    print(f"workers: {args.workers} processes, {args.limit} turns per dispatch call")
    print(f"claimed: {len(claimed)} in {elapsed:.2f} s = {len(claimed) / elapsed:.0f} claims/s")
    per_worker = sorted(len(ids) for _, ids, _ in results)
    print(f"per worker: min {per_worker[0]}, max {per_worker[-1]}")
    duplicates = len(claimed) - len(set(claimed))
    lost = args.turns - len(set(claimed))
    print(
        f"claimed twice: {duplicates}; lost: {lost}; RUNNING rows: {running}; "
        f"PENDING rows: {pending}; prompt reports: {reports}"
    )
    if duplicates or lost or running != args.turns or reports != args.turns:
        raise SystemExit("exactly-once check FAILED")
    print("exactly-once check passed")


if __name__ == "__main__":
    main()
