"""Scenario: the load profile, what a fleet of running agent turns and a product cost one server.

Baton under gunicorn as `make serve` runs it (`BATON_ENV=production`, `backend/gunicorn_conf.py`,
`--server-workers` processes of `--threads` request threads) on PostgreSQL, driven the way a
fleet drives it, for each N of `--turns`:

- N running turns, held by N / 4 workers (`--claims-per-worker`, one worker account): each turn
  makes progress once a second (a few events and `--text-step` characters more of its partial
  text) and, after `--turn-seconds` (each turn's start spread over that time), reports its
  result; its worker then dispatches the next pending turn;
- each worker sends one batched heartbeat for its claims twice a second, carrying the progress
  each turn made since the last one (what its partial text gained, at the length Baton holds,
  as Baton's worker sends it; the whole text with `--whole-text`, and after a heartbeat that
  failed). With `--progress posts` each turn posts its progress on its own instead, once a
  second, as workers did before the heartbeat carried it;
- a product client creates a task and reads a task, each 5 times a second, and holds
  `--streams` event streams of running tasks open;
- a bare request (`/bench/ceiling/`, two small queries) 5 times a second: what any request
  costs in the same server at the same moment.

Client processes (`--clients`, asyncio + httpx) send on schedule whatever the answers' pace
(a request not answered in 10 s is failed), so a server that cannot keep up shows as failed
or late requests, not as a slower offer. After `--warmup` seconds, `--seconds` are measured:

- per endpoint: requests answered per second, failed (not 2xx, or no answer), p50 and p95
  latency, the server's CPU per request (the request thread's, from the first middleware in to
  the response out: `bench/_load_settings.py`), that CPU over the bare request's, and its share
  of all the server's CPU in the window (the rest: gunicorn, event streams, threads idle);
- the server's CPU and PostgreSQL's (every backend of the database) per second, the whole
  machine's (the client processes and any other job included: whether the cores ran out),
  and the most PostgreSQL connections open at once;
- whether the server held N: every request accepted and the product's p95 under 100 ms.

PostgreSQL only (`--postgres URL`, on this host: its backends' CPU is read from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import (  # noqa: E402
    cpu_seconds,
    live_baton,
    machine_cpu_seconds,
    postgres_backends,
    server_cpu_seconds,
)
from bench._seed import pending_turns  # noqa: E402
from bench._suite import (  # noqa: E402
    Measurement,
    Row,
    Scenario,
    at_least,
    at_most,
    quantile,
    results_of,
)

HEARTBEAT_SECONDS = 0.5
PROGRESS_SECONDS = 1.0
PRODUCT_SECONDS = 0.1  # a create or a read, alternately
BARE_SECONDS = 0.2
TIMEOUT = 10.0
PRODUCT = ("create task", "read task")
WORDS = ("the", "agent", "reads", "the", "failing", "test", "and", "patches", "its", "fixture")


@dataclass
class Plan:
    url: str
    worker_token: str
    product_token: str
    start: float  # when every client begins (unix time)
    window: tuple[float, float]  # what is measured
    turn_seconds: float
    text_step: int
    claims_per_worker: int
    whole_text: bool = False
    progress_posts: bool = False
    workers: list[str] = field(default_factory=list)
    stream_tasks: list[int] = field(default_factory=list)  # the first turns claimed
    product: bool = False


# What a client measured: per endpoint, the latencies of the requests answered in the window,
# and how many were offered and failed there.
Tally = dict[str, dict[str, Any]]


def _tally() -> Tally:
    return defaultdict(lambda: {"latencies": [], "offered": 0, "failed": 0})


async def _send(
    client: Any, tally: Tally, plan: Plan, name: str, method: str, path: str, body: Any = None
) -> Any:
    started = time.time()
    inside = plan.window[0] <= started < plan.window[1]
    answer = None
    try:
        response = await client.request(method, path, json=body, timeout=TIMEOUT)
        ok = 200 <= response.status_code < 300
        answer = response.json() if ok and response.content else None
    except Exception:  # noqa: BLE001 - a failed request is counted, whatever failed
        ok = False
    if inside:
        entry = tally[name]
        entry["offered"] += 1
        if ok:
            entry["latencies"].append(time.time() - started)
        else:
            entry["failed"] += 1
    return answer


async def _every(seconds: float, plan: Plan, step: Any) -> None:
    """Run `step` on schedule until the window ends, each run in its own task, so a slow
    answer does not slow the offer."""
    due = plan.start + random.uniform(0, seconds)
    pending: set[asyncio.Task[Any]] = set()
    while due < plan.window[1]:
        await asyncio.sleep(max(0.0, due - time.time()))
        task = asyncio.create_task(step())
        pending.add(task)
        task.add_done_callback(pending.discard)
        due += seconds
    if pending:
        await asyncio.wait(pending, timeout=TIMEOUT)


async def _worker(client: Any, tally: Tally, plan: Plan, worker_id: str) -> None:
    claims: dict[int, dict[str, Any]] = {}

    async def dispatch(limit: int) -> None:
        answer = await _send(
            client,
            tally,
            plan,
            "dispatch",
            "POST",
            "/api/executor/dispatch/",
            {"worker_id": worker_id, "kinds": ["codex"], "limit": limit},
        )
        for turn in (answer or {}).get("turns", []):
            claims[turn["subtask_id"]] = {
                "attempt": turn["attempt"],
                "text": "",
                "events": [],
                "ends": time.time() + random.uniform(0.2, 1.0) * plan.turn_seconds,
            }

    def progress_body(claim: dict[str, Any]) -> dict[str, Any]:
        """The progress the turn made since Baton last stored some, as the worker sends it."""
        body: dict[str, Any] = {"events": claim["events"]}
        stored = claim.get("stored")  # the length Baton holds, as far as the worker knows
        if plan.whole_text or stored is None:
            body["partial_text"] = claim["text"]
        else:
            body["partial_text_append"] = claim["text"][stored:]
            body["partial_text_offset"] = stored
        claim["events"] = []
        claim["sent"] = len(claim["text"])
        return body

    async def heartbeat() -> None:
        turns = []
        for key, claim in list(claims.items()):
            turn: dict[str, Any] = {"subtask_id": key, "attempt": claim["attempt"]}
            if not plan.progress_posts and claim["events"] and not claim.get("busy"):
                claim["busy"] = True
                turn["progress"] = progress_body(claim)
            turns.append(turn)
        if not turns:
            return
        answer = await _send(
            client,
            tally,
            plan,
            "heartbeat (batched)",
            "POST",
            "/api/executor/heartbeat/",
            {"worker_id": worker_id, "turns": turns},
        )
        states = {state["subtask_id"]: state for state in (answer or {}).get("turns", [])}
        for turn in turns:
            if "progress" not in turn or (claim := claims.get(turn["subtask_id"])) is None:
                continue
            outcome = states.get(turn["subtask_id"], {}).get("progress") or {}
            claim["stored"] = outcome.get("partial_text_chars") if outcome.get("stored") else None
            claim["busy"] = False

    async def progress_or_result(subtask_id: int, claim: dict[str, Any]) -> None:
        base = f"/api/executor/subtasks/{subtask_id}"
        if time.time() >= claim["ends"]:
            del claims[subtask_id]
            await _send(
                client,
                tally,
                plan,
                "result",
                "POST",
                f"{base}/result/",
                {
                    "worker_id": worker_id,
                    "attempt": claim["attempt"],
                    "status": "COMPLETED",
                    "result": {"value": claim["text"] or "Done."},
                },
            )
            await dispatch(1)
            return
        gained = " ".join(random.choices(WORDS, k=plan.text_step // 4))[: plan.text_step]
        claim["text"] += gained
        claim["events"] += [
            {"type": "agent_message_delta", "text": gained},
            {"type": "tool_call", "name": "shell", "arguments": {"cmd": "pytest -x"}},
        ]
        if not plan.progress_posts or claim.get("busy"):
            return  # the next heartbeat carries it
        claim["busy"] = True
        body = {"worker_id": worker_id, "attempt": claim["attempt"], **progress_body(claim)}
        answer = await _send(client, tally, plan, "progress", "POST", f"{base}/progress/", body)
        claim["stored"] = answer.get("partial_text_chars") if isinstance(answer, dict) else None
        claim["busy"] = False

    async def each_claim() -> None:
        """Each claim's progress (or, once it is over, its result), at once."""
        await asyncio.gather(
            *(progress_or_result(subtask_id, claim) for subtask_id, claim in list(claims.items()))
        )

    await asyncio.sleep(max(0.0, plan.start - time.time()))
    await dispatch(plan.claims_per_worker)
    await asyncio.gather(
        _every(HEARTBEAT_SECONDS, plan, heartbeat),
        _every(PROGRESS_SECONDS, plan, each_claim),
    )


async def _product(client: Any, tally: Tally, plan: Plan) -> None:
    created: list[int] = []
    turn = [0]

    async def create_or_read() -> None:
        turn[0] += 1
        if turn[0] % 2 or not created:
            answer = await _send(
                client,
                tally,
                plan,
                PRODUCT[0],
                "POST",
                "/api/tasks/",
                {
                    "title": "load",
                    "task_type": "code",
                    "message": "Fix the test.",
                    "executor": "codex",
                },
            )
            if answer:
                created.append(answer["id"])
        else:
            task_id = random.choice(created[-50:])
            await _send(client, tally, plan, PRODUCT[1], "GET", f"/api/tasks/{task_id}/")

    async def bare() -> None:
        await _send(client, tally, plan, "bare view", "GET", "/bench/ceiling/")

    async def stream(task_id: int) -> None:
        path = f"/api/tasks/{task_id}/events/"
        try:
            async with client.stream("GET", path, timeout=None) as response:
                async for _ in response.aiter_lines():
                    if time.time() >= plan.window[1]:
                        return
        except Exception:  # noqa: BLE001 - a stream that breaks is counted
            if plan.window[0] <= time.time() < plan.window[1]:
                tally["event stream"]["failed"] += 1

    await asyncio.sleep(max(0.0, plan.start - time.time()))
    streams = [asyncio.create_task(stream(task_id)) for task_id in plan.stream_tasks]
    await asyncio.gather(
        _every(PRODUCT_SECONDS, plan, create_or_read), _every(BARE_SECONDS, plan, bare)
    )
    for task in streams:
        task.cancel()


def _client(plan: Plan, results: Any) -> None:
    import httpx

    async def run() -> Tally:
        tally = _tally()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with (
            httpx.AsyncClient(
                base_url=plan.url,
                headers={"Authorization": f"Token {plan.worker_token}"},
                limits=limits,
            ) as workers,
            httpx.AsyncClient(
                base_url=plan.url,
                headers={"Authorization": f"Token {plan.product_token}"},
                limits=limits,
            ) as product,
        ):
            jobs = [_worker(workers, tally, plan, worker_id) for worker_id in plan.workers]
            if plan.product:
                jobs.append(_product(product, tally, plan))
            await asyncio.gather(*jobs)
        return tally

    results.put({name: dict(entry) for name, entry in asyncio.run(run()).items()})


def _seed(tasks: int) -> list[int]:
    """`tasks` tasks with a short history and a pending Codex turn each, owned by the product
    account whose token streams their events."""
    from django.contrib.auth import get_user_model

    from backend.tasks.models import Task

    pending_turns(tasks)
    owner, _ = get_user_model().objects.get_or_create(username="bench-product")
    Task.objects.update(owner=owner)
    return list(Task.objects.order_by("id").values_list("id", flat=True))


def _postgres_cpu() -> tuple[float, int]:
    """CPU seconds of every backend of this database but this process's, and how many."""
    seconds = cpu_seconds(postgres_backends(other_than_mine=True))
    return sum(seconds.values()), len(seconds)


def _request_cpu(directory: Path, window: tuple[float, float]) -> dict[str, list[float]]:
    """The server's CPU per request in the window, by endpoint (`bench/_load_settings.py`)."""
    names = {
        ("POST", "api/executor/dispatch/"): "dispatch",
        ("POST", "api/executor/heartbeat/"): "heartbeat (batched)",
        ("POST", "api/executor/subtasks/<id:subtask_id>/progress/"): "progress",
        ("POST", "api/executor/subtasks/<id:subtask_id>/result/"): "result",
        ("POST", "api/tasks/"): PRODUCT[0],
        ("GET", "api/tasks/<id:task_id>/"): PRODUCT[1],
        ("GET", "api/tasks/<id:task_id>/events/"): "event stream",
        ("GET", "bench/ceiling/"): "bare view",
    }
    spent: dict[str, list[float]] = defaultdict(list)
    for path in directory.glob("*.log"):
        for line in path.read_text(encoding="utf-8").splitlines():
            at, method, route, seconds = line.split(" ")
            if window[0] <= float(at) < window[1]:
                spent[names.get((method, route), f"{method} {route}")].append(float(seconds))
    return spent


def _profile(args: argparse.Namespace, turns: int) -> dict[str, Any]:
    from backend.tasks.models import Task

    cpu_dir = Path(tempfile.mkdtemp(prefix="baton-load-cpu-"))
    os.environ["BENCH_CPU_DIR"] = str(cpu_dir)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench._load_settings"  # the server's
    total = args.seconds + args.warmup
    finishing = turns * (total / args.turn_seconds) * 1.5 + turns
    task_ids = _seed(int(finishing) + 10)
    with live_baton(workers=args.server_workers, threads=args.threads, production=True) as baton:
        start = time.time() + 2.0
        window = (start + args.warmup, start + total)
        workers = [f"load-{number}" for number in range(max(1, turns // args.claims_per_worker))]
        fleet = Plan(
            baton.url,
            baton.worker_token,
            baton.product_token,
            start,
            window,
            args.turn_seconds,
            args.text_step,
            args.claims_per_worker,
            args.whole_text,
            args.progress == "posts",
        )
        # Each client process drives its share of the workers; the first one, the product too.
        plans = [
            replace(
                fleet,
                workers=workers[index :: args.clients],
                stream_tasks=task_ids[: args.streams] if index == 0 else [],
                product=index == 0,
            )
            for index in range(args.clients)
        ]
        results: Any = multiprocessing.Queue()
        clients = [multiprocessing.Process(target=_client, args=(plan, results)) for plan in plans]
        for process in clients:
            process.start()
        time.sleep(max(0.0, window[0] - time.time()))
        server_before = server_cpu_seconds(baton.server_pid)
        postgres_before, _ = _postgres_cpu()
        machine_before = machine_cpu_seconds()
        connections = 0
        while time.time() < window[1]:
            connections = max(connections, _postgres_cpu()[1])
            time.sleep(0.5)
        server_spent = server_cpu_seconds(baton.server_pid) - server_before
        postgres_spent = _postgres_cpu()[0] - postgres_before
        machine_spent = machine_cpu_seconds() - machine_before
        tallies = results_of(clients, results)
        for process in clients:
            process.join(timeout=30)
    merged = _tally()
    for tally in tallies:
        for name, entry in tally.items():
            merged[name]["latencies"] += entry["latencies"]
            merged[name]["offered"] += entry["offered"]
            merged[name]["failed"] += entry["failed"]
    Task.objects.all().delete()
    return {
        "turns": turns,
        "seconds": args.seconds,
        "endpoints": dict(merged),
        "request_cpu": _request_cpu(cpu_dir, window),
        "server_cpu": server_spent,
        "postgres_cpu": postgres_spent,
        "machine_cpu": machine_spent,
        "connections": connections,
    }


def _report(profile: dict[str, Any]) -> dict[str, Any]:
    seconds = profile["seconds"]
    cpu = profile["request_cpu"]
    bare = cpu.get("bare view") or [float("nan")]
    bare_ms = statistics.median(bare) * 1000
    rows = []
    for name in sorted(set(profile["endpoints"]) | set(cpu)):
        entry = profile["endpoints"].get(name, {"latencies": [], "offered": 0, "failed": 0})
        spent = cpu.get(name, [])
        latencies = sorted(entry["latencies"])
        cpu_ms = statistics.median(spent) * 1000 if spent else float("nan")
        rows.append(
            {
                "endpoint": name,
                "per_second": len(latencies) / seconds,
                "failed": entry["failed"],
                "p50_ms": quantile(latencies, 0.5) * 1000,
                "p95_ms": quantile(latencies, 0.95) * 1000,
                "cpu_ms": cpu_ms,
                "vs_bare": cpu_ms / bare_ms,
                "share": sum(spent) / profile["server_cpu"] if profile["server_cpu"] else 0.0,
            }
        )
    product = sorted(
        latency
        for name in PRODUCT
        for latency in profile["endpoints"].get(name, {"latencies": []})["latencies"]
    )
    failed = sum(row["failed"] for row in rows)
    product_p95 = quantile(product, 0.95) * 1000
    return {
        "turns": profile["turns"],
        "rows": rows,
        "server_cpu_per_second": profile["server_cpu"] / seconds,
        # What one running turn costs the server, all its traffic and the product's included.
        "server_cpu_ms_per_turn": profile["server_cpu"] / seconds / profile["turns"] * 1000,
        "postgres_cpu_per_second": profile["postgres_cpu"] / seconds,
        # Every process's, the clients' included: whether the machine itself ran out of cores.
        "machine_cpu_per_second": profile["machine_cpu"] / seconds,
        "postgres_connections": profile["connections"],
        "product_p95_ms": product_p95,
        "failed": failed,
        "held": failed == 0 and product_p95 < 100,
    }


# The targets of the issue "Performance by load profile", by endpoint: its server CPU at most
# this many times the bare request's (the heartbeat's for 100 claims a worker).
CPU_OVER_BARE = {"progress": 1.5, "heartbeat (batched)": 2.0}
HEARTBEAT_TARGET_CLAIMS = 100


def _rows(report: dict[str, Any], claims_per_worker: int) -> list[Row]:
    n = f"N = {report['turns']}"
    rows = [
        Row(
            f"{n}: the product's p95",
            report["product_p95_ms"],
            "ms",
            target=at_most(100),
            note=f"{'held' if report['held'] else 'NOT held'}; server CPU "
            f"{report['server_cpu_per_second']:.2f} s/s ({report['server_cpu_ms_per_turn']:.1f} "
            f"ms a turn), PostgreSQL {report['postgres_cpu_per_second']:.2f} s/s, the machine "
            f"{report['machine_cpu_per_second']:.2f} of {os.cpu_count()} cores, "
            f"{report['postgres_connections']} PostgreSQL connections at most",
        ),
        Row(f"{n}: requests failed", report["failed"], "requests", target=at_most(0)),
    ]
    bare = next((row for row in report["rows"] if row["endpoint"] == "bare view"), None)
    for row in report["rows"]:
        if row["endpoint"] == "bare view":
            continue
        limit = CPU_OVER_BARE.get(row["endpoint"])
        if row["endpoint"] == "heartbeat (batched)" and claims_per_worker < HEARTBEAT_TARGET_CLAIMS:
            limit = None  # the target is the heartbeat's for 100 claims
        rows.append(
            Row(
                f"{n}: server CPU a request, {row['endpoint']}",
                row["cpu_ms"],
                "ms",
                baseline_name="bare view" if bare else None,
                baseline_value=bare["cpu_ms"] if bare else None,
                target=at_most(limit, of="ratio") if limit else None,
                note=f"{row['per_second']:.1f} req/s, {row['failed']} failed, p50 / p95 "
                f"{row['p50_ms']:.0f} / {row['p95_ms']:.0f} ms, {row['share']:.0%} of the "
                "server's CPU",
            )
        )
    return rows


def measure_profile(args: argparse.Namespace) -> list[Row]:
    reports = []
    with bench_database(args.postgres):
        for turns in (int(value) for value in args.turns.split(",")):
            reports.append(_report(_profile(args, turns)))
    rows = [row for report in reports for row in _rows(report, args.claims_per_worker)]
    held = [report["turns"] for report in reports if report["held"]]
    rows.append(
        Row(
            "largest N held",
            max(held, default=0),
            "running turns",
            target=at_least(1_000),
            note=f"of N = {args.turns}",
        )
    )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", default="50,100", help="the Ns, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured per N")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--server-workers", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=20,
        help="request threads a process (gunicorn adds one per event stream it may serve)",
    )
    parser.add_argument("--turn-seconds", type=float, default=30.0, help="a turn's length, at most")
    parser.add_argument("--text-step", type=int, default=200, help="characters a progress adds")
    parser.add_argument("--streams", type=int, default=4, help="event streams held open")
    parser.add_argument(
        "--claims-per-worker", type=int, default=4, help="turns a worker runs (its heartbeat's)"
    )
    parser.add_argument(
        "--whole-text",
        action="store_true",
        help="progress sends the whole partial text every time (as before appends)",
    )
    parser.add_argument(
        "--progress",
        choices=("heartbeat", "posts"),
        default="heartbeat",
        help="progress rides the batched heartbeat (as Baton's worker sends it) or is posted "
        "per turn",
    )


SCENARIO = Scenario(
    name=Path(__file__).stem,
    summary="The load profile: N running turns and a product on one server (PostgreSQL).",
    measurements=(Measurement("profile", measure_profile, postgres_only=True),),
    add_arguments=add_arguments,
    quick={
        "turns": "8",
        "seconds": 4.0,
        "warmup": 2.0,
        "clients": 2,
        "streams": 1,
        "turn_seconds": 6.0,
    },
)

if __name__ == "__main__":
    SCENARIO.main()
