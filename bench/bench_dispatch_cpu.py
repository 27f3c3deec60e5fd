"""The CPU one dispatch costs the server's Python and its PostgreSQL backend, in this process.

Run from the repository root:

    .venv/bin/python bench/bench_dispatch_cpu.py --postgres postgres://postgres@127.0.0.1:5432/postgres

Django's test client (no HTTP, no gunicorn) dispatches `--dispatches` turns one at a time
(`limit=1`, with `--report` each followed by its result report) on a throwaway database seeded
by `bench_dispatch.seed`, as `bench_http_dispatch.py` is (two answered rounds and one pending
turn a task). Printed
per dispatch (or per cycle): this process's CPU (`time.process_time`), the CPU of the
PostgreSQL backend serving its connection (from `/proc/<pid>/stat`, user and system; the server
runs on this machine), and the statements sent. The machine's speed drifts within minutes, so
compare code side by side in one session, alternating, and over several runs; `--blocks`
splits the dispatches into blocks and prints each, and their minimum is the steadiest figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench.bench_dispatch import seed  # noqa: E402


def _backend_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", required=True, help="PostgreSQL server URL (on this host)")
    parser.add_argument("--dispatches", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--report", action="store_true", help="report each turn's result")
    args = parser.parse_args()

    with bench_database(args.postgres):
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        from backend.dispatch.workers import ensure_worker_account

        _, token = ensure_worker_account(username="bench-worker")
        warm_up = 20
        seed(args.dispatches + warm_up + 1)
        client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")

        def cycle() -> None:
            answer = client.post(
                "/api/executor/dispatch/",
                {"worker_id": "cpu", "kinds": ["codex"], "limit": 1},
                content_type="application/json",
            )
            assert answer.status_code == 200, answer.content
            turn = answer.json()["turns"][0]
            if args.report:
                reported = client.post(
                    f"/api/executor/subtasks/{turn['subtask_id']}/result/",
                    {
                        "worker_id": "cpu",
                        "attempt": turn["attempt"],
                        "status": "COMPLETED",
                        "result": {"value": "Done."},
                    },
                    content_type="application/json",
                )
                assert reported.status_code == 200, reported.content

        for _ in range(warm_up):  # the token, the configuration, prepared statements
            cycle()
        with CaptureQueriesContext(connection) as queries:
            cycle()
        statements = len(queries.captured_queries)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        per_block = args.dispatches // args.blocks
        python, postgres = [], []
        for _ in range(args.blocks):
            started, backend_started = time.process_time(), _backend_cpu_seconds(backend)
            for _ in range(per_block):
                cycle()
            python.append((time.process_time() - started) / per_block * 1000)
            postgres.append((_backend_cpu_seconds(backend) - backend_started) / per_block * 1000)

    what = "cycle (dispatch + report)" if args.report else "dispatch"
    print(f"per {what}: {statements} statements; {per_block} a block")
    for number, (mine, theirs) in enumerate(zip(python, postgres, strict=True), start=1):
        print(f"  block {number}: Python {mine:.2f} ms, PostgreSQL {theirs:.2f} ms")
    print(f"  minimum: Python {min(python):.2f} ms, PostgreSQL {min(postgres):.2f} ms")


if __name__ == "__main__":
    main()
