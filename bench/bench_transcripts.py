"""What the transcript costs a dispatch whose history leaves turns out, by conversation length.

Run from the repository root:

    .venv/bin/python bench/bench_transcripts.py                      # SQLite
    .venv/bin/python bench/bench_transcripts.py --postgres postgres://postgres@127.0.0.1:5432/postgres

For conversations of 20, 200 and 1,000 rounds (answers of ~600 chars, the shipped policy, which
keeps 20 messages), builds the next turn's prompt the way dispatch does, interleaved in one
process: without the transcript (`find_transcript=False`), and with it — reading every earlier
turn, rendering and escaping the transcript, building again with its pointer line, and storing
it (content-addressed, so an unchanged transcript is hashed but not written again). Prints the
median of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _django import bench_database

ANSWER = (
    "I ran the suite: 212 passed, 3 failed in tests/test_upload.py. The failures share a tmp dir;"
    " the cleanup of one test removes files another still reads. "
) * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", help="server URL; a throwaway database is created there")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with bench_database(args.postgres) as vendor:
        from django.contrib.auth import get_user_model
        from django.db import transaction

        from backend.dispatch.policies import resolve_policy
        from backend.dispatch.prompts import build_turn_prompt
        from backend.tasks.factories import conversation, pending_assistant_turns
        from backend.tasks.transcripts import store_transcripts

        owner = get_user_model().objects.create(username="bench")
        print(f"{vendor}, {args.runs} builds each, interleaved")
        print(f"{'rounds':>7} | {'no transcript':>13} | {'transcript':>10} | ratio | transcript")
        for rounds in (20, 200, 1_000):
            task = conversation(
                owner=owner,
                messages=[f"question {number}" for number in range(rounds + 1)],
                answers=(f"{number}: {ANSWER}" for number in range(rounds)),
            )
            [turn] = pending_assistant_turns(task=task)
            resolved = resolve_policy(task_type=task.task_type)
            without: list[float] = []
            with_transcript: list[float] = []
            size = 0
            for _ in range(args.runs):
                started = time.perf_counter()
                build_turn_prompt(subtask=turn, task=task, resolved=resolved, find_transcript=False)
                without.append(time.perf_counter() - started)
                started = time.perf_counter()
                with transaction.atomic():
                    prompt = build_turn_prompt(subtask=turn, task=task, resolved=resolved)
                    assert prompt.transcript is not None
                    store_transcripts({task.pk: prompt.transcript})
                with_transcript.append(time.perf_counter() - started)
                size = prompt.transcript.pointer.total_chars
            a, b = statistics.median(without) * 1000, statistics.median(with_transcript) * 1000
            print(f"{rounds:>7} | {a:>10.2f} ms | {b:>7.2f} ms | {b / a:4.1f}x | {size:,} chars")


if __name__ == "__main__":
    main()
