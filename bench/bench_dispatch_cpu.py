"""The CPU one dispatch costs the server's Python and PostgreSQL: in this process, or over HTTP.

Run from the repository root:

    .venv/bin/python bench/bench_dispatch_cpu.py --postgres postgres://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/bench_dispatch_cpu.py --postgres ... --http

One client dispatches `--dispatches` turns one at a time (`limit=1`, with `--report` each
followed by its result report) on a throwaway database seeded by `bench_dispatch.seed`, as
`bench_http_dispatch.py` is (two answered rounds and one pending turn a task). In this process
it is Django's test client; with `--http`, httpx over a keep-alive connection to Baton under
gunicorn (one sync worker), which then also answers `--dispatches` requests to the bare view
of `bench_http_dispatch.py`'s ceiling (two small queries) for comparison. No other client runs,
so nothing else competes for the two cores. Printed per dispatch (or per cycle): the CPU of
the server's Python (this process's, or gunicorn's processes'), of PostgreSQL's backends
serving it (from `/proc/<pid>/stat`, user and system; the server runs on this machine) and, in
process, the statements sent. The machine's speed drifts within minutes, so compare code side
by side in one session, alternating, and over several runs; `--blocks` splits the dispatches
into blocks and prints each, and their minimum is the steadiest figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import live_baton, server_cpu_seconds  # noqa: E402
from bench.bench_dispatch import seed  # noqa: E402

# A request: (path, JSON body or None for a GET) -> (status, JSON answer or None).
Send = Callable[[str, dict[str, Any] | None], tuple[int, Any]]


def _cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each of the processes `pids` still running (a backend
    whose connection closed has none)."""
    seconds = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def _backends(*, other_than_mine: bool) -> list[int]:
    """The PostgreSQL backends of the benchmark's database: this process's own, or every
    other one (the server's)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if other_than_mine:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT pg_backend_pid()")
        return [cursor.fetchone()[0]]


@contextmanager
def _in_process(token: str) -> Iterator[tuple[Send, Callable[[], float]]]:
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")

    def send(path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        answer = client.post(path, body, content_type="application/json")
        return answer.status_code, answer.json()

    yield send, time.process_time


@contextmanager
def _over_http() -> Iterator[tuple[Send, Callable[[], float]]]:
    import httpx
    from django.db import connection

    os.environ["DJANGO_SETTINGS_MODULE"] = "bench._ceiling_settings"  # the server's
    with live_baton(workers=1) as baton:
        connection.close()  # the seed's: the server's backends are every other one
        headers = {"Authorization": f"Token {baton.worker_token}"}
        with httpx.Client(base_url=baton.url, headers=headers, timeout=60) as client:

            def send(path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
                answer = client.get(path) if body is None else client.post(path, json=body)
                return answer.status_code, answer.json() if body is not None else None

            yield send, lambda: server_cpu_seconds(baton.server_pid)


def _show_plans(connection: Any) -> None:
    """Each statement prepared on the connection, with the plans PostgreSQL made for it: a
    statement planned on every run ("custom") pays its planning each time."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans, statement FROM pg_prepared_statements"
            " ORDER BY custom_plans DESC"
        )
        for generic, custom, statement in cursor.fetchall():
            print(f"  generic {generic:5} custom {custom:5}  {' '.join(statement.split())[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", required=True, help="PostgreSQL server URL (on this host)")
    parser.add_argument("--dispatches", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--report", action="store_true", help="report each turn's result")
    parser.add_argument("--http", action="store_true", help="over HTTP, against gunicorn")
    parser.add_argument(
        "--native-sessions",
        action="store_true",
        help="with --report: each report names a native session, as Codex's and Claude Code's do",
    )
    parser.add_argument(
        "--show-statements",
        action="store_true",
        help="in process: print the start of each statement one dispatch (or cycle) sends",
    )
    parser.add_argument(
        "--show-plans",
        action="store_true",
        help="in process: after the blocks, how often PostgreSQL planned each prepared statement",
    )
    args = parser.parse_args()
    warm_up = 20
    per_block = args.dispatches // args.blocks
    rows: list[tuple[str, float, float]] = []
    statements = None

    with bench_database(args.postgres):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from backend.dispatch.workers import ensure_worker_account

        _, token = ensure_worker_account(username="bench-worker")
        seed(per_block * args.blocks + warm_up + 1)
        target = _over_http() if args.http else _in_process(token)
        with target as (send, server_cpu):

            def cycle() -> None:
                status, answer = send(
                    "/api/executor/dispatch/",
                    {"worker_id": "cpu", "kinds": ["codex"], "limit": 1},
                )
                assert status == 200, answer
                turn = answer["turns"][0]
                if args.report:
                    status, reported = send(
                        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
                        {
                            "worker_id": "cpu",
                            "attempt": turn["attempt"],
                            "status": "COMPLETED",
                            "result": {"value": "Done."},
                            **(
                                {"native_session_id": f"session-{turn['subtask_id']}"}
                                if args.native_sessions
                                else {}
                            ),
                        },
                    )
                    assert status == 200, reported

            def bare() -> None:
                status, _ = send("/bench/ceiling/", None)
                assert status == 200

            for _ in range(warm_up):  # the token, the configuration, prepared statements
                cycle()
            if not args.http:
                with CaptureQueriesContext(connection) as queries:
                    cycle()
                statements = len(queries.captured_queries)
                if args.show_statements:
                    for query in queries.captured_queries:
                        print("  " + " ".join(query["sql"].split())[:150])
            else:
                bare()
            backends = _backends(other_than_mine=args.http)

            def measure(name: str, work: Callable[[], None]) -> None:
                for _ in range(args.blocks):
                    python = server_cpu()
                    before = _cpu_seconds(backends)
                    for _ in range(per_block):
                        work()
                    python = (server_cpu() - python) / per_block * 1000
                    # Only the backends that served the whole block count.
                    after = _cpu_seconds(backends)
                    spent = sum(after[pid] - before[pid] for pid in after.keys() & before.keys())
                    database = spent / per_block
                    rows.append((name, python, database * 1000))

            what = "cycle (dispatch + report)" if args.report else "dispatch"
            measure(what, cycle)
            if args.http:
                measure("bare view (2 queries)", bare)
            elif args.show_plans:
                _show_plans(connection)

    where = "over HTTP, gunicorn 1 sync worker" if args.http else "in process"
    counted = f"; {statements} statements a {what}" if statements is not None else ""
    print(f"{where}; {per_block} a block{counted}")
    for name in dict.fromkeys(name for name, _, _ in rows):
        mine = [(python, database) for row_name, python, database in rows if row_name == name]
        blocks = ", ".join(f"{python:.2f} / {database:.2f}" for python, database in mine)
        best = f"{min(p for p, _ in mine):.2f} / {min(d for _, d in mine):.2f}"
        print(f"  {name}: Python / PostgreSQL CPU ms: blocks {blocks}; minimum {best}")


if __name__ == "__main__":
    main()
