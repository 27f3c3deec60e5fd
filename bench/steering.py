"""Scenario: how long a steer takes to reach the agent, against the same follow-up queued.

The production server (gunicorn as `make serve` runs it), the real worker (`python -m
executors`, one slot) and the real Codex CLI and Claude Code (`--kinds`) on the loopback model
server. Each round starts a turn whose model asks for a short shell command again and again
(`--tool-seconds` each, `--tool-calls` times, then a final answer), as an agent at work does.
Once the turn's first model request has arrived, and a random moment within one claim check
later, a follow-up is sent with strategy `steer` (measured) or `enqueue` (the baseline),
alternated round by round. The figure is the time from sending it to the first model request
whose body carries it; beside it, for a steer, the time until Baton recorded that the executor
took it (`Steer.delivered_at`: the worker says so with its next claim check, so this comes
after the model request more often than not).

A steer waits for the worker's next claim check (`BATON_WORKER_CLAIM_CHECK_SECONDS`, 0.5 s),
is handed to the executor, and rides the agent's next model request: the time left of the tool
command running then is part of it. A queued follow-up waits for the whole turn.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import (  # noqa: E402
    LiveBaton,
    live_baton,
    model_env,
    running_worker,
    wait_for_task,
)
from bench._suite import Measurement, Row, Scenario, quantile  # noqa: E402

KINDS = ("codex", "claude_code")
CLAIM_CHECK_SECONDS = 0.5  # the worker's default


def _tool_call(kind: str, command: str) -> dict[str, Any]:
    if kind == "codex":
        return {"tool": {"name": "exec_command", "arguments": {"cmd": command}}}
    return {"tool": {"name": "Bash", "arguments": {"command": command}}}


def _carries(request: Any, text: str) -> bool:
    return json.dumps(text)[1:-1] in json.dumps(request.body)


def _first_carrying(model: Any, text: str, *, timeout: float) -> float:
    """When the first model request carrying `text` arrived (wall clock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for request in model.model_requests():
            if _carries(request, text):
                return float(request.received_at)
        time.sleep(0.005)
    raise SystemExit(f"no model request carried {text!r} within {timeout:.0f} s")


def _round(
    baton: LiveBaton, model: Any, kind: str, *, strategy: str, number: int, args: argparse.Namespace
) -> tuple[float, float | None, str]:
    """One turn and one follow-up: (ms to the model request carrying it, ms to its delivery
    or None, what became of it)."""
    from backend.tasks.models import Steer

    model.clear()
    command = f"sleep {args.tool_seconds}"
    model.set_turns([_tool_call(kind, command)] * args.tool_calls + [{"text": "Done."}])
    created = baton.product.post(
        "/api/tasks/",
        json={"title": "bench", "task_type": "code", "executor": kind, "message": "Build it."},
    )
    created.raise_for_status()
    task_id = created.json()["id"]
    deadline = time.monotonic() + 60
    while not model.model_requests():
        if time.monotonic() > deadline:
            raise SystemExit(f"{kind}: the turn's first model request never came")
        time.sleep(0.005)
    time.sleep(random.uniform(0, CLAIM_CHECK_SECONDS))
    text = f"Also cover the Windows path, round {number} ({strategy})."
    sent_at = time.time()
    response = baton.product.post(
        f"/api/tasks/{task_id}/messages/", json={"message": text, "strategy": strategy}
    )
    response.raise_for_status()
    body = response.json()
    arrived = _first_carrying(model, text, timeout=120)
    delivered_ms = None
    outcome = "queued"
    if body.get("steered"):
        wait_for_task(baton, task_id)
        steer = Steer.objects.get(pk=body["steer_id"])
        outcome = steer.status if not steer.fallback_reason else steer.fallback_reason
        if isinstance(steer.delivered_at, datetime):
            delivered_ms = (steer.delivered_at.timestamp() - sent_at) * 1000
    wait_for_task(baton, task_id)
    return (arrived - sent_at) * 1000, delivered_ms, outcome


def measure_latency(args: argparse.Namespace) -> list[Row]:
    from executors.standin import ModelServer

    kinds = [kind for kind in args.kinds.split(",") if kind]
    rows = []
    with (
        bench_database(args.postgres) as vendor,
        live_baton(production=True, threads=8) as baton,
        ModelServer() as model,
    ):
        from backend.dispatch.policies import set_policy

        set_policy(task_type="code", values={"resume_native_sessions": False})
        env = model_env(model)
        for kind in kinds:
            workdir = Path(tempfile.mkdtemp(prefix=f"baton-bench-steering-{kind}-"))
            steered: list[float] = []
            delivered: list[float] = []
            queued: list[float] = []
            outcomes: dict[str, int] = {}
            with running_worker(baton, workdir=workdir, kinds=[kind], **env):
                for number in range(args.rounds):
                    for strategy in ("steer", "enqueue") if number % 2 else ("enqueue", "steer"):
                        ms, delivered_ms, outcome = _round(
                            baton, model, kind, strategy=strategy, number=number, args=args
                        )
                        if strategy == "enqueue":
                            queued.append(ms)
                            continue
                        outcomes[outcome] = outcomes.get(outcome, 0) + 1
                        if outcome == "delivered":
                            steered.append(ms)
                            if delivered_ms is not None:
                                delivered.append(delivered_ms)
            if not steered:
                raise SystemExit(f"{kind}: no steer was delivered ({outcomes}); see {workdir}")
            rows.append(
                Row(
                    f"{kind}: steer, API call → the agent's next model request ({vendor})",
                    statistics.median(steered),
                    "ms",
                    baseline_name="the same follow-up queued (enqueue)",
                    baseline_value=statistics.median(queued),
                    note=(
                        f"{len(steered)} steers delivered of {args.rounds} ({outcomes}); p90 "
                        f"{quantile(steered, 0.9):.0f} ms; recorded as delivered p50 "
                        f"{statistics.median(delivered):.0f} ms, p90 "
                        f"{quantile(delivered, 0.9):.0f} ms; tool command "
                        f"{args.tool_seconds} s, claim check {CLAIM_CHECK_SECONDS} s"
                    ),
                )
            )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kinds", default=",".join(KINDS), help="executors to steer")
    parser.add_argument("--rounds", type=int, default=20, help="steers (and queued) a kind")
    parser.add_argument(
        "--tool-seconds", type=float, default=0.2, help="each tool command's run time"
    )
    parser.add_argument("--tool-calls", type=int, default=12, help="tool calls a turn makes")


SCENARIO = Scenario(
    name=Path(__file__).stem,
    summary="A steer's way to the running agent, against the same follow-up queued.",
    measurements=(Measurement("latency", measure_latency),),
    add_arguments=add_arguments,
    quick={"rounds": 2, "tool_calls": 6},
)

if __name__ == "__main__":
    SCENARIO.main()
