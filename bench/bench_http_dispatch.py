"""The dispatch cycle over real HTTP: claims and result reports against the production server.

Run from the repository root (PostgreSQL is the target; SQLite works for comparison):

    .venv/bin/python bench/bench_http_dispatch.py --postgres postgres://postgres@127.0.0.1:5432/postgres

Baton runs under gunicorn (`--server-workers` sync processes, or gthread with `--threads`) on a
throwaway database; `--clients` processes (8) play executor workers over HTTP with httpx, each
with its own keep-alive connection and worker id. Three phases, in one run so they share the
machine's state:

- ceiling: every client loops on a bare Django view doing two queries (`bench/_ceiling_urls.py`)
  for `--ceiling-seconds`: requests per second. A dispatch cycle is two requests, so half of
  it is the ceiling for turns per second.
- claims: `--turns` tasks are seeded (two answered rounds and one pending turn each); every
  client loops on `POST /api/executor/dispatch/` at `--limit` until nothing is left.
- cycle: as many again; every client loops on dispatch, then reports each turn's result
  (`POST /api/executor/subtasks/{id}/result/`), until nothing is left.

Then, in this process (Django's test client, no HTTP), `--in-process` more cycles: the queries
each request makes and the CPU time a cycle costs the server's Python.

Verified by counting: no turn claimed twice (the claimed ids are distinct), none lost (every
seeded turn claimed; after the cycle, every one COMPLETED), one prompt report per claim.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import live_baton  # noqa: E402
from bench.bench_dispatch import seed  # noqa: E402


def _ceiling_client(url: str, seconds: float, start_at: float, queue) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        done = 0
        end = start_at + seconds
        while time.time() < end:
            response = client.get("/bench/ceiling/")
            response.raise_for_status()
            done += 1
    queue.put((done, [], time.time(), []))


def _worker_client(
    url: str, token: str, index: int, limit: int, report: bool, start_at: float, queue
) -> None:
    worker_id = f"bench-{index}"
    headers = {"Authorization": f"Token {token}"}
    claimed: list[int] = []
    latencies: list[float] = []
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        while True:
            began = time.perf_counter()
            response = client.post(
                "/api/executor/dispatch/",
                json={"worker_id": worker_id, "kinds": ["codex"], "limit": limit},
            )
            latencies.append(time.perf_counter() - began)
            response.raise_for_status()
            turns = response.json()["turns"]
            if not turns:
                break
            for turn in turns:
                claimed.append(turn["subtask_id"])
                if report:
                    answer = client.post(
                        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
                        json={
                            "worker_id": worker_id,
                            "attempt": turn["attempt"],
                            "status": "COMPLETED",
                            "result": {"value": f"Done: turn {turn['message_id']}."},
                        },
                    )
                    answer.raise_for_status()
    queue.put((len(claimed), claimed, time.time(), latencies))


def _run(target, args_for, clients: int) -> tuple[list, float]:
    """Start `clients` processes together; their results and the seconds until the last one
    finished."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.time() + 3.0  # every process imports and connects first
    processes = [
        context.Process(target=target, args=(*args_for(index), start_at, queue))
        for index in range(clients)
    ]
    for process in processes:
        process.start()
    results = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    return results, max(result[2] for result in results) - start_at


def _in_process(token: str, cycles: int) -> tuple[int, int, float]:
    """Queries per dispatch and per report, and CPU ms per cycle, over `cycles` cycles run
    through Django's test client (the turns seeded for them)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")

    def cycle() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as dispatch_queries:
            answer = client.post(
                "/api/executor/dispatch/",
                {"worker_id": "in-process", "kinds": ["codex"], "limit": 1},
                content_type="application/json",
            )
        turn = answer.json()["turns"][0]
        with CaptureQueriesContext(connection) as report_queries:
            reported = client.post(
                f"/api/executor/subtasks/{turn['subtask_id']}/result/",
                {
                    "worker_id": "in-process",
                    "attempt": turn["attempt"],
                    "status": "COMPLETED",
                    "result": {"value": "Done."},
                },
                content_type="application/json",
            )
        assert reported.status_code == 200, reported.content
        return len(dispatch_queries), len(report_queries)

    counts = cycle()  # the first request of a token also looks it up
    started = time.process_time()
    for _ in range(cycles):
        counts = cycle()
    return counts[0], counts[1], (time.process_time() - started) / cycles * 1000


def _check(results: list, expected: int, what: str) -> list[int]:
    claimed = [subtask_id for _, ids, _, _ in results for subtask_id in ids]
    twice = len(claimed) - len(set(claimed))
    lost = expected - len(set(claimed))
    print(f"  {what}: claimed {len(claimed)}; claimed twice: {twice}; lost: {lost}")
    if twice or lost:
        raise SystemExit(f"exactly-once check FAILED ({what})")
    return claimed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", help="PostgreSQL server URL (default: SQLite)")
    parser.add_argument("--turns", type=int, default=4000, help="pending turns per phase")
    parser.add_argument("--clients", type=int, default=8, help="worker processes")
    parser.add_argument("--limit", type=int, default=1, help="turns per dispatch call")
    parser.add_argument("--server-workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="gthread threads (0: sync)")
    parser.add_argument("--ceiling-seconds", type=float, default=10.0)
    parser.add_argument("--in-process", type=int, default=200, help="cycles without HTTP")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]

    with bench_database(args.postgres) as vendor:
        from django.db import connection

        from backend.dispatch.models import PromptReport
        from backend.tasks.models import Subtask, SubtaskStatus

        os.environ["DJANGO_SETTINGS_MODULE"] = "bench._ceiling_settings"  # the server's
        with live_baton(workers=args.server_workers, threads=args.threads) as baton:
            url, token = baton.url, baton.worker_token
            ceiling, ceiling_seconds = _run(
                _ceiling_client, lambda index: (url, args.ceiling_seconds), args.clients
            )
            ceiling_rps = sum(result[0] for result in ceiling) / ceiling_seconds

            seed(args.turns)
            connection.close()
            claims, claims_seconds = _run(
                _worker_client,
                lambda index: (url, token, index, args.limit, False),
                args.clients,
            )
            _check(claims, args.turns, "claims")
            claim_latency = [value for result in claims for value in result[3]]

            seed(args.turns)
            connection.close()
            cycles, cycle_seconds = _run(
                _worker_client,
                lambda index: (url, token, index, args.limit, True),
                args.clients,
            )
            cycled = _check(cycles, args.turns, "cycle")
            not_done = Subtask.objects.filter(pk__in=cycled).exclude(status=SubtaskStatus.COMPLETED)
            reports = PromptReport.objects.count()
            if not_done.exists() or reports != 2 * args.turns:
                raise SystemExit(
                    f"exactly-once check FAILED: {not_done.count()} not COMPLETED, "
                    f"{reports} prompt reports for {2 * args.turns} claims"
                )
            print("  every cycled turn COMPLETED; one prompt report per claim")
        seed(args.in_process + 1)
        dispatch_queries, report_queries, cycle_cpu_ms = _in_process(token, args.in_process)

    claims_per_second = args.turns / claims_seconds
    turns_per_second = args.turns / cycle_seconds
    server = (
        f"gthread {args.server_workers}x{args.threads}"
        if args.threads
        else f"{args.server_workers} sync workers"
    )
    print(
        f"database: {vendor}; gunicorn {server}; {args.clients} client processes; "
        f"limit={args.limit}; {args.turns} turns per phase; load before: {load_before:.2f}"
    )
    print(f"{'phase':<34} {'per second':>11} {'vs ceiling':>11}")
    print(f"{'bare view (2 queries), requests':<34} {ceiling_rps:>11.0f} {'':>11}")
    print(f"{'  ceiling for 2-request cycles':<34} {ceiling_rps / 2:>11.0f} {'1.00':>11}")
    print(f"{'claims (dispatch only)':<34} {claims_per_second:>11.0f} {'':>11}")
    print(
        f"{'turns (dispatch + report)':<34} {turns_per_second:>11.0f} "
        f"{turns_per_second / (ceiling_rps / 2):>11.2f}"
    )
    print(
        f"dispatch latency (claims phase): median {statistics.median(claim_latency) * 1000:.1f} ms"
    )
    print(
        f"in process ({args.in_process} cycles): {dispatch_queries} queries per dispatch, "
        f"{report_queries} per report, {cycle_cpu_ms:.1f} ms of CPU per cycle"
    )


if __name__ == "__main__":
    main()
