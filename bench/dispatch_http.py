"""Scenario: dispatch and task views over real HTTP, Baton under gunicorn.

- cycle: `--clients` processes (httpx, keep-alive) play workers against `--server-workers`
  sync processes (or gthread with `--threads`). The ceiling: every client on the bare view
  (`/bench/ceiling/`, two small queries) for `--ceiling-seconds`, before the claims and again
  after the cycle (the machine's speed drifts; the ratios divide by their mean). Claims: every
  client loops on `POST /api/executor/dispatch/` at `--limit` over `--cycle-turns` pending
  turns. The cycle: as many again, each turn dispatched then reported. Claims per second are
  set against the ceiling, turns per second against half of it (a cycle is two requests);
  exactly-once is checked by counting (with `--native-sessions` each report names a native
  session, one recorded per report). Then `--in-process` cycles through Django's test client:
  queries per request and CPU per cycle.
- latency: tasks of each of `--sizes` earlier turns (user messages of 80–1,200 chars, answers of
  200–4,000, one in a hundred a spilled build log), built `--history bulk` (rows as ingestion
  stores them, turn files written beforehand) or `--history api` (through the API in process, as
  products and workers build them: slow). One client plays product and idle worker: each
  round, for each size, alternating the order, a follow-up, the timed dispatch (`limit` 1, with
  the server's CPU) and the result report; a task serves at most history/20 rounds, so sizes
  stay put. Then `--profiles` dispatches a size in process with their queries, and with
  `--cprofile` one under the profiler (printed).
- detail: `GET /api/tasks/{id}/` for tasks of each of `--detail-turns` turns, read in turn
  (alternating order) by one client: median, p90, response size, time per turn beyond the
  smallest.
- views (not in the plain run): a task of `--view-results` turns each answered with a
  `--view-mb` MB build log (spilled), SQLite; each read through the whole stack (Django's test
  client) in a fresh process, whose peak RSS (`VmHWM`) is set against its RSS before.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import math
import multiprocessing
import os
import pstats
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import live_baton, machine_cpu_seconds, server_cpu_seconds  # noqa: E402
from bench._seed import answer_of, pending_turns, text_of  # noqa: E402
from bench._suite import (  # noqa: E402
    Measurement,
    Row,
    Scenario,
    at_least,
    at_most,
    quantile,
    results_of,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# -- cycle: claims and result reports against the ceiling ------------------------------------


def _ceiling_client(url: str, seconds: float, start_at: float, queue: Any) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        cpu_at_start = time.process_time()
        done = 0
        end = start_at + seconds
        while time.time() < end:
            client.get("/bench/ceiling/").raise_for_status()
            done += 1
    queue.put((done, [], time.time(), [], time.process_time() - cpu_at_start))


def _session(turn: dict[str, Any], sessions: bool) -> dict[str, Any]:
    """With `--native-sessions`, a report names the executor's native session, as Codex CLI's
    and Claude Code's workers do: Baton then records what that session has seen."""
    return {"native_session_id": f"session-{turn['subtask_id']}"} if sessions else {}


def _worker_client(
    url: str,
    token: str,
    index: int,
    limit: int,
    report: bool,
    sessions: bool,
    start_at: float,
    queue: Any,
) -> None:
    worker_id = f"bench-{index}"
    claimed: list[int] = []
    latencies: list[float] = []
    headers = {"Authorization": f"Token {token}"}
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
                    client.post(
                        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
                        json={
                            "worker_id": worker_id,
                            "attempt": turn["attempt"],
                            "status": "COMPLETED",
                            "result": {"value": f"Done: turn {turn['message_id']}."},
                            **_session(turn, sessions),
                        },
                    ).raise_for_status()
    queue.put((len(claimed), claimed, time.time(), latencies, time.process_time() - cpu_at_start))


@dataclass(frozen=True)
class Phase:
    results: list[Any]
    seconds: float  # from the start until the last client finished
    machine_cpu: float  # CPU seconds, all cores, every process on the machine
    server_cpu: float  # gunicorn's processes
    client_cpu: float  # the client processes (each from the start)

    def items(self) -> int:
        return sum(result[0] for result in self.results)


def _phase(
    target: Any, args_for: Callable[[int], tuple[Any, ...]], clients: int, pid: int
) -> Phase:
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
    machine, server = machine_cpu_seconds(), server_cpu_seconds(pid)
    results = results_of(processes, queue)
    machine, server = machine_cpu_seconds() - machine, server_cpu_seconds(pid) - server
    for process in processes:
        process.join()
    return Phase(
        results=results,
        seconds=max(result[2] for result in results) - start_at,
        machine_cpu=machine,
        server_cpu=server,
        client_cpu=sum(result[4] for result in results),
    )


def _exactly_once(phase: Phase, expected: int, what: str) -> list[int]:
    claimed = [subtask_id for _, ids, *_ in phase.results for subtask_id in ids]
    twice = len(claimed) - len(set(claimed))
    lost = expected - len(set(claimed))
    if twice or lost:
        raise SystemExit(f"exactly-once check FAILED ({what}): {twice} twice, {lost} lost")
    return claimed


def _cycles_in_process(token: str, cycles: int, sessions: bool) -> tuple[int, int, float]:
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


def measure_cycle(args: argparse.Namespace) -> list[Row]:
    turns, clients = args.cycle_turns, args.clients
    with bench_database(args.postgres) as vendor:
        from django.db import connection

        from backend.dispatch.models import PromptReport
        from backend.tasks.models import NativeSession, Subtask, SubtaskStatus

        os.environ["DJANGO_SETTINGS_MODULE"] = "bench._ceiling_settings"  # the server's
        with live_baton(workers=args.server_workers, threads=args.threads) as baton:
            url, token, pid = baton.url, baton.worker_token, baton.server_pid
            ceiling = _phase(
                _ceiling_client, lambda index: (url, args.ceiling_seconds), clients, pid
            )
            pending_turns(turns)
            connection.close()
            claims = _phase(
                _worker_client,
                lambda index: (url, token, index, args.limit, False, False),
                clients,
                pid,
            )
            _exactly_once(claims, turns, "claims")
            pending_turns(turns)
            connection.close()
            cycles = _phase(
                _worker_client,
                lambda index: (url, token, index, args.limit, True, args.native_sessions),
                clients,
                pid,
            )
            cycled = _exactly_once(cycles, turns, "cycle")
            not_done = Subtask.objects.filter(pk__in=cycled).exclude(status=SubtaskStatus.COMPLETED)
            reports = PromptReport.objects.count()
            if not_done.exists() or reports != 2 * turns:
                raise SystemExit(
                    f"exactly-once check FAILED: {not_done.count()} not COMPLETED, "
                    f"{reports} prompt reports for {2 * turns} claims"
                )
            if args.native_sessions and NativeSession.objects.count() != turns:
                raise SystemExit(
                    f"{NativeSession.objects.count()} native sessions for {turns} reports"
                )
            ceiling_after = _phase(
                _ceiling_client, lambda index: (url, args.ceiling_seconds), clients, pid
            )
        pending_turns(args.in_process + 1)
        dispatch_queries, report_queries, cycle_cpu_ms = _cycles_in_process(
            token, args.in_process, args.native_sessions
        )
    bare = [phase.items() / phase.seconds for phase in (ceiling, ceiling_after)]
    ceiling_rps = statistics.mean(bare)
    bare_cpu = (ceiling.server_cpu + ceiling_after.server_cpu) / (
        ceiling.items() + ceiling_after.items()
    )
    claim_latency = [value for result in claims.results for value in result[3]]
    server = (
        f"gthread {args.server_workers}x{args.threads}"
        if args.threads
        else f"{args.server_workers} sync workers"
    )
    where = f"{vendor}, gunicorn {server}, {clients} clients, limit={args.limit}"
    sessions = "; reports name native sessions" if args.native_sessions else ""

    def split(phase: Phase) -> str:
        rest = phase.machine_cpu - phase.server_cpu - phase.client_cpu
        return (
            f"CPU ms an item: server {phase.server_cpu / turns * 1000:.2f}, clients "
            f"{phase.client_cpu / turns * 1000:.2f}, rest (mostly PostgreSQL) "
            f"{rest / turns * 1000:.2f}"
        )

    return [
        Row(
            f"bare view ({where})",
            ceiling_rps,
            "req/s",
            note=f"before {bare[0]:.0f}, after {bare[1]:.0f}: their spread says how far to "
            "trust the run",
        ),
        Row(
            f"claims of {turns:,} turns",
            turns / claims.seconds,
            "claims/s",
            baseline_name="bare view",
            baseline_value=ceiling_rps,
            target=at_least(0.31, of="ratio"),
            note=f"{split(claims)}; dispatch latency median "
            f"{statistics.median(claim_latency) * 1000:.1f} ms",
        ),
        Row(
            f"cycles (dispatch + report) of {turns:,} turns",
            turns / cycles.seconds,
            "turns/s",
            baseline_name="half the bare view",
            baseline_value=ceiling_rps / 2,
            target=at_least(0.37, of="ratio"),
            note=f"{split(cycles)}{sessions}",
        ),
        Row(
            "server CPU a claim",
            claims.server_cpu / turns * 1000,
            "ms",
            baseline_name="a bare request",
            baseline_value=bare_cpu * 1000,
        ),
        Row(
            "server CPU a cycle",
            cycles.server_cpu / turns * 1000,
            "ms",
            baseline_name="a bare request",
            baseline_value=bare_cpu * 1000,
        ),
        Row(
            f"a cycle in process ({args.in_process} cycles)",
            cycle_cpu_ms,
            "ms CPU",
            note=f"{dispatch_queries} queries a dispatch, {report_queries} a report{sessions}",
        ),
    ]


# -- latency: one dispatch by history length -------------------------------------------------

WORKER_ID = "bench-latency"
# A query's column list, left out where the slowest query is named.
_SELECTED_COLUMNS = re.compile(r"^SELECT .*? FROM")


def _bulk_history(*, owner: User, turns: int, rng: random.Random) -> int:
    """A COMPLETED task with `turns` earlier turns (USER and ASSISTANT alternating), written in
    bulk with what ingestion would have stored, its turn files written as its first omitting
    dispatch would (a one-time cost: `dispatch.py`'s history_files measures it); its id."""
    from django.utils import timezone

    from backend.artifacts.services import atomic_storing_artifacts
    from backend.prompting import Role
    from backend.tasks.ingestion import ingest_text
    from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskStatus
    from backend.tasks.services import PipelineStep, resolve_pipeline
    from backend.tasks.transcripts import TranscriptRequest, store_transcripts, transcripts_for

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
    request = TranscriptRequest(
        task_id=task.pk, is_group_chat=False, multi_bot=False, before_message_id=turns + 1
    )
    store_transcripts(transcripts_for([request]))
    return task.pk


def _report_body(turn: dict[str, Any], *, answer: str, task_id: int) -> dict[str, Any]:
    """A COMPLETED result for a dispatched turn, naming the task's native session as the
    workers of Codex CLI and Claude Code do."""
    return {
        "worker_id": WORKER_ID,
        "attempt": turn["attempt"],
        "status": "COMPLETED",
        "result": {"value": answer},
        "native_session_id": f"bench-session-{task_id}",
    }


def _history_through_api(*, owner: User, turns: int, rng: random.Random) -> int:
    """A task of `owner` with `turns` earlier turns built as a product and a worker build one
    (created, then round after round dispatched, answered with a native session, followed up),
    so it has the rows real use leaves; its id. The worker is `live_baton`'s account."""
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

    def post(client: Client, path: str, body: dict[str, Any]) -> Any:
        return client.post(path, body, content_type="application/json")

    task = answered(
        201,
        post(
            product,
            "/api/tasks/",
            {
                "title": f"{turns} turns of history, built over the API",
                "task_type": "code",
                "executor": "codex",
                "message": text_of(rng, label="Message 0:", low=80, high=1200),
            },
        ),
    )
    for number in range(turns // 2):
        if number:
            message = text_of(rng, label=f"Message {number}:", low=80, high=1200)
            answered(201, post(product, f"/api/tasks/{task['id']}/messages/", {"message": message}))
        [turn] = answered(
            200,
            post(
                worker,
                "/api/executor/dispatch/",
                {"worker_id": WORKER_ID, "kinds": ["codex"], "limit": 1},
            ),
        )["turns"]
        body = _report_body(turn, answer=answer_of(rng, number), task_id=task["id"])
        answered(200, post(worker, f"/api/executor/subtasks/{turn['subtask_id']}/result/", body))
    return int(task["id"])


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


def _seed_size(
    *, owner: User, history: int, rounds: int, rng: random.Random, through_api: bool
) -> HistorySize:
    count = math.ceil(rounds / HistorySize.rounds_per_task(history))
    build = _history_through_api if through_api else _bulk_history
    task_ids = [build(owner=owner, turns=history, rng=rng) for _ in range(count)]
    return HistorySize(history=history, task_ids=task_ids, native_sessions=through_api)


def _one_round(
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
    answer, so the server does nothing else meanwhile), report, on the round's task."""
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
        "/api/executor/dispatch/", json={"worker_id": WORKER_ID, "kinds": ["codex"], "limit": 1}
    )
    dispatched = time.perf_counter()
    dispatch_cpu = server_cpu() - cpu_before
    response.raise_for_status()
    [turn] = response.json()["turns"]
    if turn["task_id"] != task_id:
        raise SystemExit(f"claimed a turn of task {turn['task_id']}, not {task_id}")
    body = _report_body(turn, answer=answer_of(rng, number), task_id=task_id)
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
    slowest_sql: str


def _profile_dispatch(
    *, size: HistorySize, number: int, worker_token: str, cprofile: bool = False
) -> QueryProfile:
    """The round's follow-up and its dispatch in this process, the dispatch's queries captured
    (and, with `cprofile`, its Python profile printed), then its report."""
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
    times = [float(query["time"]) for query in captured.captured_queries]
    slowest = max(range(len(times)), key=times.__getitem__)
    if cprofile:
        printed = io.StringIO()
        stats = pstats.Stats(profiler, stream=printed).sort_stats("cumulative")
        stats.print_stats(r"backend/|rest_framework/serializers|renderers", 25)
        printed.write("queries (ms, statement):\n")
        for query in captured.captured_queries:
            statement = _SELECTED_COLUMNS.sub("SELECT … FROM", " ".join(query["sql"].split()))
            printed.write(f"{float(query['time']) * 1000:6.1f}  {statement[:150]}\n")
        print(f"cProfile of one dispatch, {size.history:,} earlier turns (cumulative):")
        print(printed.getvalue())
    return QueryProfile(
        history=size.history,
        total_ms=total * 1000,
        queries=len(times),
        sql_ms=sum(times) * 1000,
        slowest_sql=_SELECTED_COLUMNS.sub(
            "SELECT … FROM", " ".join(captured.captured_queries[slowest]["sql"].split()), count=1
        )[:100],
    )


def measure_latency(args: argparse.Namespace) -> list[Row]:
    histories = [int(size) for size in args.sizes.split(",")]
    if any(history < 2 or history % 2 for history in histories):
        raise SystemExit("--sizes: even numbers of turns (answered rounds), at least 2")
    if args.rounds < 2 or args.profiles < 1:
        raise SystemExit("--rounds: at least 2 (for a p90); --profiles: at least 1")
    # Warm-up rounds, timed rounds, then in process: one untimed, the profiled ones and the one
    # `--cprofile` profiles (kept apart: the profiler slows what it watches).
    http_rounds = args.warmup + args.rounds
    all_rounds = http_rounds + 1 + args.profiles + 1
    rng = random.Random(14)
    with bench_database(args.postgres) as vendor:
        from django.contrib.auth import get_user_model
        from django.db import connection

        owner, _ = get_user_model().objects.get_or_create(username="bench-product")
        seeding = time.perf_counter()
        sizes = [
            _seed_size(
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
        with (
            live_baton(workers=args.server_workers) as baton,
            httpx.Client(
                base_url=baton.url,
                headers={"Authorization": f"Token {baton.worker_token}"},
                timeout=120,
            ) as worker,
        ):
            for number in range(http_rounds):
                for size in sizes if number % 2 else reversed(sizes):  # alternated order
                    _one_round(
                        product=baton.product,
                        worker=worker,
                        size=size,
                        rng=rng,
                        number=number,
                        timed=number >= args.warmup,
                        server_cpu=partial(server_cpu_seconds, baton.server_pid),
                    )
            worker_token = baton.worker_token
        profiles = [
            _profile_dispatch(size=size, number=number, worker_token=worker_token)
            for number in range(http_rounds, all_rounds - 1)
            for size in sizes
        ][len(sizes) :]
        if args.cprofile:
            for size in sizes:
                _profile_dispatch(
                    size=size, number=all_rounds - 1, worker_token=worker_token, cprofile=True
                )
    built = "through the API" if args.history == "api" else "in bulk"
    smallest = sizes[0]
    base = statistics.median(smallest.dispatch) * 1000
    base_cpu = statistics.mean(smallest.dispatch_cpu) * 1000
    rows = []
    for size in sizes:
        mine = [profile for profile in profiles if profile.history == size.history]
        name = f"dispatch over HTTP, {size.history:,} earlier turns ({vendor}, built {built})"
        compared = size is not smallest
        rows += [
            Row(
                name,
                statistics.median(size.dispatch) * 1000,
                "ms",
                baseline_name=f"{smallest.history:,} turns" if compared else None,
                baseline_value=base if compared else None,
                target=at_most(1.5, of="ratio") if size is sizes[-1] and compared else None,
                note=f"p90 {quantile(size.dispatch, 0.9) * 1000:.1f} ms, min "
                f"{min(size.dispatch) * 1000:.1f} ms; follow-up "
                f"{statistics.median(size.follow_up) * 1000:.1f} ms, report "
                f"{statistics.median(size.report) * 1000:.1f} ms; response "
                f"{statistics.median(size.response_bytes) / 1024:.0f} KiB, manifest "
                f"{int(statistics.median(size.manifest_entries)):,}; in process "
                f"{statistics.median(p.total_ms for p in mine):.1f} ms, "
                f"{int(statistics.median(p.queries for p in mine))} queries, SQL "
                f"{statistics.median(p.sql_ms for p in mine):.1f} ms, slowest: "
                f"{max(mine, key=lambda p: p.sql_ms).slowest_sql}"
                + ("" if compared else f"; seeded in {seeded_in:.0f} s"),
            ),
            Row(
                f"server CPU a dispatch, {size.history:,} earlier turns",
                statistics.mean(size.dispatch_cpu) * 1000,
                "ms",
                baseline_name=f"{smallest.history:,} turns" if compared else None,
                baseline_value=base_cpu if compared else None,
                note="mean, in ticks of 10 ms",
            ),
        ]
    return rows


# -- detail: a task's view by its number of turns --------------------------------------------


def _answered_task(*, turns: int, rng: random.Random) -> int:
    """A task with `turns` answered turns (`turns` even), stored through the services."""
    from django.contrib.auth import get_user_model

    from backend.tasks.factories import conversation

    owner, _ = get_user_model().objects.get_or_create(username="bench-product")
    rounds = turns // 2
    task = conversation(
        owner=owner,
        messages=[
            text_of(rng, label=f"Message {number}:", low=80, high=1200) for number in range(rounds)
        ],
        answers=({"value": answer_of(rng, number)} for number in range(rounds)),
    )
    return int(task.pk)


def measure_detail(args: argparse.Namespace) -> list[Row]:
    sizes = [int(size) for size in args.detail_turns.split(",")]
    if any(size < 2 or size % 2 for size in sizes) or args.detail_rounds < 2:
        raise SystemExit("--detail-turns: even numbers, at least 2; --detail-rounds: >= 2")
    rng = random.Random(15)
    with bench_database(args.postgres) as vendor:
        from django.db import connection

        task_ids = {size: _answered_task(turns=size, rng=rng) for size in sizes}
        if vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        connection.close()
        times: dict[int, list[float]] = {size: [] for size in sizes}
        response_bytes: dict[int, int] = {}
        with live_baton() as baton:
            for number in range(args.warmup + args.detail_rounds):
                for size in sizes if number % 2 else list(reversed(sizes)):
                    began = time.perf_counter()
                    response = baton.product.get(f"/api/tasks/{task_ids[size]}/")
                    elapsed = time.perf_counter() - began
                    response.raise_for_status()
                    if len(response.json()["turns"]) != size:
                        raise SystemExit(f"the task of {size} turns showed another number")
                    if number >= args.warmup:
                        times[size].append(elapsed * 1000)
                    response_bytes[size] = len(response.content)
    smallest = min(sizes)
    base = statistics.median(times[smallest])
    rows = []
    for size in sizes:
        median = statistics.median(times[size])
        compared = size != smallest
        per_turn = (median - base) / (size - smallest) if compared else 0.0
        rows.append(
            Row(
                f"GET /api/tasks/{{id}}/, {size:,} turns ({vendor})",
                median,
                "ms",
                baseline_name=f"{smallest} turns" if compared else None,
                baseline_value=base if compared else None,
                note=f"p90 {quantile(times[size], 0.9):.1f} ms; response "
                f"{response_bytes[size] / 1024:.0f} KiB"
                + (f"; {per_turn:.3f} ms a turn beyond {smallest}" if compared else ""),
            )
        )
    return rows


# -- views: reading a task with big results --------------------------------------------------

VIEW_LOG_LINE = "2026-11-25T10:00:00Z INFO build step {n:08d} compiled module ok\n"


def _big_answers(count: int, size: int) -> Iterator[str]:
    """`count` build logs of about `size` chars, distinct (each its own artifact)."""
    line_chars = len(VIEW_LOG_LINE.format(n=0))
    for seed in range(count):
        yield f"seed {seed}\n" + "".join(
            VIEW_LOG_LINE.format(n=n) for n in range(size // line_chars)
        )


def _memory_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of this process, in KiB (Linux). Not `ru_maxrss`: Linux
    carries that across exec from the parent, which built the big results."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _read_in_fresh_process(path: str, token: str, queue: Any) -> None:
    """One GET of `path` in this (fresh) process: status, body bytes, RSS before and peak."""
    import django

    django.setup()
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    client.get("/api/bots/")  # warm up: imports, URL resolver, first query
    before = _memory_kib("VmRSS")
    response = client.get(path)
    if response.streaming:
        size = sum(len(chunk) for chunk in response.streaming_content)
    else:
        size = len(response.content)
    queue.put((response.status_code, size, before, _memory_kib("VmHWM")))


def measure_views(args: argparse.Namespace) -> list[Row]:
    with bench_database(None):
        from django.contrib.auth import get_user_model
        from django.db import connection
        from rest_framework.authtoken.models import Token

        from backend.tasks.factories import conversation

        owner = get_user_model().objects.create_user(username="bench")
        token = Token.objects.get_or_create(user=owner)[0].key
        task = conversation(
            owner=owner,
            messages=[f"Run build {n}." for n in range(args.view_results)],
            answers=_big_answers(args.view_results, args.view_mb * 1024 * 1024),
            title="Big results",
        )
        turn = task.subtasks.filter(role="ASSISTANT").order_by("message_id").first()
        assert turn is not None
        connection.close()
        paths = {
            "task detail": f"/api/tasks/{task.pk}/",
            "subtask list": f"/api/tasks/{task.pk}/subtasks/",
            "one turn's whole text": f"/api/tasks/{task.pk}/subtasks/{turn.pk}/text/",
        }
        rows = []
        context = multiprocessing.get_context("spawn")  # a fresh process: its own peak RSS
        for name, path in paths.items():
            queue = context.Queue()
            process = context.Process(target=_read_in_fresh_process, args=(path, token, queue))
            process.start()
            status, size, before, peak = queue.get()
            process.join()
            rows.append(
                Row(
                    f"{name}, {args.view_results} results of {args.view_mb} MB: peak RSS growth",
                    (peak - before) / 1024,
                    "MB",
                    note=f"status {status}, response {size / 1e6:.2f} MB, "
                    f"peak {peak / 1024:.0f} MB",
                )
            )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cycle-turns", type=int, default=2_000, help="cycle: turns a phase")
    parser.add_argument("--clients", type=int, default=8, help="cycle: worker processes")
    parser.add_argument("--limit", type=int, default=1, help="cycle: turns a dispatch call")
    parser.add_argument(
        "--server-workers", type=int, default=4, help="cycle, latency: gunicorn processes"
    )
    parser.add_argument("--threads", type=int, default=0, help="cycle: gthread threads (0: sync)")
    parser.add_argument("--ceiling-seconds", type=float, default=10.0, help="cycle: bare view")
    parser.add_argument("--in-process", type=int, default=200, help="cycle: cycles without HTTP")
    parser.add_argument(
        "--native-sessions", action="store_true", help="cycle: reports name a native session"
    )
    parser.add_argument("--sizes", default="10,10000", help="latency: earlier turns a task")
    parser.add_argument(
        "--history",
        choices=("bulk", "api"),
        default="bulk",
        help="latency: earlier turns bulk-created, or built through the API (slow)",
    )
    parser.add_argument("--rounds", type=int, default=80, help="latency: timed dispatches a size")
    parser.add_argument("--warmup", type=int, default=4, help="latency, detail: untimed rounds")
    parser.add_argument("--profiles", type=int, default=3, help="latency: in-process dispatches")
    parser.add_argument(
        "--cprofile", action="store_true", help="latency: print a profile of one dispatch"
    )
    parser.add_argument("--detail-turns", default="10,100,400", help="detail: turns a task")
    parser.add_argument("--detail-rounds", type=int, default=60, help="detail: reads a size")
    parser.add_argument("--view-results", type=int, default=4, help="views: big results")
    parser.add_argument("--view-mb", type=int, default=30, help="views: a result's size, MB")


SCENARIO = Scenario(
    name=Path(__file__).stem,
    summary="Dispatch over HTTP: the cycle against the ceiling, latency by history, task views.",
    measurements=(
        Measurement("cycle", measure_cycle),
        Measurement("latency", measure_latency),
        Measurement("detail", measure_detail),
        Measurement("views", measure_views, default=False),
    ),
    add_arguments=add_arguments,
    quick={
        "cycle_turns": 100,
        "clients": 2,
        "ceiling_seconds": 2.0,
        "in_process": 10,
        "sizes": "10,200",
        "rounds": 4,
        "warmup": 1,
        "profiles": 1,
        "detail_turns": "10,40",
        "detail_rounds": 4,
        "view_results": 2,
        "view_mb": 2,
    },
)

if __name__ == "__main__":
    SCENARIO.main()
