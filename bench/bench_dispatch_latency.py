"""Issue 14: how long one dispatch takes when its task has a long history, over real HTTP.

Run from the repository root (PostgreSQL is the target; SQLite works for comparison):

    .venv/bin/python bench/bench_dispatch_latency.py --postgres postgres://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/bench_dispatch_latency.py --postgres ... --sizes 10,10000 --rounds 50

Baton runs under gunicorn (4 sync workers) on a throwaway database. For each `--sizes` entry,
tasks are seeded with that many earlier turns: user messages of 80-1,200 chars, answers of
200-4,000, one answer in a hundred a ~24,000-char build log that spills to an artifact. With
`--history api` (the default) each task is built the way a product and a worker build it, in
this process through Django's test client: the task created over the API, then round after
round its turn dispatched (`limit` 1), answered with a native session id (as Codex CLI's and
Claude Code's workers report) and followed up, so the task has what real use leaves behind: a
prompt report or two per dispatch, its events, its native session, its transcript's sealed
parts and the artifacts each dispatch stored. That takes a while (about 5,000 cycles for a
10,000-turn task). With `--history bulk` the turns are bulk-created with the fields ingestion
stores and their turn files written once, as the first dispatch that omits history writes
them (`bench_history_files.py` measures that): quick, but without the rows real use adds. On
PostgreSQL the tables are then ANALYZEd, as a live database's are.

One client (httpx, keep-alive) plays a product and an idle executor worker. Each round, for
each size in turn, it sends a follow-up (`POST /api/tasks/{id}/messages/`: one pending turn),
claims it (`POST /api/executor/dispatch/`, limit 1: the timed request) and reports its result
(`POST /api/executor/subtasks/{id}/result/`), which adds the answer to the history. The sizes
take turns round by round (in alternating order), so they share the machine's noise; the first
`--warmup` rounds are not timed. A task's history grows by two turns a round, so a task serves
at most history/20 rounds (at most 10 % growth) before a fresh one of the same size takes over:
a 10-turn task serves one round, and every 10-turn dispatch sees exactly 10 earlier turns.

Then, in this process, `--profiles` more dispatches per size through Django's test client with
the queries captured (count, total and slowest, at 1 ms resolution), and with `--cprofile` one
more under the Python profiler: where a long history's time goes. The load average is printed:
on a shared machine only the ratios mean much.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import random
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import live_baton, server_cpu_seconds  # noqa: E402

if TYPE_CHECKING:
    from django.contrib.auth.models import User

WORKER_ID = "bench-latency"
# The words the seeded texts are drawn from: prose, commands and code, as in a coding task.
VOCABULARY = (
    "the test upload fails because cleanup races with a reader of the shared tmp dir so we "
    "give each test its own tmp_path and keep the retry constant unchanged; run pytest -q "
    "tests/test_upload.py again: 212 passed, 3 failed in 4.2s. def store(path, data): "
    "return path.write_bytes(data) # the migration adds an index on (task_id, message_id)"
)
WORDS = VOCABULARY.split()
# A query's column list, left out where the slowest query is named.
_SELECTED_COLUMNS = re.compile(r"^SELECT .*? FROM")
BUILD_LOG = "".join(f"build step {step:05d}: compiled module ok\n" for step in range(600))


def text_of(rng: random.Random, *, label: str, low: int, high: int) -> str:
    """Prose-and-code text of a length drawn log-uniformly between `low` and `high` chars,
    starting with `label` so no two turns have the same text."""
    target = int(math.exp(rng.uniform(math.log(low), math.log(high))))
    words = [label]
    size = len(label)
    while size < target:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def answer_of(rng: random.Random, number: int) -> str:
    """An answer: one in a hundred a long build log (it spills), the others 200-4,000 chars."""
    if number % 100 == 99:
        return f"Answer {number}: the build log follows.\n{BUILD_LOG}"
    return text_of(rng, label=f"Answer {number}:", low=200, high=4000)


def seed_history(*, owner: User, turns: int, rng: random.Random) -> int:
    """A COMPLETED task with `turns` earlier turns (USER and ASSISTANT alternating), written in
    bulk with what ingestion would have stored; returns its id. `turns` must be even."""
    from django.utils import timezone

    from backend.artifacts.services import atomic_storing_artifacts
    from backend.prompting import Role
    from backend.tasks.ingestion import ingest_text
    from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskStatus
    from backend.tasks.services import PipelineStep, resolve_pipeline

    pipeline = resolve_pipeline(PipelineStep(executor="codex"))
    [step] = pipeline
    now = timezone.now()
    with atomic_storing_artifacts():
        task = Task.objects.create(
            owner=owner,
            title=f"{turns} turns of history",
            task_type="code",
            status=TaskStatus.COMPLETED,
            pipeline=pipeline,
            next_message_id=turns + 1,
        )
        rows = []
        for message_id in range(1, turns + 1):
            user = message_id % 2 == 1
            number = message_id // 2
            text = (
                text_of(rng, label=f"Message {number}:", low=80, high=1200)
                if user
                else answer_of(rng, number)
            )
            ingested = ingest_text(text=text, task=task)
            rows.append(
                Subtask(
                    task=task,
                    message_id=message_id,
                    parent_message_id=None if user else message_id - 1,
                    role=Role.USER if user else Role.ASSISTANT,
                    status=SubtaskStatus.COMPLETED,
                    bot="" if user else step["bot"],
                    pipeline_step=None if user else 0,
                    executor="" if user else step["executor"],
                    context_passing="" if user else (step["context_passing"] or ""),
                    message=text if user else "",
                    result=None if user else {"value": text},
                    history_text=ingested.history_text,
                    history_text_tokens=ingested.history_text_tokens,
                    history_text_tokens_o200k=ingested.history_text_tokens_o200k,
                    preview_head=ingested.preview_head,
                    preview_tail=ingested.preview_tail,
                    preview_layout=ingested.preview_layout,
                    history_chars=ingested.chars,
                    history_bytes=ingested.bytes,
                    history_lines=ingested.lines,
                    history_tokens=ingested.tokens,
                    history_tokens_estimated=ingested.tokens_estimated,
                    artifact=ingested.artifact,
                    history_is_preview=ingested.artifact is not None,
                    recorded_at=now,
                    created_at=now,
                    started_at=None if user else now,
                    finished_at=now,
                )
            )
        Subtask.objects.bulk_create(rows, batch_size=1000)
    return task.pk


def seed_history_through_api(*, owner: User, turns: int, rng: random.Random) -> int:
    """A task of `owner` with `turns` earlier turns built as a product and a worker build one
    (see the module's docstring), every turn answered; returns its id. `turns` must be even.
    The worker is the account `live_baton` gives the timed rounds."""
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from backend.dispatch.workers import ensure_worker_account

    _, worker_token = ensure_worker_account(username="bench-worker")
    product = Client(
        headers={"Authorization": f"Token {Token.objects.get_or_create(user=owner)[0].key}"}
    )
    worker = Client(headers={"Authorization": f"Token {worker_token}"})

    def answered(status: int, response: Any) -> Any:
        if response.status_code != status:
            raise SystemExit(f"seeding: HTTP {response.status_code}: {response.content[:300]!r}")
        return response.json()

    task = answered(
        201,
        product.post(
            "/api/tasks/",
            {
                "title": f"{turns} turns of history, built over the API",
                "task_type": "code",
                "executor": "codex",
                "message": text_of(rng, label="Message 0:", low=80, high=1200),
            },
            content_type="application/json",
        ),
    )
    for number in range(turns // 2):
        if number:
            answered(
                201,
                product.post(
                    f"/api/tasks/{task['id']}/messages/",
                    {"message": text_of(rng, label=f"Message {number}:", low=80, high=1200)},
                    content_type="application/json",
                ),
            )
        [turn] = answered(
            200,
            worker.post(
                "/api/executor/dispatch/",
                {"worker_id": WORKER_ID, "kinds": ["codex"], "limit": 1},
                content_type="application/json",
            ),
        )["turns"]
        answered(
            200,
            worker.post(
                f"/api/executor/subtasks/{turn['subtask_id']}/result/",
                report_body(turn, answer=answer_of(rng, number), task_id=task["id"]),
                content_type="application/json",
            ),
        )
    return int(task["id"])


def report_body(turn: dict[str, Any], *, answer: str, task_id: int) -> dict[str, Any]:
    """A COMPLETED result for a dispatched turn, naming the task's native session as the
    workers of Codex CLI and Claude Code do."""
    return {
        "worker_id": WORKER_ID,
        "attempt": turn["attempt"],
        "status": "COMPLETED",
        "result": {"value": answer},
        "native_session_id": f"bench-session-{task_id}",
    }


def write_turn_files(*, task_id: int, before_message_id: int) -> None:
    """Store the task's turn files and transcript as its first omitting dispatch would: a
    one-time cost in a task's life, not what a later dispatch pays (bench_history_files.py
    measures it)."""
    from backend.tasks.transcripts import TranscriptRequest, store_transcripts, transcripts_for

    request = TranscriptRequest(
        task_id=task_id, is_group_chat=False, multi_bot=False, before_message_id=before_message_id
    )
    store_transcripts(transcripts_for([request]))


@dataclass
class HistorySize:
    """The tasks of one history length, and what their dispatches measured.

    A task serves `rounds_per_task` rounds, so its history grows by at most 10 %; then a fresh
    task of the same length takes over (a 10-turn task serves one round, and stays at 10)."""

    history: int
    task_ids: list[int]
    # Whether its results name a native session (histories built through the API do).
    native_sessions: bool = False
    dispatch: list[float] = field(default_factory=list)
    dispatch_cpu: list[float] = field(default_factory=list)
    report: list[float] = field(default_factory=list)
    follow_up: list[float] = field(default_factory=list)
    response_bytes: list[int] = field(default_factory=list)
    manifest_entries: list[int] = field(default_factory=list)

    @staticmethod
    def rounds_per_task(history: int) -> int:
        return max(1, history // 20)

    def task_for(self, number: int) -> int:
        return self.task_ids[number // self.rounds_per_task(self.history)]


def seed_size(
    *, owner: User, history: int, rounds: int, rng: random.Random, through_api: bool
) -> HistorySize:
    """Enough tasks of `history` earlier turns for `rounds` rounds: built through the API, or
    bulk-created with their turn files written."""
    count = math.ceil(rounds / HistorySize.rounds_per_task(history))
    if through_api:
        task_ids = [
            seed_history_through_api(owner=owner, turns=history, rng=rng) for _ in range(count)
        ]
        return HistorySize(history=history, task_ids=task_ids, native_sessions=True)
    task_ids = [seed_history(owner=owner, turns=history, rng=rng) for _ in range(count)]
    for task_id in task_ids:
        write_turn_files(task_id=task_id, before_message_id=history + 1)
    return HistorySize(history=history, task_ids=task_ids)


def one_round(
    *,
    product: httpx.Client,
    worker: httpx.Client,
    size: HistorySize,
    rng: random.Random,
    number: int,
    timed: bool,
    server_cpu: Callable[[], float],
) -> None:
    """Follow-up, dispatch (timed, with the server's CPU: the one client waits for each
    answer, so the server does nothing else meanwhile), report, on the round's task of this
    size."""
    task_id = size.task_for(number)
    began = time.perf_counter()
    sent = product.post(
        f"/api/tasks/{task_id}/messages/",
        json={"message": text_of(rng, label=f"Follow-up {number}:", low=80, high=1200)},
    )
    followed = time.perf_counter()
    sent.raise_for_status()
    cpu_before = server_cpu()
    response = worker.post(
        "/api/executor/dispatch/",
        json={"worker_id": WORKER_ID, "kinds": ["codex"], "limit": 1},
    )
    dispatched = time.perf_counter()
    dispatch_cpu = server_cpu() - cpu_before
    response.raise_for_status()
    [turn] = response.json()["turns"]
    if turn["task_id"] != task_id:
        raise SystemExit(f"claimed a turn of task {turn['task_id']}, not {task_id}")
    body = report_body(turn, answer=answer_of(rng, number), task_id=task_id)
    if not size.native_sessions:
        del body["native_session_id"]
    reported = worker.post(f"/api/executor/subtasks/{turn['subtask_id']}/result/", json=body)
    finished = time.perf_counter()
    reported.raise_for_status()
    if timed:
        size.follow_up.append(followed - began)
        size.dispatch.append(dispatched - followed)
        size.dispatch_cpu.append(dispatch_cpu)
        size.report.append(finished - dispatched)
        size.response_bytes.append(len(response.content))
        size.manifest_entries.append(
            len(turn["artifacts"])
            + sum(len(entry["parts"] or ()) for entry in turn["artifacts"])
            + len(turn["artifact_lists"])
        )


@dataclass(frozen=True)
class QueryProfile:
    """One in-process dispatch: its wall time and the queries it ran."""

    history: int
    total_ms: float
    queries: int
    sql_ms: float
    slowest_ms: float
    slowest_sql: str
    python_profile: str = ""


def profile_dispatch(
    *, size: HistorySize, number: int, worker_token: str, cprofile: bool = False
) -> QueryProfile:
    """The round's follow-up and its dispatch in this process, the dispatch's queries captured
    (and, with `cprofile`, its Python profile printed), then its report."""
    import cProfile
    import pstats

    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from backend.tasks.models import Subtask, SubtaskStatus, Task
    from backend.tasks.services import append_message, record_result

    task = Task.objects.get(pk=size.task_for(number))
    append_message(task=task, message=f"Follow-up {number}: once more, in process.")
    client = Client(headers={"Authorization": f"Token {worker_token}"})
    profiler = cProfile.Profile()
    with CaptureQueriesContext(connection) as captured:
        began = time.perf_counter()
        with profiler if cprofile else contextlib.nullcontext():
            response = client.post(
                "/api/executor/dispatch/",
                {"worker_id": WORKER_ID, "kinds": ["codex"], "limit": 1},
                content_type="application/json",
            )
        total = time.perf_counter() - began
    [turn] = response.json()["turns"]
    record_result(
        subtask=Subtask.objects.get(pk=turn["subtask_id"]),
        status=SubtaskStatus.COMPLETED,
        result={"value": answer_of(random.Random(number), number)},
    )
    python_profile = io.StringIO()
    if cprofile:
        stats = pstats.Stats(profiler, stream=python_profile).sort_stats("cumulative")
        stats.print_stats(r"backend/|rest_framework/serializers|renderers", 25)
        python_profile.write("queries (ms, statement):\n")
        for query in captured.captured_queries:
            statement = _SELECTED_COLUMNS.sub("SELECT … FROM", " ".join(query["sql"].split()))
            python_profile.write(f"{float(query['time']) * 1000:6.1f}  {statement[:150]}\n")
    times = [float(query["time"]) for query in captured.captured_queries]
    slowest = max(range(len(times)), key=times.__getitem__)
    return QueryProfile(
        history=size.history,
        total_ms=total * 1000,
        queries=len(times),
        sql_ms=sum(times) * 1000,
        slowest_ms=times[slowest] * 1000,
        slowest_sql=_SELECTED_COLUMNS.sub(
            "SELECT … FROM", " ".join(captured.captured_queries[slowest]["sql"].split()), count=1
        )[:100],
        python_profile=python_profile.getvalue(),
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def history_range(size: HistorySize, rounds: int) -> str:
    """The earlier turns the timed dispatches saw: from the seeded length up to its growth."""
    grown = size.history + 2 * (min(rounds, HistorySize.rounds_per_task(size.history)) - 1)
    return f"{size.history:,}" if grown == size.history else f"{size.history:,}-{grown:,}"


def print_http_table(sizes: list[HistorySize], *, rounds: int) -> None:
    base = statistics.median(sizes[0].dispatch)
    base_cpu = statistics.mean(sizes[0].dispatch_cpu)
    print(
        f"{'history':>13} {'median':>10} {'p90':>10} {'min':>10} {'ratio':>6} "
        f"{'CPU':>9} {'ratio':>6} "
        f"{'follow-up':>10} {'report':>10} {'response':>10} {'manifest':>9}"
    )
    for size in sizes:
        median = statistics.median(size.dispatch)
        cpu = statistics.mean(size.dispatch_cpu)
        print(
            f"{history_range(size, rounds):>13} {ms(median):>10} {ms(p90(size.dispatch)):>10} "
            f"{ms(min(size.dispatch)):>10} {median / base:>5.2f}x "
            f"{ms(cpu):>9} {cpu / base_cpu if base_cpu else float('nan'):>5.2f}x "
            f"{ms(statistics.median(size.follow_up)):>10} "
            f"{ms(statistics.median(size.report)):>10} "
            f"{statistics.median(size.response_bytes) / 1024:>6.0f} KiB "
            f"{int(statistics.median(size.manifest_entries)):>9,}"
        )


def print_query_table(profiles: list[QueryProfile], sizes: list[HistorySize]) -> None:
    print(f"{'history':>8} {'total':>10} {'queries':>8} {'SQL':>10} {'slowest':>10}  slowest query")
    for size in sizes:
        mine = [profile for profile in profiles if profile.history == size.history]
        slowest = max(mine, key=lambda profile: profile.slowest_ms)
        print(
            f"{size.history:>8,} {statistics.median(p.total_ms for p in mine):>7.1f} ms "
            f"{int(statistics.median(p.queries for p in mine)):>8} "
            f"{statistics.median(p.sql_ms for p in mine):>7.1f} ms "
            f"{statistics.median(p.slowest_ms for p in mine):>7.1f} ms  {slowest.slowest_sql}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", help="PostgreSQL server URL (default: SQLite)")
    parser.add_argument(
        "--sizes", default="10,4000,10000", help="earlier turns per task, comma-separated"
    )
    parser.add_argument(
        "--history",
        choices=("api", "bulk"),
        default="api",
        help="build the earlier turns through the API (as products and workers do) or in bulk",
    )
    parser.add_argument("--rounds", type=int, default=200, help="timed dispatches per size")
    parser.add_argument("--warmup", type=int, default=4, help="untimed rounds first")
    parser.add_argument("--server-workers", type=int, default=4)
    parser.add_argument("--profiles", type=int, default=3, help="in-process dispatches per size")
    parser.add_argument(
        "--cprofile", action="store_true", help="print a Python profile of one in-process dispatch"
    )
    args = parser.parse_args()
    histories = [int(size) for size in args.sizes.split(",")]
    if any(history < 2 or history % 2 for history in histories):
        raise SystemExit("--sizes: even numbers of turns (answered rounds), at least 2")
    if args.rounds < 2 or args.profiles < 1:
        raise SystemExit("--rounds: at least 2 (for a p90); --profiles: at least 1")
    # Warm-up rounds, timed rounds, then in-process rounds: one untimed, the profiled ones and
    # the one `--cprofile` profiles (kept apart: the profiler slows what it watches).
    http_rounds = args.warmup + args.rounds
    all_rounds = http_rounds + 1 + args.profiles + 1

    rng = random.Random(14)
    with bench_database(args.postgres) as vendor:
        from django.contrib.auth import get_user_model
        from django.db import connection

        owner, _ = get_user_model().objects.get_or_create(username="bench-product")
        seeding = time.perf_counter()
        sizes = [
            seed_size(
                owner=owner,
                history=history,
                rounds=all_rounds,
                rng=rng,
                through_api=args.history == "api",
            )
            for history in histories
        ]
        if vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")  # planner statistics, as a live table has them
        seeded_in = time.perf_counter() - seeding
        connection.close()
        load_before = os.getloadavg()
        with (
            live_baton(workers=args.server_workers) as baton,
            httpx.Client(
                base_url=baton.url,
                headers={"Authorization": f"Token {baton.worker_token}"},
                timeout=120,
            ) as worker,
        ):
            for number in range(http_rounds):
                # Alternate the order, so no size always runs right after another.
                for size in sizes if number % 2 else reversed(sizes):
                    one_round(
                        product=baton.product,
                        worker=worker,
                        size=size,
                        rng=rng,
                        number=number,
                        timed=number >= args.warmup,
                        server_cpu=partial(server_cpu_seconds, baton.server_pid),
                    )
            load_after = os.getloadavg()
            worker_token = baton.worker_token
        profiles = [
            profile_dispatch(size=size, number=number, worker_token=worker_token)
            for number in range(http_rounds, all_rounds - 1)
            for size in sizes
        ]
        python_profiles = [
            profile_dispatch(
                size=size, number=all_rounds - 1, worker_token=worker_token, cprofile=True
            )
            for size in sizes
            if args.cprofile
        ]
    shutil.rmtree(os.environ["BATON_VAR_DIR"], ignore_errors=True)

    print(
        f"database: {vendor}; history built "
        f"{'through the API' if args.history == 'api' else 'in bulk'}; "
        f"gunicorn {args.server_workers} sync workers; one client; "
        f"{args.rounds} timed rounds per size after {args.warmup} untimed; "
        f"seeded in {seeded_in:.0f} s"
    )
    print(
        "load average (1, 5, 15 min): before "
        + ", ".join(f"{value:.2f}" for value in load_before)
        + "; after "
        + ", ".join(f"{value:.2f}" for value in load_after)
    )
    print(
        "dispatch over HTTP (POST /api/executor/dispatch/, limit 1), by earlier turns; CPU: "
        "the server's, mean; manifest: entries, their parts and the lists of turn files:"
    )
    print_http_table(sizes, rounds=http_rounds)
    print(f"in-process dispatch (Django test client), median of {args.profiles}:")
    print_query_table(profiles[len(sizes) :], sizes)
    for profile in python_profiles:
        print(f"cProfile of one dispatch, {profile.history:,} earlier turns (cumulative):")
        print(profile.python_profile)


if __name__ == "__main__":
    main()
