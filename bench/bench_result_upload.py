"""Recording a large result over HTTP: the server's peak memory, inline JSON vs. value upload.

Baton runs under gunicorn (one sync worker, so its memory is one process's) on a throwaway
SQLite database and artifact directory. A worker claims a turn and records a result whose value
is a `--mb` MB build log (ASCII, distinct per run), either

- inline: one `POST .../result/` with the value inside the JSON report, as workers did before,
- streamed: the worker's own client (`executors.client.BackendClient.report`), which uploads
  the value as a stream of UTF-8 (`PUT .../result/value/`) and then posts a report naming it.

The server worker's memory is read from /proc: its resident size before the request(s) and its
peak during them (`VmHWM`, reset first through `clear_refs`). Each measurement gets a fresh
server, warmed up by recording a small result both ways first, so that neither allocator state
left by an earlier big request nor first-use imports count.

    .venv/bin/python bench/bench_result_upload.py                  # 50 MB, 3 runs of each
    .venv/bin/python bench/bench_result_upload.py --mb 10 --runs 3
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import LiveBaton, gunicorn_worker, live_baton, memory_kib, reset_peak  # noqa: E402
from executors.client import BackendClient  # noqa: E402

LINE = "2026-11-26T10:00:00Z INFO build step {n:08d} compiled module ok\n"
WORKER_ID = "bench-w1"
_runs = itertools.count()


def build_log(size: int) -> str:
    """`size` chars of build-log lines (a command line first, an exit code last), distinct on
    every call so that every recording stores its own artifact."""
    head = f"$ make all  # run {next(_runs)}\n"
    tail = "exit code 0\n"
    lines = "".join(LINE.format(n=n) for n in range(size // len(LINE.format(n=0))))
    return (head + lines)[: size - len(tail)] + tail


def claim(baton: LiveBaton, worker: httpx.Client) -> dict:
    created = baton.product.post(
        "/api/tasks/",
        json={"title": "big", "task_type": "code", "executor": "codex", "message": "Build it."},
    )
    created.raise_for_status()
    answer = worker.post(
        "/api/executor/dispatch/", json={"kinds": ["codex"], "limit": 1, "worker_id": WORKER_ID}
    )
    answer.raise_for_status()
    [turn] = answer.json()["turns"]
    return turn


def record_inline(baton: LiveBaton, worker: httpx.Client, value: str) -> None:
    turn = claim(baton, worker)
    answer = worker.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
        json={
            "worker_id": WORKER_ID,
            "attempt": turn["attempt"],
            "status": "COMPLETED",
            "result": {"value": value},
        },
    )
    answer.raise_for_status()


def record_streamed(baton: LiveBaton, worker: httpx.Client, value: str) -> None:
    turn = claim(baton, worker)
    client = BackendClient(base_url=baton.url, token=baton.worker_token, worker_id=WORKER_ID)
    try:
        client.report(
            subtask_id=turn["subtask_id"],
            attempt=turn["attempt"],
            status="COMPLETED",
            result={"value": value},
        )
    finally:
        client.close()


Recording = Callable[[LiveBaton, httpx.Client, str], None]
MODES: dict[str, Recording] = {"inline": record_inline, "streamed": record_streamed}


def measure(mode: str, value: str, warm_ups: list[Recording]) -> tuple[float, float]:
    """One recording of `value` in a fresh server warmed up by `warm_ups`: (peak RSS growth
    in MiB, seconds)."""
    record = MODES[mode]
    with live_baton(workers=1) as baton:
        worker = httpx.Client(
            base_url=baton.url,
            headers={"Authorization": f"Token {baton.worker_token}"},
            timeout=300,
        )
        with worker:
            for warm_up in warm_ups:  # 2 MB: spilled, previewed (and uploaded) each way
                warm_up(baton, worker, build_log(2_000_000))
            pid = gunicorn_worker(baton.server_pid)
            time.sleep(0.5)
            rss_before = memory_kib(pid, "VmRSS")
            reset_peak(pid)
            started = time.perf_counter()
            record(baton, worker, value)
            elapsed = time.perf_counter() - started
            time.sleep(0.5)  # let the worker finish with the request before reading its peak
            peak = memory_kib(pid, "VmHWM")
    return (peak - rss_before) / 1024, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50, help="the value's size in MB (10^6 bytes)")
    parser.add_argument("--runs", type=int, default=3, help="measurements of each mode")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = parser.parse_args()

    size = args.mb * 1_000_000
    size_mib = size / 2**20
    rows: dict[str, list[tuple[float, float]]] = {mode: [] for mode in args.modes}
    with bench_database(None):
        for _ in range(args.runs):
            for mode in args.modes:  # interleaved, so both share the machine's noise
                value = build_log(size)
                rows[mode].append(measure(mode, value, [MODES[m] for m in args.modes]))
                del value
    print(
        f"\nRecording a {args.mb} MB result ({size:,} bytes of UTF-8, {size_mib:.1f} MiB), "
        f"gunicorn 1 sync worker, {args.runs} runs each"
    )
    print(f"{'mode':<9}  {'peak RSS growth (median, max)':>30}  {'x value size':>12}  {'time':>8}")
    for mode, results in rows.items():
        growths = [growth for growth, _ in results]
        median = statistics.median(growths)
        print(
            f"{mode:<9}  {median:>13.1f} MiB {max(growths):>10.1f} MiB  "
            f"{max(growths) / size_mib:>11.2f}x  "
            f"{statistics.median(seconds for _, seconds in results):>6.2f} s"
        )


if __name__ == "__main__":
    main()
