"""What one progress post costs as a running turn's partial answer grows.

In process (Django's test client, one claimed turn), for each stored length of `--sizes`
(characters of partial text): the partial answer is first brought to that length, then
`--posts` progress posts each add `--step` characters (and two small events, as a worker's
do), sent as the worker sends them: what the text gained at its offset (`partial_text_append`,
`--mode append`), or the whole text each time (`--mode whole`, what workers sent before appends,
and what a branch without appends takes). Per post: the Python CPU of the request (the
process's CPU time over the block, which includes Django's test client), PostgreSQL's CPU (the
benchmark's backend, from /proc, over the block: PostgreSQL runs on this host) and the WAL it
wrote (`pg_current_wal_insert_lsn()` before and after the block; other sessions of the server
write WAL too, so run it on a quiet server and compare runs made one after the other).

Run from the repository root (PostgreSQL; SQLite prints CPU only):

    .venv/bin/python bench/bench_progress_post.py \
        --postgres postgres://postgres@127.0.0.1:5432/postgres --sizes 1000,100000,200000

A checkout without appends (the base of a comparison) runs `--mode whole`: copy this file to
its `bench/` and run it there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench.bench_dispatch import seed  # noqa: E402
from bench.bench_dispatch_cpu import _backends, _cpu_seconds  # noqa: E402

WORDS = ("the", "agent", "reads", "the", "failing", "test", "and", "patches", "its", "fixture")


def _text(chars: int, salt: int) -> str:
    """`chars` characters of prose-like text (compressible as an answer is)."""
    words = []
    total = 0
    index = salt
    while total < chars:
        word = WORDS[index % len(WORDS)] + str(index % 97)
        words.append(word)
        total += len(word) + 1
        index += 7
    return " ".join(words)[:chars]


def _wal_lsn(cursor: Any) -> str:
    cursor.execute("SELECT pg_current_wal_insert_lsn()")
    return str(cursor.fetchone()[0])


def _wal_since(cursor: Any, lsn: str) -> int:
    cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [lsn])
    return int(cursor.fetchone()[0])


def _measure(*, size: int, posts: int, step: int, mode: str, rounds: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client

    from backend.dispatch.workers import ensure_worker_account

    _, token = ensure_worker_account(username="bench-worker")
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")
    seed(1)
    answer = client.post(
        "/api/executor/dispatch/",
        {"kinds": ["codex"], "limit": 1, "worker_id": "bench"},
        content_type="application/json",
    )
    [turn] = answer.json()["turns"]
    url = f"/api/executor/subtasks/{turn['subtask_id']}/progress/"
    claim = {"worker_id": "bench", "attempt": turn["attempt"]}
    text = _text(size, salt=turn["subtask_id"])
    answer = client.post(url, {**claim, "partial_text": text}, content_type="application/json")
    assert answer.status_code == 200, answer.json()
    postgres = connection.vendor == "postgresql"
    backend = _backends(other_than_mine=False) if postgres else []
    python_ms, postgres_ms, wal_bytes = [], [], []
    for round_number in range(rounds):
        bodies = []
        for number in range(posts):
            gained = " " + _text(step - 1, salt=round_number * posts + number)
            body: dict[str, Any] = {
                **claim,
                "events": [
                    {"type": "agent_message_delta", "text": gained[:80]},
                    {"type": "tool_call", "name": "shell", "arguments": {"cmd": "pytest -x"}},
                ],
            }
            if mode == "whole":
                body["partial_text"] = text + gained
            else:
                body["partial_text_append"] = gained
                body["partial_text_offset"] = len(text)
            text += gained
            bodies.append(json.dumps(body))
        with connection.cursor() as cursor:
            lsn = _wal_lsn(cursor) if postgres else ""
        database_before = sum(_cpu_seconds(backend).values())
        started = time.process_time()
        for body_text in bodies:
            answer = client.post(url, body_text, content_type="application/json")
            assert answer.status_code == 200, answer.content
        python_ms.append((time.process_time() - started) * 1000 / posts)
        postgres_ms.append((sum(_cpu_seconds(backend).values()) - database_before) * 1000 / posts)
        if postgres:
            with connection.cursor() as cursor:
                wal_bytes.append(_wal_since(cursor, lsn) / posts)
        # Back to the size measured: the next round starts where this one did.
        text = text[:size]
        answer = client.post(url, {**claim, "partial_text": text}, content_type="application/json")
        assert answer.status_code == 200
    return {
        "size": size,
        "mode": mode,
        "python_ms": statistics.median(python_ms),
        "postgres_ms": statistics.median(postgres_ms) if postgres else None,
        "wal_bytes": statistics.median(wal_bytes) if postgres else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="PostgreSQL server URL (on this host); else SQLite")
    parser.add_argument("--sizes", default="1000,100000,200000", help="stored characters")
    parser.add_argument("--posts", type=int, default=50, help="posts measured per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (median)")
    parser.add_argument("--step", type=int, default=100, help="characters a post adds")
    parser.add_argument("--mode", choices=("append", "whole"), default="append")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = []
    with bench_database(args.postgres):
        for size in (int(value) for value in args.sizes.split(",")):
            results.append(
                _measure(
                    size=size,
                    posts=args.posts,
                    step=args.step,
                    mode=args.mode,
                    rounds=args.rounds,
                )
            )
    print("| stored chars | mode | Python CPU / post | PostgreSQL CPU / post | WAL / post |")
    print("|---|---|---|---|---|")
    for row in results:
        database = "-" if row["postgres_ms"] is None else f"{row['postgres_ms']:.2f} ms"
        wal = "-" if row["wal_bytes"] is None else f"{row['wal_bytes'] / 1024:.1f} KB"
        print(
            f"| {row['size']:,} | {row['mode']} | {row['python_ms']:.2f} ms | {database} | {wal} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
