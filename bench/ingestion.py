"""Scenario: recording results and progress, database in the loop.

- record: `record_result` of a `--record-mb` (10) MB result (validation, ingestion, spill, the
  row), median of runs with distinct content, with tracemalloc's peak over the UTF-8 size; then
  the next turn's prompt (history window from the database + `build_prompt`) for a task of
  `--history-turns` rounds of 1 MB results against one of 1 KB results, with the queries per
  build.
- upload: over HTTP (gunicorn, one sync worker, SQLite), a `--upload-mb` MB build log recorded
  streamed (`executors.client.BackendClient.report`: `PUT .../result/value/`, then a small
  report) against inline (the value inside the JSON report), alternated, each in a fresh
  warmed-up server: the server worker's peak RSS growth (`VmHWM`, reset through `clear_refs`)
  over the value's size, and the time.
- progress: in process, one claimed turn; its partial answer brought to each of
  `--progress-sizes`, then `--posts` progress posts of `--step` characters each (and two small
  events), sent as the worker sends them (what the text gained, at its offset) against the whole
  text each time, alternated round by round. Per post: the process's Python CPU, and on
  PostgreSQL its backend's CPU (from /proc: PostgreSQL runs on this host) and the WAL written
  (`pg_current_wal_insert_lsn()`; other sessions of a shared server add some).
- body_limits (not in the plain run): `POST /api/tasks/` with a `--body-mib` MiB message over a
  raw socket that sends until the status line arrives; the time to that answer, the body the
  socket took, and the server worker's peak RSS growth.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import select
import socket
import statistics
import string
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import (  # noqa: E402
    LiveBaton,
    cpu_seconds,
    gunicorn_worker,
    live_baton,
    memory_kib,
    postgres_backends,
    reset_peak,
)
from bench._seed import pending_turns  # noqa: E402
from bench._suite import Measurement, Row, Scenario, at_most  # noqa: E402

# -- record: a big result, and the prompt's cost by result size ------------------------------


def make_text(size: int, seed: int) -> str:
    """Mixed English, code and Chinese, like real tool output."""
    rng = random.Random(seed)
    pieces = [
        "def handler(event):\n    return process(event['body'])\n",
        "INFO 2026-11-25 worker started pid=4242\n",
        "统一的任务历史记录和工件存储。\n",
        "The quick brown fox jumps over the lazy dog. ",
        "".join(rng.choice(string.ascii_letters) for _ in range(40)) + "\n",
    ]
    out: list[str] = []
    total = 0
    while total < size:
        piece = rng.choice(pieces)
        out.append(piece)
        total += len(piece)
    return "".join(out)[:size]


def _record(*, runs: int, size: int) -> tuple[float, float]:
    """Median seconds of `record_result` of `size` chars, and the largest peak of extra memory
    over the text's UTF-8 size."""
    from django.contrib.auth import get_user_model

    from backend.prompting import Role
    from backend.tasks.models import SubtaskStatus
    from backend.tasks.services import PipelineStep, create_task, record_result

    owner, _ = get_user_model().objects.get_or_create(username="bench")
    timings = []
    peaks = []
    for run in range(runs):
        text = make_text(size, seed=run)  # distinct content: every run writes a new artifact
        task = create_task(
            owner=owner,
            title="record",
            task_type="code",
            message="go",
            pipeline=[PipelineStep(executor="codex")],
        )
        turn = task.subtasks.get(role=Role.ASSISTANT)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": text})
        timings.append(time.perf_counter() - started)
        peaks.append((tracemalloc.get_traced_memory()[1] - base) / len(text.encode()))
        tracemalloc.stop()
    return statistics.median(timings), max(peaks)


def _history_of(result_size: int, turns: int, title: str) -> Any:
    from django.contrib.auth import get_user_model

    from backend.tasks.factories import conversation

    owner, _ = get_user_model().objects.get_or_create(username="bench")
    base = make_text(result_size, seed=result_size)
    return conversation(
        owner=owner,
        title=title,
        messages=["start"] + [f"follow-up {number}" for number in range(turns)],
        # A distinct prefix per turn, so each big result is its own artifact; a generator, so
        # only one big result is in memory at a time.
        answers=(f"result {number}\n" + base[: result_size - 20] for number in range(turns)),
    )


def _builds(task: Any, repeats: int) -> tuple[list[float], int]:
    """Wall times (ms) of the next turn's prompt, and the queries one build makes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from backend.prompting import PromptPolicy, Role, build_prompt
    from backend.tasks.history import prompt_input_for
    from backend.tasks.models import SubtaskStatus

    policy = PromptPolicy()
    turn = task.subtasks.get(role=Role.ASSISTANT, status=SubtaskStatus.PENDING)
    timings = []
    queries = 0
    for _ in range(repeats):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            build_prompt(prompt_input_for(subtask=turn, task=task, policy=policy), policy)
            timings.append((time.perf_counter() - started) * 1000)
        queries = len(captured.captured_queries)
    return timings, queries


def measure_record(args: argparse.Namespace) -> list[Row]:
    turns = args.history_turns
    with bench_database(args.postgres) as vendor:
        seconds, peak = _record(runs=args.record_runs, size=args.record_mb * 1024 * 1024)
        big = _history_of(1024 * 1024, turns, f"{turns} x 1 MB")
        small = _history_of(1024, turns, f"{turns} x 1 KB")
        _builds(small, 5)  # warm up (encoding load, connection)
        big_ms: list[float] = []
        small_ms: list[float] = []
        for _ in range(args.build_repeats // 10 or 1):  # in blocks, alternated
            big_block, queries = _builds(big, 10)
            small_block, _ = _builds(small, 10)
            big_ms += big_block
            small_ms += small_block
    return [
        Row(
            f"record a {args.record_mb} MB result ({vendor})",
            seconds,
            "s",
            target=at_most(0.5),
            note=f"median of {args.record_runs}, distinct content",
        ),
        Row(
            f"record a {args.record_mb} MB result: peak extra memory",
            peak,
            "x the UTF-8 size",
            target=at_most(3),
        ),
        Row(
            f"prompt build, {turns} x 1 MB results ({vendor})",
            statistics.median(big_ms),
            "ms",
            baseline_name=f"{turns} x 1 KB results",
            baseline_value=statistics.median(small_ms),
            target=at_most(1.5, of="ratio"),
            note=f"{queries} queries a build",
        ),
    ]


# -- upload: a big result over HTTP, streamed against inline ---------------------------------

LOG_LINE = "2026-11-26T10:00:00Z INFO build step {n:08d} compiled module ok\n"
WORKER_ID = "bench-w1"
_logs = itertools.count()


def build_log(size: int) -> str:
    """`size` chars of build-log lines (a command line first, an exit code last), distinct on
    every call so that every recording stores its own artifact."""
    head = f"$ make all  # run {next(_logs)}\n"
    tail = "exit code 0\n"
    lines = "".join(LOG_LINE.format(n=n) for n in range(size // len(LOG_LINE.format(n=0))))
    return (head + lines)[: size - len(tail)] + tail


def _claim(baton: LiveBaton, worker: httpx.Client) -> dict[str, Any]:
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
    return dict(turn)


def record_inline(baton: LiveBaton, worker: httpx.Client, value: str) -> None:
    turn = _claim(baton, worker)
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
    from executors.client import BackendClient

    turn = _claim(baton, worker)
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
UPLOADS: dict[str, Recording] = {"inline": record_inline, "streamed": record_streamed}


def _upload(record: Recording, value: str) -> tuple[float, float]:
    """One recording of `value` in a fresh server warmed up by recording a small result each
    way (so neither an earlier big request's allocator state nor first-use imports count):
    (peak RSS growth in MiB, seconds)."""
    with live_baton(workers=1) as baton:
        worker = httpx.Client(
            base_url=baton.url,
            headers={"Authorization": f"Token {baton.worker_token}"},
            timeout=300,
        )
        with worker:
            for warm_up in UPLOADS.values():  # 2 MB: spilled, previewed (and uploaded) each way
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


def measure_upload(args: argparse.Namespace) -> list[Row]:
    size = args.upload_mb * 1_000_000
    size_mib = size / 2**20
    growth: dict[str, list[float]] = {mode: [] for mode in UPLOADS}
    seconds: dict[str, list[float]] = {mode: [] for mode in UPLOADS}
    with bench_database(None):
        for _ in range(args.upload_runs):
            for mode, record in UPLOADS.items():  # alternated: both share the machine's noise
                mib, elapsed = _upload(record, build_log(size))
                growth[mode].append(mib)
                seconds[mode].append(elapsed)
    name = f"record a {args.upload_mb} MB result over HTTP, streamed"
    return [
        Row(
            f"{name}: peak RSS growth",
            max(growth["streamed"]) / size_mib,
            "x the value",
            baseline_name="inline",
            baseline_value=max(growth["inline"]) / size_mib,
            target=at_most(1),
            note=f"largest of {args.upload_runs}; streamed "
            f"+{statistics.median(growth['streamed']):.1f} MiB, inline "
            f"+{statistics.median(growth['inline']):.1f} MiB (medians)",
        ),
        Row(
            f"{name}: time",
            statistics.median(seconds["streamed"]),
            "s",
            baseline_name="inline",
            baseline_value=statistics.median(seconds["inline"]),
        ),
    ]


# -- progress: one post as the partial answer grows ------------------------------------------

WORDS = ("the", "agent", "reads", "the", "failing", "test", "and", "patches", "its", "fixture")
PROGRESS_MODES = ("whole", "append")  # the baseline first


def _prose(chars: int, salt: int) -> str:
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


def _progress_round(*, size: int, posts: int, step: int, mode: str) -> dict[str, float]:
    """A freshly claimed turn brought to `size` chars, then `posts` posts sent `mode`'s way:
    per post, Python CPU ms, and on PostgreSQL its backend's CPU ms and the WAL bytes."""
    from django.db import connection
    from django.test import Client

    from backend.dispatch.workers import ensure_worker_account

    _, token = ensure_worker_account(username="bench-worker")
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")
    pending_turns(1)
    answer = client.post(
        "/api/executor/dispatch/",
        {"kinds": ["codex"], "limit": 1, "worker_id": "bench"},
        content_type="application/json",
    )
    [turn] = answer.json()["turns"]
    url = f"/api/executor/subtasks/{turn['subtask_id']}/progress/"
    claim = {"worker_id": "bench", "attempt": turn["attempt"]}
    text = _prose(size, salt=turn["subtask_id"])
    answer = client.post(url, {**claim, "partial_text": text}, content_type="application/json")
    assert answer.status_code == 200, answer.json()
    bodies = []
    for number in range(posts):
        gained = " " + _prose(step - 1, salt=number)
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
    postgres = connection.vendor == "postgresql"
    backend = postgres_backends(other_than_mine=False) if postgres else []
    with connection.cursor() as cursor:
        if postgres:
            cursor.execute("SELECT pg_current_wal_insert_lsn()")
            lsn = str(cursor.fetchone()[0])
    database_before = sum(cpu_seconds(backend).values())
    started = time.process_time()
    for body_text in bodies:
        answer = client.post(url, body_text, content_type="application/json")
        assert answer.status_code == 200, answer.content
    measured = {"python_ms": (time.process_time() - started) * 1000 / posts}
    if postgres:
        spent = sum(cpu_seconds(backend).values()) - database_before
        measured["postgres_ms"] = spent * 1000 / posts
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [lsn])
            measured["wal_kb"] = int(cursor.fetchone()[0]) / posts / 1024
    return measured


def measure_progress(args: argparse.Namespace) -> list[Row]:
    sizes = [int(value) for value in args.progress_sizes.split(",")]
    rounds: dict[tuple[int, str], list[dict[str, float]]] = {}
    with bench_database(args.postgres) as vendor:
        for _ in range(args.progress_rounds):
            for size in sizes:
                for mode in PROGRESS_MODES:  # alternated: whole, append, whole, append
                    rounds.setdefault((size, mode), []).append(
                        _progress_round(size=size, posts=args.posts, step=args.step, mode=mode)
                    )
    figures = {
        "python_ms": ("Python CPU", "ms"),
        "postgres_ms": ("PostgreSQL CPU", "ms"),
        "wal_kb": ("WAL", "KB"),
    }
    rows = []
    for size in sizes:
        for key, (what, unit) in figures.items():
            if vendor != "postgresql" and key != "python_ms":
                continue

            def median_of(mode: str, key: str = key, size: int = size) -> float:
                return statistics.median(measured[key] for measured in rounds[(size, mode)])

            rows.append(
                Row(
                    f"progress post at {size:,} chars, appended: {what} a post ({vendor})",
                    median_of("append"),
                    unit,
                    baseline_name="whole text",
                    baseline_value=median_of("whole"),
                )
            )
    return rows


# -- body_limits: an oversized request body --------------------------------------------------

SEND_CHUNK = 1 << 20


def _post_until_answered(url: str, path: str, *, token: str, body: bytes) -> tuple[int, float, int]:
    """Send the request until its answer starts; (status, seconds, body bytes sent)."""
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\n"
        f"Authorization: Token {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        started = time.perf_counter()
        sock.sendall(head)
        sock.setblocking(False)
        view = memoryview(body)
        sent = 0
        answer = b""
        while b"\r\n" not in answer:
            writers = [sock] if sent < len(body) else []
            readable, writable, _ = select.select([sock], writers, [], 120)
            if readable:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            elif writable:
                try:
                    sent += sock.send(view[sent : sent + SEND_CHUNK])
                except (BrokenPipeError, ConnectionResetError):
                    sent = len(body)  # the server stopped reading; its answer is next
            else:
                raise SystemExit("no answer within 120 s")
        elapsed = time.perf_counter() - started
    status = int(answer.split(b" ", 2)[1]) if answer else 0
    return status, elapsed, sent


def measure_body_limits(args: argparse.Namespace) -> list[Row]:
    message = "x" * (args.body_mib << 20)
    body = json.dumps(
        {"title": "big", "task_type": "code", "executor": "codex", "message": message}
    ).encode("utf-8")
    del message
    answers = []
    with bench_database(None), live_baton(workers=1) as baton:
        worker = gunicorn_worker(baton.server_pid)
        for _ in range(args.body_requests):
            rss_before = memory_kib(worker, "VmRSS")
            reset_peak(worker)
            status, seconds, sent = _post_until_answered(
                baton.url, "/api/tasks/", token=baton.product_token, body=body
            )
            time.sleep(0.5)  # let the worker finish with the request before reading its peak
            growth = (memory_kib(worker, "VmHWM") - rss_before) / 1024
            answers.append((status, seconds, sent, growth))
    statuses = sorted({status for status, *_ in answers})
    sent_mib = [sent / 2**20 for _, _, sent, _ in answers]
    name = f"POST /api/tasks/ with a {args.body_mib} MiB message"
    return [
        Row(
            f"{name}: answer after",
            statistics.median(seconds for _, seconds, _, _ in answers),
            "s",
            note=f"status {', '.join(map(str, statuses))}; body sent "
            f"{min(sent_mib):.0f}–{max(sent_mib):.0f} MiB",
        ),
        Row(f"{name}: peak RSS growth", max(growth for *_, growth in answers), "MiB"),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record-mb", type=int, default=10, help="record: the result's size")
    parser.add_argument("--record-runs", type=int, default=7, help="record: recordings (median)")
    parser.add_argument(
        "--history-turns", type=int, default=200, help="record: rounds of the histories built"
    )
    parser.add_argument("--build-repeats", type=int, default=50, help="record: builds a history")
    parser.add_argument("--upload-mb", type=int, default=50, help="upload: the value's size, MB")
    parser.add_argument("--upload-runs", type=int, default=2, help="upload: recordings each way")
    parser.add_argument(
        "--progress-sizes", default="1000,200000", help="progress: stored characters"
    )
    parser.add_argument("--posts", type=int, default=20, help="progress: posts a round")
    parser.add_argument("--progress-rounds", type=int, default=3, help="progress: rounds (median)")
    parser.add_argument("--step", type=int, default=100, help="progress: characters a post adds")
    parser.add_argument("--body-mib", type=int, default=100, help="body_limits: message size")
    parser.add_argument("--body-requests", type=int, default=3, help="body_limits: requests")


SCENARIO = Scenario(
    name=Path(__file__).stem,
    summary="Recording results and progress: a big result, uploads, progress posts, body limits.",
    measurements=(
        Measurement("record", measure_record),
        Measurement("upload", measure_upload),
        Measurement("progress", measure_progress),
        Measurement("body_limits", measure_body_limits, default=False),
    ),
    add_arguments=add_arguments,
    quick={
        "record_mb": 2,
        "record_runs": 2,
        "history_turns": 10,
        "build_repeats": 10,
        "upload_mb": 4,
        "upload_runs": 1,
        "progress_sizes": "1000,20000",
        "posts": 5,
        "progress_rounds": 1,
        "body_mib": 10,
        "body_requests": 1,
    },
)

if __name__ == "__main__":
    SCENARIO.main()
