"""Task views vs. result size: response bytes and peak memory of reading a task with big results.

Run from the repository root:

    .venv/bin/python bench/bench_task_views.py                 # four 30 MB results
    .venv/bin/python bench/bench_task_views.py --results 4 --size-mb 30

It stores, in a throwaway SQLite database and artifact directory, a task whose four assistant
turns each answered with a 30 MB result (through the real services, so they spill the way a
worker's reports do), then reads it through the whole HTTP stack (Django's test client: URL
routing, middleware, authentication, DRF, rendering), each request in a fresh process so that
process's peak RSS is that request's: `GET /api/tasks/{id}/`, `GET /api/tasks/{id}/subtasks/`,
and one turn's whole text streamed from its text endpoint (when the build has one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from _django import bench_database

LINE = "2026-11-25T10:00:00Z INFO build step {n:08d} compiled module ok\n"


def big_text(size: int, seed: int) -> str:
    """About `size` chars of build-log lines, distinct per seed (each is its own artifact)."""
    line_chars = len(LINE.format(n=0))
    return f"seed {seed}\n" + "".join(LINE.format(n=n) for n in range(size // line_chars))


def answers(count: int, size: int) -> Iterator[str]:
    for seed in range(count):
        yield big_text(size, seed)


def setup(*, results: int, size: int) -> dict[str, object]:
    """Store the task; return what the measuring processes need to find it."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.authtoken.models import Token

    from backend.tasks.factories import conversation

    owner = get_user_model().objects.create_user(username="bench")
    token, _ = Token.objects.get_or_create(user=owner)
    task = conversation(
        owner=owner,
        messages=[f"Run build {n}." for n in range(results)],
        answers=answers(results, size),
        title="Big results",
    )
    turn = task.subtasks.filter(role="ASSISTANT").order_by("message_id").first()
    assert turn is not None
    connection.close()
    return {"task": task.pk, "subtask": turn.pk, "token": token.key}


def _memory_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of this process, in KiB (Linux). Not `ru_maxrss`: Linux
    carries that across exec from the parent, which built the big results."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(path: str, token: str) -> None:
    """In a fresh process: one GET of `path`; print its status, body bytes and peak RSS."""
    import django

    django.setup()
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    client.get("/api/bots/")  # warm up: imports, URL resolver, first query
    before = _memory_kib("VmRSS")
    started = time.perf_counter()
    response = client.get(path)
    if response.streaming:
        size = sum(len(chunk) for chunk in response.streaming_content)
    else:
        size = len(response.content)
    elapsed = time.perf_counter() - started
    peak = _memory_kib("VmHWM")
    print(
        json.dumps(
            {
                "status": response.status_code,
                "bytes": size,
                "seconds": elapsed,
                "rss_before_kib": before,
                "rss_peak_kib": peak,
            }
        )
    )


def run_measure(var_dir: str, path: str, token: str) -> dict[str, float]:
    env = {
        **os.environ,
        "BATON_VAR_DIR": var_dir,
        "DJANGO_SETTINGS_MODULE": "settings",
        "DEBUG": "false",
        "BATON_LOG_LEVEL": "WARNING",
    }
    env.pop("DATABASE_URL", None)
    output = subprocess.run(
        [sys.executable, __file__, "--measure", path, "--token", token],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=4)
    parser.add_argument("--size-mb", type=int, default=30)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        measure(args.measure, args.token)
        return

    with bench_database(None):
        var_dir = os.environ["BATON_VAR_DIR"]
        stored = setup(results=args.results, size=args.size_mb * 1024 * 1024)
    task, subtask, token = stored["task"], stored["subtask"], str(stored["token"])
    paths = {
        "task detail": f"/api/tasks/{task}/",
        "subtask list": f"/api/tasks/{task}/subtasks/",
        "one turn's whole text": f"/api/tasks/{task}/subtasks/{subtask}/text/",
    }
    print(f"{args.results} results of {args.size_mb} MB each, SQLite, one process per request")
    print(f"{'request':<24}{'status':>7}{'response':>14}{'peak RSS':>12}{'RSS growth':>12}")
    for name, path in paths.items():
        row = run_measure(var_dir, path, token)
        print(
            f"{name:<24}{row['status']:>7}{row['bytes'] / 1e6:>11.2f} MB"
            f"{row['rss_peak_kib'] / 1024:>9.0f} MB"
            f"{(row['rss_peak_kib'] - row['rss_before_kib']) / 1024:>9.0f} MB"
        )


if __name__ == "__main__":
    main()
