"""Scenario: kill -9 of Baton's worker and server processes under a product's load with steers.

The production server (gunicorn as `make serve` runs it, `--server-workers` processes) on a
throwaway PostgreSQL database, `--workers` real workers (`python -m executors`, each serving
Codex, Claude Code and Agno) and the loopback model server as an agent at work: every turn
runs `--tool-calls` shell commands of `--tool-seconds` each before it answers, so a follow-up
finds turns running. For `--seconds`, `--tasks` products' users (over `--accounts` accounts)
each work on a task: follow-ups with every strategy (enqueue, interrupt, rollback, steer),
reads of the task and its turns, now and then a turn stopped, a queued message withdrawn or
the task cancelled (and a new one started); every other user is patient, never stopping a
turn, so a dead worker's turn also waits for its lease to run out. Every `--kill-every`
seconds one process is killed with SIGKILL, in turn a worker (one holding a running turn,
when one does; started again after a moment: half the time on its workspace root, so Baton
knows it by the same worker id, half the time on a new one, a new worker) and a server
process (gunicorn's master starts another).

Then the faults stop, the workers run on until every turn has finished (a dead worker's turn
waits for its lease to run out: `--lease-seconds`, set for the server), and the run checks
(`bench/_fault_checks.py`): every message answered (lost: none), answered once (answered
twice: none), nothing left pending or running (stuck: none), no task seen with two rounds
active at once (looked for every half second), no 5xx in the server's access log, and no
executor process outliving its killed worker. Nothing is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._fault_checks import (  # noqa: E402
    SentMessage,
    ServerLog,
    check_conversations,
    read_server_log,
    settled,
    task_histories,
    tasks_with_two_rounds_active,
)
from bench._live import (  # noqa: E402
    LiveBaton,
    gunicorn_workers,
    live_baton,
    model_env,
    start_worker,
)
from bench._suite import Measurement, Row, Scenario, at_most  # noqa: E402
from executors.kinds import KINDS as EXECUTORS  # noqa: E402
from executors.standin import ModelServer  # noqa: E402
from executors.standin.script import parse_turn  # noqa: E402

KINDS = ("codex", "claude_code", "agno")
STRATEGIES = ("enqueue", "interrupt", "rollback", "steer")
# How often a user picks each follow-up strategy: steers and queued messages most, as a
# product's users send them, and enough stops to cross every path.
STRATEGY_WEIGHTS = (3, 1, 1, 4)
PATIENT_STRATEGIES = ("enqueue", "steer")  # what a patient user sends (see User)
THINK_SECONDS = (0.5, 2.0)  # a user's pause between two actions
QUEUE_LIMIT = 2  # a user who sees this many messages queued withdraws one instead
RESTART_SECONDS = 1.0  # how long a killed worker stays down
SAMPLE_SECONDS = 0.5  # how often the run looks for a task with two rounds active
STEP = re.compile(r"fault-step-(\d+)")


class BusyAgentModel(ModelServer):
    """The loopback model server as an agent at work: in every conversation it asks for
    `tool_calls` shell commands (`sleep tool_seconds`, each numbered), then answers.

    The step is read from the conversation itself (the numbers of the commands it already
    asked for), so turns of every executor kind running at once each get the whole script,
    and an attempt that starts over (its worker was killed) starts from the first step. It
    relies on the executors' sessions not being resumed (a resumed session would carry the
    earlier turns' commands): the run turns that off."""

    def __init__(self, *, tool_calls: int, tool_seconds: float) -> None:
        super().__init__(keep_requests=False)
        self.tool_calls = tool_calls
        self.tool_seconds = tool_seconds
        self.calls = 0
        self._kind_of_api = {kind.standin_api: name for name, kind in EXECUTORS.items()}

    def _take_turn(self, request: Any) -> Any:
        done = max((int(step) for step in STEP.findall(json.dumps(request.body))), default=0)
        with self._lock:
            self.calls += 1
        if done >= self.tool_calls:
            return parse_turn({"text": f"Done, in {done} steps."})
        command = f"sleep {self.tool_seconds} # fault-step-{done + 1}"
        return parse_turn(_tool_call(self._kind_of_api[request.api], command))


def _tool_call(kind: str, command: str) -> dict[str, Any]:
    """A model turn asking the executor `kind` to run a shell command."""
    if kind == "codex":
        return {"tool": {"name": "exec_command", "arguments": {"cmd": command}}}
    if kind == "claude_code":
        return {"tool": {"name": "Bash", "arguments": {"command": command}}}
    return {"tool": {"name": "run_shell_command", "arguments": {"args": ["bash", "-c", command]}}}


@dataclass
class Traffic:
    """Every answer the product's users got (method, route, status; None: no answer) and
    every message they sent. Thread-safe."""

    answers: Counter[tuple[str, str, int | None]] = field(default_factory=Counter)
    sent: list[SentMessage] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def call(
        self, client: httpx.Client, method: str, route: str, path: str, body: Any = None
    ) -> httpx.Response | None:
        """The answer to one request (None when the connection broke), recorded."""
        try:
            response = client.request(method, path, json=body)
        except httpx.TransportError:
            response = None
        with self._lock:
            self.answers[(method, route, None if response is None else response.status_code)] += 1
        return response

    def message(self, text: str, strategy: str, response: httpx.Response | None) -> None:
        with self._lock:
            self.sent.append(
                SentMessage(text, strategy, None if response is None else response.status_code)
            )


@dataclass
class User:
    """One product user working on a task of one executor kind. A patient one never stops a
    turn (it queues and steers only, and never cancels), so a turn whose worker died waits
    for its lease to run out instead of being stopped by its user first."""

    number: int
    kind: str
    patient: bool
    client: httpx.Client
    traffic: Traffic
    rng: random.Random
    task_id: int | None = None
    sent: int = 0
    queued: int = 0  # messages queued, at the last read
    # Of those, the ones a user may withdraw (a steer that fell back is a turn already).
    withdrawable: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)  # from the last read

    def text(self) -> str:
        self.sent += 1
        return f"User {self.number}, message {self.sent}: also check the retry path."

    def start_task(self) -> None:
        text = self.text()
        body = {"title": "fault run", "task_type": "code", "executor": self.kind, "message": text}
        response = self.traffic.call(self.client, "POST", "/api/tasks/", "/api/tasks/", body)
        self.traffic.message(text, "create", response)
        self.task_id = response.json()["id"] if response and response.status_code == 201 else None
        self.queued, self.withdrawable, self.turns = 0, [], []

    def act(self) -> None:
        """One action, as a user of the product takes them."""
        if self.task_id is None:
            self.start_task()
            return
        roll = self.rng.random()
        if roll < 0.55:
            self.read()
            if self.queued >= QUEUE_LIMIT:
                self.withdraw()
            else:
                self.follow_up()
        elif roll < 0.75:
            self.read()
        elif roll < 0.85:
            self.traffic.call(
                self.client,
                "GET",
                "/api/tasks/<id:task_id>/subtasks/",
                f"/api/tasks/{self.task_id}/subtasks/",
            )
        elif roll < 0.9:
            self.traffic.call(self.client, "GET", "/api/tasks/", "/api/tasks/?page_size=20")
        elif roll < 0.96 and not self.patient:
            self.read()
            self.stop_turn()
        elif roll < 0.98 or self.patient:
            self.read()
            self.withdraw()
        else:
            self.traffic.call(
                self.client,
                "POST",
                "/api/tasks/<id:task_id>/cancel/",
                f"/api/tasks/{self.task_id}/cancel/",
            )
            self.start_task()

    def read(self) -> None:
        response = self.traffic.call(
            self.client, "GET", "/api/tasks/<id:task_id>/", f"/api/tasks/{self.task_id}/"
        )
        if response is not None and response.status_code == 200:
            task = response.json()
            self.queued = len(task["queued_messages"])
            self.withdrawable = [
                queued["id"] for queued in task["queued_messages"] if queued["turn"] is None
            ]
            self.turns = task["turns"]

    def follow_up(self) -> None:
        weights = [
            weight if strategy in PATIENT_STRATEGIES or not self.patient else 0
            for strategy, weight in zip(STRATEGIES, STRATEGY_WEIGHTS, strict=True)
        ]
        strategy = self.rng.choices(STRATEGIES, weights=weights)[0]
        text = self.text()
        response = self.traffic.call(
            self.client,
            "POST",
            "/api/tasks/<id:task_id>/messages/",
            f"/api/tasks/{self.task_id}/messages/",
            {"message": text, "strategy": strategy},
        )
        self.traffic.message(text, strategy, response)

    def stop_turn(self) -> None:
        """Stop the turn that runs or waits ("stop generating"), if there is one."""
        active = [
            turn
            for turn in self.turns
            if turn["role"] == "ASSISTANT" and turn["status"] in ("PENDING", "RUNNING")
        ]
        if active:
            self.traffic.call(
                self.client,
                "POST",
                "/api/tasks/<id:task_id>/subtasks/<id:subtask_id>/cancel/",
                f"/api/tasks/{self.task_id}/subtasks/{active[0]['id']}/cancel/",
            )

    def withdraw(self) -> None:
        if self.withdrawable:
            self.traffic.call(
                self.client,
                "POST",
                "/api/tasks/<id:task_id>/queued-messages/<id:queued_id>/cancel/",
                f"/api/tasks/{self.task_id}/queued-messages/{self.withdrawable.pop()}/cancel/",
            )


def _run_user(user: User, until: float, max_actions: int) -> None:
    for _ in range(max_actions):
        time.sleep(user.rng.uniform(*THINK_SECONDS))
        if time.monotonic() >= until:
            return
        user.act()


@dataclass
class WorkerSlot:
    """One worker the run keeps going: its process now and where its workspaces are."""

    number: int
    workdir: Path
    process: subprocess.Popen[bytes]
    roots: list[Path] = field(default_factory=list)  # every workdir it ran on


@dataclass
class Kills:
    """The kill -9s made, by what was killed."""

    workers_same_id: int = 0
    workers_new_id: int = 0
    workers_running_a_turn: int = 0  # killed while they held a running turn
    server_processes: int = 0

    @property
    def total(self) -> int:
        return self.workers_same_id + self.workers_new_id + self.server_processes


class Faults:
    """Kills a worker or a server process every `every` seconds, in turn, until stopped."""

    def __init__(
        self, *, baton: LiveBaton, slots: list[WorkerSlot], start: Any, every: float, seed: int
    ) -> None:
        self.baton, self.slots, self.start, self.every = baton, slots, start, every
        self.rng = random.Random(seed)
        self.kills = Kills()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def _run(self) -> None:
        from django.db import connection

        number = 0
        while not self.stopping.wait(self.every):
            if number % 2 == 0:
                self._kill_worker(same_id=number % 4 == 0)
            else:
                self._kill_server_process()
            number += 1
        connection.close()  # this thread's

    def _kill_worker(self, *, same_id: bool) -> None:
        # A worker holding a running turn, when one does: that is the kill that tests a claim.
        busy = [slot for slot in self.slots if _holds_a_turn(slot)]
        slot = self.rng.choice(busy or self.slots)
        slot.process.send_signal(signal.SIGKILL)
        slot.process.wait(timeout=30)
        self.kills.workers_running_a_turn += bool(busy)
        time.sleep(RESTART_SECONDS)
        if same_id:
            self.kills.workers_same_id += 1
        else:
            self.kills.workers_new_id += 1
            slot.workdir = Path(tempfile.mkdtemp(prefix=f"baton-bench-faults-w{slot.number}-"))
            slot.roots.append(slot.workdir)
        slot.process = self.start(slot.workdir)

    def _kill_server_process(self) -> None:
        processes = gunicorn_workers(self.baton.server_pid)
        if processes:
            os.kill(self.rng.choice(processes), signal.SIGKILL)
            self.kills.server_processes += 1


def _holds_a_turn(slot: WorkerSlot) -> bool:
    """Whether the worker holds a running turn, by the worker id it keeps in its workspace
    root (`executors.identity`)."""
    from backend.tasks.models import Subtask

    kept = slot.workdir / "workspaces" / ".baton" / "worker-id"
    if not kept.exists():
        return False
    worker_id = kept.read_text().strip()
    return Subtask.objects.filter(status="RUNNING", lease_owner=worker_id).exists()


def _left_behind(roots: list[Path]) -> list[int]:
    """Live processes of the runs of every worker that ran on `roots` (each run's marker is in
    its worker's log and in the environment of every process of the run)."""
    from executors.process_tree import processes_with_marker

    markers = set()
    for root in roots:
        log = root / "worker.log"
        if log.exists():
            markers |= set(re.findall(r'"run": "([0-9a-f]{32})"', log.read_text(errors="replace")))
    return sorted({pid for marker in markers for pid in processes_with_marker(marker)})


@dataclass
class RunOutcome:
    """What the load, the faults and the drain did."""

    traffic: Traffic
    kills: Kills
    survivors: list[int]  # executor processes outliving their worker
    load_started_at: datetime
    load_seconds: float
    # Tasks seen with two rounds active at once (the database, sampled every half second).
    two_rounds: set[int]
    samples: int
    drain_seconds: float


def measure_faults(args: argparse.Namespace) -> list[Row]:
    run_dir = Path(tempfile.mkdtemp(prefix="baton-bench-faults-"))
    # The server's: a dead worker's turn is claimed again once its lease runs out, and a
    # retried turn waits a second, not ten (the defaults suit workers that rarely die).
    os.environ["BATON_LEASE_SECONDS"] = str(args.lease_seconds)
    os.environ["BATON_RETRY_BACKOFF_SECONDS"] = "1"
    with (
        bench_database(args.postgres),
        live_baton(
            workers=args.server_workers, threads=8, production=True, log_dir=run_dir
        ) as baton,
        BusyAgentModel(tool_calls=args.tool_calls, tool_seconds=args.tool_seconds) as model,
    ):
        from backend.dispatch.policies import set_policy
        from backend.tasks.models import Steer, Subtask, TaskEvent

        # Each turn's executor starts afresh from Baton's prompt (see BusyAgentModel).
        set_policy(task_type="code", values={"resume_native_sessions": False})
        outcome = _run(args, baton=baton, model=model, run_dir=run_dir)
        findings = check_conversations(outcome.traffic.sent)
        (run_dir / "findings.json").write_text(
            json.dumps(task_histories(findings), indent=1, default=str) + "\n"
        )
        turns = Subtask.objects.filter(kind="turn", role="ASSISTANT")
        turn_statuses = Counter(turns.values_list("status", flat=True))
        failed_codes = Counter(turns.filter(status="FAILED").values_list("error_code", flat=True))
        requeued = TaskEvent.objects.filter(type="turn.requeued").count()
        steers = Counter(
            f"{status} ({reason})" if reason else status
            for status, reason in Steer.objects.values_list("status", "fallback_reason")
        )
    return _rows(
        args,
        outcome=outcome,
        findings=findings,
        server=read_server_log(run_dir, since=outcome.load_started_at),
        steers=steers,
        turn_statuses=turn_statuses,
        failed_codes=failed_codes,
        requeued=requeued,
        model_calls=model.calls,
        run_dir=run_dir,
    )


def _product_tokens(baton: LiveBaton, accounts: int) -> list[str]:
    """API tokens of `accounts` product accounts, the live Baton's own first."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    owners = [
        get_user_model().objects.get_or_create(username=f"bench-product-{number}")[0]
        for number in range(1, accounts)
    ]
    return [baton.product_token] + [Token.objects.get_or_create(user=o)[0].key for o in owners]


def _run(
    args: argparse.Namespace, *, baton: LiveBaton, model: ModelServer, run_dir: Path
) -> RunOutcome:
    """The workers, the users' load and the faults for `args.seconds`, then the drain."""
    worker_env = {
        **model_env(model),
        "BATON_WORKER_SLOTS": str(args.slots),
        # As in production: long polls; claims are checked every half second all the same.
        "BATON_WORKER_POLL_SECONDS": "1",
        "BATON_WORKER_WAIT_SECONDS": "20",
    }

    def start(workdir: Path) -> subprocess.Popen[bytes]:
        return start_worker(baton, workdir=workdir, kinds=list(KINDS), **worker_env)

    slots = []
    for number in range(args.workers):
        workdir = run_dir / f"worker-{number}"
        slots.append(WorkerSlot(number, workdir, start(workdir), roots=[workdir]))
    tokens = _product_tokens(baton, args.accounts)
    traffic = Traffic()
    users = [
        User(
            number=number,
            kind=KINDS[number % len(KINDS)],
            patient=number % 2 == 1,
            client=httpx.Client(
                base_url=baton.url,
                headers={"Authorization": f"Token {tokens[number % len(tokens)]}"},
                timeout=30,
            ),
            traffic=traffic,
            rng=random.Random(args.seed * 1000 + number),
        )
        for number in range(args.tasks)
    ]
    faults = Faults(baton=baton, slots=slots, start=start, every=args.kill_every, seed=args.seed)
    started, started_at = time.monotonic(), datetime.now(UTC)
    threads = [
        threading.Thread(target=_run_user, args=(user, started + args.seconds, args.max_actions))
        for user in users
    ]
    for thread in [*threads, faults.thread]:
        thread.start()
    two_rounds: set[int] = set()
    samples = 0
    while any(thread.is_alive() for thread in threads):
        two_rounds |= tasks_with_two_rounds_active()
        samples += 1
        time.sleep(SAMPLE_SECONDS)
    faults.stopping.set()
    faults.thread.join()
    load_seconds = time.monotonic() - started
    for user in users:
        user.client.close()

    # The drain: every worker up, until nothing is pending, running or queued.
    for slot in slots:
        if slot.process.poll() is not None:
            slot.process = start(slot.workdir)
    drain_started = time.monotonic()
    while not settled() and time.monotonic() < drain_started + args.drain_seconds:
        two_rounds |= tasks_with_two_rounds_active()
        samples += 1
        time.sleep(SAMPLE_SECONDS)
    drain_seconds = time.monotonic() - drain_started
    for slot in slots:
        slot.process.send_signal(signal.SIGTERM)
    for slot in slots:
        try:
            slot.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            slot.process.kill()
            slot.process.wait()
    time.sleep(2)  # a killed worker's executors get as long as they need to notice
    survivors = _left_behind([root for slot in slots for root in slot.roots])
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return RunOutcome(
        traffic=traffic,
        kills=faults.kills,
        survivors=survivors,
        load_started_at=started_at,
        load_seconds=load_seconds,
        drain_seconds=drain_seconds,
        two_rounds=two_rounds,
        samples=samples,
    )


def _listed(lines: list[str], most: int = 8) -> str:
    """The first `most` of `lines`, each after "; "."""
    shown = "".join(f"; {line}" for line in lines[:most])
    return shown + (f"; … {len(lines) - most} more" if len(lines) > most else "")


def _counted(counts: Counter[Any]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.most_common())


def _rows(
    args: argparse.Namespace,
    *,
    outcome: RunOutcome,
    findings: Any,
    server: ServerLog,
    steers: Counter[str],
    turn_statuses: Counter[str],
    failed_codes: Counter[str],
    requeued: int,
    model_calls: int,
    run_dir: Path,
) -> list[Row]:
    traffic, kills = outcome.traffic, outcome.kills
    strategies = Counter((message.strategy, message.status) for message in traffic.sent)
    product_errors = Counter(
        f"{method} {route} {status}"
        for (method, route, status), count in traffic.answers.items()
        for _ in range(count)
        if status is not None and status >= 500
    )
    statuses: Counter[str] = Counter()
    for (_, _, status), count in traffic.answers.items():
        statuses["no answer" if status is None else str(status)] += count
    sent = len(traffic.sent)
    return [
        Row(
            "messages lost",
            len(findings.lost),
            "messages",
            target=at_most(0),
            note=f"of {sent} sent; {findings.not_accepted} sent with no answer and never "
            f"stored (not accepted); {len(findings.queued_steers_cancelled)} steers that "
            f"fell back to the queue withdrawn with their cancelled task, still `queued`"
            f"{_listed(findings.lost)}; the tasks of every finding, turn by "
            f"turn: {run_dir / 'findings.json'}",
        ),
        Row(
            "messages answered twice",
            len(findings.answered_twice),
            "messages",
            target=at_most(0),
            note=_listed(findings.answered_twice).removeprefix("; ")
            + (
                f"; refused (4xx) but stored{_listed(findings.refused_but_stored)}"
                if findings.refused_but_stored
                else ""
            ),
        ),
        Row(
            "turns, tasks or messages stuck after the drain",
            len(findings.stuck),
            "items",
            target=at_most(0),
            note=f"drain {outcome.drain_seconds:.0f} s of at most {args.drain_seconds:.0f} s"
            + _listed(findings.stuck),
        ),
        Row(
            "tasks seen with two rounds active at once",
            len(outcome.two_rounds),
            "tasks",
            target=at_most(0),
            note=f"{outcome.samples} looks, one every {SAMPLE_SECONDS:g} s"
            + (f": tasks {sorted(outcome.two_rounds)}" if outcome.two_rounds else ""),
        ),
        Row(
            "answers 5xx (every client, the server's access log)",
            server.server_errors,
            "answers",
            target=at_most(0),
            note=f"from the load's start: {_counted(server.errors) or 'none'}; the product's "
            f"own: {_counted(product_errors) or 'none'}; failures logged: "
            f"{_counted(server.failures) or 'none'}; before the load (starting up): "
            f"{_counted(server.errors_before) or 'none'}, "
            f"{_counted(server.failures_before) or 'none'}",
        ),
        Row(
            "requests made by the product's users",
            sum(traffic.answers.values()),
            "requests",
            note=f"answers {_counted(statuses)}; the server answered {server.requests} "
            f"requests in all (workers' included): {_counted(server.statuses)}",
        ),
        Row(
            "kill -9s made",
            kills.total,
            "kills",
            note=f"{kills.workers_same_id + kills.workers_new_id} workers "
            f"({kills.workers_running_a_turn} holding a running turn; started again "
            f"{kills.workers_same_id} with the same worker id, {kills.workers_new_id} with a "
            f"new one), {kills.server_processes} server processes; one every "
            f"{args.kill_every:g} s for {outcome.load_seconds:.0f} s",
        ),
        Row(
            "executor processes outliving their worker",
            len(outcome.survivors),
            "processes",
            target=at_most(0),
        ),
        Row(
            "turns answered",
            sum(turn_statuses.values()),
            "turns",
            note=f"{_counted(turn_statuses)}; failed by code: {_counted(failed_codes) or 'none'}; "
            f"requeued {requeued} times; {model_calls} model calls; logs in {run_dir}",
        ),
        Row(
            "follow-ups sent",
            sum(count for (strategy, _), count in strategies.items() if strategy != "create"),
            "messages",
            note=f"by strategy and answer: {_counted(strategies)}; steers stored "
            f"{sum(steers.values())}: {_counted(steers) or 'none'}",
        ),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=150, help="how long the load runs")
    parser.add_argument("--tasks", type=int, default=6, help="users, each on a task at a time")
    parser.add_argument("--accounts", type=int, default=3, help="product accounts they use")
    parser.add_argument("--max-actions", type=int, default=200, help="actions a user takes")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--slots", type=int, default=2, help="turns a worker runs at once")
    parser.add_argument("--server-workers", type=int, default=3, help="gunicorn processes")
    parser.add_argument("--kill-every", type=float, default=10, help="seconds between kills")
    parser.add_argument("--tool-calls", type=int, default=5, help="tool calls a turn makes")
    parser.add_argument(
        "--tool-seconds", type=float, default=0.5, help="each tool command's run time"
    )
    parser.add_argument(
        "--lease-seconds", type=int, default=10, help="the server's BATON_LEASE_SECONDS"
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=180, help="at most this long for turns to finish"
    )
    parser.add_argument("--seed", type=int, default=1, help="the users' and the kills' choices")


SCENARIO = Scenario(
    name=Path(__file__).stem,
    summary="kill -9 of workers and server processes under a product's load with steers: "
    "nothing lost, answered twice or stuck, no 5xx.",
    measurements=(Measurement("faults", measure_faults, postgres_only=True),),
    add_arguments=add_arguments,
    quick={"seconds": 30, "tasks": 3, "kill_every": 5, "tool_calls": 4, "drain_seconds": 120},
)

if __name__ == "__main__":
    SCENARIO.main()
