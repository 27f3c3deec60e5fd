"""Long polling: how fast a new turn reaches a waiting worker, and what idle waiters cost.

Run from the repository root (PostgreSQL is the target; SQLite works for comparison):

    .venv/bin/python bench/bench_long_polling.py --postgres postgres://postgres@127.0.0.1:5432/postgres

Baton runs under gunicorn (2 processes of 100 threads, so one waiting request per thread) on
a throwaway database. `--waiters` clients (64) each loop on `POST /api/executor/dispatch/`
with `wait_seconds` 30, as idle workers do.

- Latency: `--rounds` times, a product client creates a task over HTTP (`POST /api/tasks/`);
  the time from sending that request to the moment a waiter's dispatch answers with its turn.
  The winner's wait had to be woken: by NOTIFY from whichever server process stored the turn.
- Idle cost: with every waiter waiting and nothing created, the CPU time (user + system, from
  /proc/<pid>/stat) the gunicorn processes use over `--idle-seconds` (10).
- Baseline: the same clients polling without a wait, every `--poll-seconds` (1, the worker's
  default BATON_WORKER_POLL_SECONDS): its latency and idle CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import LiveBaton, live_baton, server_cpu_seconds  # noqa: E402

WAIT_SECONDS = 30.0
SERVER_THREADS = 100
SERVER_PROCESSES = 2


class Waiters:
    """`count` idle workers, each a thread with its own connection, dispatching in a loop
    (with `wait_seconds`, or every `poll_seconds` without); records when each turn arrives."""

    def __init__(self, baton: LiveBaton, *, count: int, wait: float, poll_seconds: float) -> None:
        self.arrived: dict[int, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(
                target=self._loop, args=(baton, index, wait, poll_seconds), daemon=True
            )
            for index in range(count)
        ]

    def __enter__(self) -> Waiters:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=WAIT_SECONDS + 30)

    def _loop(self, baton: LiveBaton, index: int, wait: float, poll_seconds: float) -> None:
        body = {"kinds": ["codex"], "limit": 1, "worker_id": f"waiter-{index}"}
        if wait:
            body["wait_seconds"] = wait
        with httpx.Client(
            base_url=baton.url,
            headers={"Authorization": f"Token {baton.worker_token}"},
            timeout=WAIT_SECONDS + 30,
        ) as client:
            while not self._stop.is_set():
                response = client.post("/api/executor/dispatch/", json=body)
                now = time.monotonic()
                response.raise_for_status()
                turns = response.json()["turns"]
                with self._lock:
                    for turn in turns:
                        self.arrived[turn["subtask_id"]] = now
                if not wait and not turns:
                    self._stop.wait(poll_seconds)


def measure(
    baton: LiveBaton, *, waiters: int, wait: float, poll_seconds: float, rounds: int, idle: float
) -> tuple[list[float], list[float], float]:
    """Latencies in ms (from sending the request that creates the turn, and from its answer)
    and the server's idle CPU seconds per second."""
    latencies, after_answer = [], []
    with Waiters(baton, count=waiters, wait=wait, poll_seconds=poll_seconds) as pool:
        time.sleep(2.0)  # every waiter in its wait
        before = server_cpu_seconds(baton.server_pid)
        time.sleep(idle)
        idle_cpu = (server_cpu_seconds(baton.server_pid) - before) / idle
        for number in range(rounds):
            sent = time.monotonic()
            response = baton.product.post(
                "/api/tasks/",
                json={
                    "title": f"t{number}",
                    "task_type": "code",
                    "executor": "codex",
                    "message": "Say hello.",
                },
            )
            answered = time.monotonic()
            response.raise_for_status()
            subtask_id = response.json()["turns"][-1]["id"]
            deadline = time.monotonic() + 60
            while subtask_id not in pool.arrived:
                if time.monotonic() > deadline:
                    raise SystemExit(f"turn {subtask_id} never reached a waiter")
                time.sleep(0.001)
            latencies.append((pool.arrived[subtask_id] - sent) * 1000)
            after_answer.append((pool.arrived[subtask_id] - answered) * 1000)
            time.sleep(0.2)  # the winner waits again
    return latencies, after_answer, idle_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a database is created)")
    parser.add_argument("--waiters", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--poll-seconds", type=float, default=1.0)
    args = parser.parse_args()
    with (
        bench_database(args.postgres) as vendor,
        live_baton(workers=SERVER_PROCESSES, threads=SERVER_THREADS) as baton,
    ):
        rows = []
        for name, wait, poll in (
            ("long polling", WAIT_SECONDS, 0.0),
            (f"polling every {args.poll_seconds:g} s", 0.0, args.poll_seconds),
        ):
            latencies, after_answer, idle_cpu = measure(
                baton,
                waiters=args.waiters,
                wait=wait,
                poll_seconds=poll,
                rounds=args.rounds,
                idle=args.idle_seconds,
            )
            rows.append((name, latencies, after_answer, idle_cpu))
    print(
        f"\nLong polling — {vendor}, gunicorn {SERVER_PROCESSES}x{SERVER_THREADS} threads, "
        f"{args.waiters} idle waiters, {args.rounds} turns, idle over {args.idle_seconds:g} s\n"
    )
    print(
        f"{'mode':<22} {'latency p50':>12} {'p90':>9} {'max':>9} {'after answer p50':>17} "
        f"{'idle server CPU':>16} {'slowest round':>14}"
    )
    for name, latencies, after_answer, idle_cpu in rows:
        ordered = sorted(latencies)
        print(
            f"{name:<22} {statistics.median(ordered):>9.1f} ms "
            f"{ordered[int(0.9 * (len(ordered) - 1))]:>6.1f} ms {ordered[-1]:>6.1f} ms "
            f"{statistics.median(after_answer):>14.1f} ms {idle_cpu:>15.1%} "
            f"{latencies.index(ordered[-1]) + 1:>14}"
        )
    print("\ntarget: latency p50 under 100 ms; idle CPU near zero (% of one core)")


if __name__ == "__main__":
    main()
