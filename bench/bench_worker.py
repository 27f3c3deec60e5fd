"""The executor worker's own overhead per turn, beside the executor's run time, over real HTTP.

Baton runs under gunicorn (the production server) on a throwaway database; the real worker
(`python -m executors`, one slot, so runs never overlap) runs the real Codex CLI, Claude Code and
Agno against Baton's stand-in model on loopback. Tasks are created over the task API and the
worker's own log lines (`turn_reported`, which carry timings and no content) give, per turn:

- start_ms: claim received → executor process started (workspace, launch, fork/exec)
- report_ms: executor exited → result recorded by the backend (parse, report round trip)
- overhead_ms: start_ms + report_ms, artifact downloads excluded (there are none here)
- executor_ms: the executor's own run, for scale

    .venv/bin/python bench/bench_worker.py                      # SQLite, 20 turns per executor
    .venv/bin/python bench/bench_worker.py --postgres postgres://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import live_baton, running_worker  # noqa: E402

KINDS = ("codex", "claude_code", "agno")


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20, help="turns per executor")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a database is created)")
    args = parser.parse_args()
    kinds = [kind for kind in args.kinds.split(",") if kind]

    workdir = Path(tempfile.mkdtemp(prefix="baton-bench-worker-"))
    with (
        bench_database(args.postgres) as vendor,
        live_baton() as baton,
        running_worker(
            baton, workdir=workdir, kinds=kinds, BATON_STANDIN_MODEL="always"
        ) as log_path,
    ):
        task_ids = []
        for kind in kinds:
            for number in range(args.turns):
                response = baton.product.post(
                    "/api/tasks/",
                    json={
                        "title": f"bench {kind} {number}",
                        "task_type": "code",
                        "executor": kind,
                        "message": f"Turn {number}: say hello.",
                    },
                )
                response.raise_for_status()
                task_ids.append(response.json()["id"])
        deadline = time.monotonic() + 60 + 10 * len(task_ids)
        while True:
            page = baton.product.get("/api/tasks/", params={"page_size": 200}).json()
            done = [t for t in page["results"] if t["status"] in ("COMPLETED", "FAILED")]
            if len(done) == len(task_ids):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(done)} of {len(task_ids)} turns finished")
            time.sleep(0.25)
        failed = [t["id"] for t in page["results"] if t["status"] != "COMPLETED"]

    reported = [
        json.loads(line.split(" baton.worker ", 1)[1])
        for line in log_path.read_text().splitlines()
        if '"event": "turn_reported"' in line
    ]
    print(f"\nWorker overhead per turn — {vendor}, gunicorn 4 workers, stand-in model, 1 slot")
    print(f"{len(reported)} turns reported, {len(failed)} not completed\n")
    header = f"{'executor':<12} {'turns':>5} {'overhead p50':>13} {'p90':>8} {'start p50':>10} "
    header += f"{'report p50':>11} {'executor p50':>13} {'overhead/executor':>18}"
    print(header)
    for kind in kinds:
        rows = [row for row in reported if row["executor"] == kind]
        if not rows:
            continue
        overhead = [row["overhead_ms"] for row in rows]
        executor = [row["executor_ms"] for row in rows]
        print(
            f"{kind:<12} {len(rows):>5} {statistics.median(overhead):>10.1f} ms "
            f"{_percentile(overhead, 0.9):>5.1f} ms "
            f"{statistics.median(row['start_ms'] for row in rows):>7.1f} ms "
            f"{statistics.median(row['report_ms'] for row in rows):>8.1f} ms "
            f"{statistics.median(executor):>10.1f} ms "
            f"{statistics.median(overhead) / statistics.median(executor):>17.1%}"
        )
    print("\ntarget: overhead p50 under 50 ms")


if __name__ == "__main__":
    main()
