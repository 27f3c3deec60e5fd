"""The dispatch cycle over real HTTP: claims and result reports against the production server.

Run from the repository root (PostgreSQL is the target; SQLite works for comparison):

    .venv/bin/python bench/bench_http_dispatch.py --postgres postgres://postgres@127.0.0.1:5432/postgres

Baton runs under gunicorn (`--server-workers` sync processes, or gthread with `--threads`) on a
throwaway database; `--clients` processes (8) play executor workers over HTTP with httpx, each
with its own keep-alive connection and worker id. Three phases, in one run so they share the
machine's state:

- ceiling: every client loops on a bare Django view doing two queries (`bench/_ceiling_urls.py`)
  for `--ceiling-seconds`: requests per second. A dispatch cycle is two requests, so half of
  it is the ceiling for turns per second. Measured before the claims and again after the
  cycle: this machine's speed drifts within minutes, so the ratios ("vs ceiling": claims per
  second over bare requests per second, turns per second over half of them) divide by the
  mean of the two, and the spread between them says how far a run can be trusted.
- claims: `--turns` tasks are seeded (two answered rounds and one pending turn each); every
  client loops on `POST /api/executor/dispatch/` at `--limit` until nothing is left.
- cycle: as many again; every client loops on dispatch, then reports each turn's result
  (`POST /api/executor/subtasks/{id}/result/`), until nothing is left.

Then, in this process (Django's test client, no HTTP), `--in-process` more cycles: the queries
each request makes and the CPU time a cycle costs the server's Python.

Verified by counting: no turn claimed twice (the claimed ids are distinct), none lost (every
seeded turn claimed; after the cycle, every one COMPLETED), one prompt report per claim.
With `--native-sessions` each result report names a native session, as the workers of Codex
CLI and Claude Code do, so Baton records what that session has seen (one per report, counted).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import live_baton, machine_cpu_seconds, server_cpu_seconds  # noqa: E402
from bench.bench_dispatch import seed  # noqa: E402


def _ceiling_client(url: str, seconds: float, start_at: float, queue) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        cpu_at_start = time.process_time()
        done = 0
        end = start_at + seconds
        while time.time() < end:
            response = client.get("/bench/ceiling/")
            response.raise_for_status()
            done += 1
    queue.put((done, [], time.time(), [], time.process_time() - cpu_at_start))


def _worker_client(
    url: str,
    token: str,
    index: int,
    limit: int,
    report: bool,
    sessions: bool,
    start_at: float,
    queue,
) -> None:
    worker_id = f"bench-{index}"
    headers = {"Authorization": f"Token {token}"}
    claimed: list[int] = []
    latencies: list[float] = []
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        cpu_at_start = time.process_time()
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
                            **_session(turn, sessions),
                        },
                    )
                    answer.raise_for_status()
    queue.put((len(claimed), claimed, time.time(), latencies, time.process_time() - cpu_at_start))


def _session(turn: dict, sessions: bool) -> dict:
    """With `--native-sessions`, a report names the executor's native session, as Codex CLI's
    and Claude Code's workers do: Baton then records what that session has seen."""
    return {"native_session_id": f"session-{turn['subtask_id']}"} if sessions else {}


@dataclass(frozen=True)
class Phase:
    results: list
    seconds: float  # from the start until the last client finished
    machine_cpu: float  # CPU seconds, all cores, every process on the machine
    server_cpu: float  # gunicorn's processes
    client_cpu: float  # the client processes (each from the start)


def _run(target, args_for, clients: int, *, server_pid: int) -> Phase:
    """Start `clients` processes together and wait for their results; the machine's, the
    server's and the clients' CPU over the same span (the rest is mostly PostgreSQL)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.time() + 3.0  # every process imports and connects first
    processes = [
        context.Process(target=target, args=(*args_for(index), start_at, queue))
        for index in range(clients)
    ]
    for process in processes:
        process.start()
    time.sleep(max(0.0, start_at - time.time()))
    machine, server = machine_cpu_seconds(), server_cpu_seconds(server_pid)
    results = [queue.get() for _ in processes]
    machine, server = machine_cpu_seconds() - machine, server_cpu_seconds(server_pid) - server
    for process in processes:
        process.join()
    return Phase(
        results=results,
        seconds=max(result[2] for result in results) - start_at,
        machine_cpu=machine,
        server_cpu=server,
        client_cpu=sum(result[4] for result in results),
    )


def _in_process(token: str, cycles: int, sessions: bool) -> tuple[int, int, float]:
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
                    **_session(turn, sessions),
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


def _requests(phase: Phase) -> int:
    return sum(result[0] for result in phase.results)


def _check(results: list, expected: int, what: str) -> list[int]:
    claimed = [subtask_id for _, ids, *_ in results for subtask_id in ids]
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
    parser.add_argument(
        "--native-sessions", action="store_true", help="reports name a native session"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]

    with bench_database(args.postgres) as vendor:
        from django.db import connection

        from backend.dispatch.models import PromptReport
        from backend.tasks.models import NativeSession, Subtask, SubtaskStatus

        os.environ["DJANGO_SETTINGS_MODULE"] = "bench._ceiling_settings"  # the server's
        with live_baton(workers=args.server_workers, threads=args.threads) as baton:
            url, token = baton.url, baton.worker_token
            pid = baton.server_pid
            ceiling = _run(
                _ceiling_client,
                lambda index: (url, args.ceiling_seconds),
                args.clients,
                server_pid=pid,
            )

            seed(args.turns)
            connection.close()
            claims = _run(
                _worker_client,
                lambda index: (url, token, index, args.limit, False, False),
                args.clients,
                server_pid=pid,
            )
            _check(claims.results, args.turns, "claims")
            claim_latency = [value for result in claims.results for value in result[3]]

            seed(args.turns)
            connection.close()
            cycles = _run(
                _worker_client,
                lambda index: (url, token, index, args.limit, True, args.native_sessions),
                args.clients,
                server_pid=pid,
            )
            cycled = _check(cycles.results, args.turns, "cycle")
            not_done = Subtask.objects.filter(pk__in=cycled).exclude(status=SubtaskStatus.COMPLETED)
            reports = PromptReport.objects.count()
            if not_done.exists() or reports != 2 * args.turns:
                raise SystemExit(
                    f"exactly-once check FAILED: {not_done.count()} not COMPLETED, "
                    f"{reports} prompt reports for {2 * args.turns} claims"
                )
            print("  every cycled turn COMPLETED; one prompt report per claim")
            if args.native_sessions:
                sessions = NativeSession.objects.count()
                if sessions != args.turns:
                    raise SystemExit(f"{sessions} native sessions for {args.turns} reports")
                print("  one native session recorded per report")
            # The ceiling again, after: this machine's speed drifts within minutes, and the
            # ratios divide by the mean of the two (their spread says how far to trust them).
            ceiling_after = _run(
                _ceiling_client,
                lambda index: (url, args.ceiling_seconds),
                args.clients,
                server_pid=pid,
            )
        seed(args.in_process + 1)
        dispatch_queries, report_queries, cycle_cpu_ms = _in_process(
            token, args.in_process, args.native_sessions
        )

    bare = [
        sum(result[0] for result in phase.results) / phase.seconds
        for phase in (ceiling, ceiling_after)
    ]
    ceiling_rps = statistics.mean(bare)
    claims_per_second = args.turns / claims.seconds
    turns_per_second = args.turns / cycles.seconds
    server = (
        f"gthread {args.server_workers}x{args.threads}"
        if args.threads
        else f"{args.server_workers} sync workers"
    )
    print(
        f"database: {vendor}; gunicorn {server}; {args.clients} client processes; "
        f"limit={args.limit}; {args.turns} turns per phase; load before: {load_before:.2f}"
        + ("; reports name native sessions" if args.native_sessions else "")
    )
    header = f"{'phase':<34} {'per second':>10} {'vs ceiling':>10}   CPU ms per item:"
    print(f"{header} {'server':>7} {'clients':>7} {'rest':>7}")
    rows = [
        ("bare view (2 queries), before", bare[0], "", ceiling, _requests(ceiling)),
        ("bare view (2 queries), after", bare[1], "", ceiling_after, _requests(ceiling_after)),
        ("  ceiling: their mean, requests", ceiling_rps, "1.00", None, 0),
        ("  ceiling for 2-request cycles", ceiling_rps / 2, "1.00", None, 0),
        (
            "claims (dispatch only)",
            claims_per_second,
            f"{claims_per_second / ceiling_rps:.2f}",
            claims,
            args.turns,
        ),
        (
            "turns (dispatch + report)",
            turns_per_second,
            f"{turns_per_second / (ceiling_rps / 2):.2f}",
            cycles,
            args.turns,
        ),
    ]
    for name, rate, ratio, phase, items in rows:
        cpu = ""
        if phase is not None:
            rest = phase.machine_cpu - phase.server_cpu - phase.client_cpu
            cpu = " ".join(
                f"{value / items * 1000:>7.2f}"
                for value in (phase.server_cpu, phase.client_cpu, rest)
            )
        print(f"{name:<34} {rate:>10.0f} {ratio:>10}   {'':16} {cpu}")
    print(
        f"dispatch latency (claims phase): median {statistics.median(claim_latency) * 1000:.1f} ms"
    )
    print(
        f"in process ({args.in_process} cycles): {dispatch_queries} queries per dispatch, "
        f"{report_queries} per report, {cycle_cpu_ms:.1f} ms of CPU per cycle"
    )


if __name__ == "__main__":
    main()
