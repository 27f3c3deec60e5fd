"""Running an adapter's executor the way the worker does, for the adapter tests.

ExecutorProcess with a fresh marker, every stdout line through the adapter's parser, the outcome
from the exit code and the stderr tail — and a watchdog, so a hung executor fails its test
instead of hanging the suite. After the run, nothing of it may be left alive.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from executors.adapters.agno import AgnoAdapter
from executors.adapters.base import (
    ExecutorAdapter,
    Launch,
    ModelEndpoint,
    RunRequest,
    SteerableParser,
)
from executors.client import BackendClient
from executors.events import Event, Outcome
from executors.payloads import DispatchedTurn
from executors.process import ExecutorProcess
from executors.runner import TurnRun

RUN_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class FinishedRun:
    lines: list[str]
    events: list[Event]
    outcome: Outcome
    exit_code: int
    stderr: str
    seconds: float


def run_as_worker(
    adapter: ExecutorAdapter,
    request: RunRequest,
    *,
    launch: Launch | None = None,
    timeout: float = RUN_TIMEOUT_SECONDS,
) -> FinishedRun:
    """Run `request` (or an altered `launch` of it) to the end and parse what it printed; an
    interactive run's parser is attached to its stdin, as the worker attaches it."""
    launch = launch or adapter.launch(request)
    parser = adapter.parser(request)
    started = time.monotonic()
    process = ExecutorProcess.start(launch, marker=f"{adapter.kind}-test-{uuid.uuid4().hex}")
    if launch.interactive and isinstance(parser, SteerableParser):
        parser.attach(process)
    watchdog = threading.Timer(timeout, process.stop, kwargs={"grace_seconds": 0})
    watchdog.start()
    lines: list[str] = []
    events: list[Event] = []
    try:
        for line in process.lines():
            lines.append(line)
            events += parser.feed(line)
        exit_code = process.wait(timeout=timeout)
    finally:
        watchdog.cancel()
        left = process.stop(grace_seconds=0.5)
    assert left == [], "processes of the run survived stop()"
    assert exit_code is not None
    seconds = time.monotonic() - started
    stderr = process.stderr_tail()
    outcome = parser.finish(exit_code=exit_code, stderr_tail=stderr)
    return FinishedRun(lines, events, outcome, exit_code, stderr, seconds)


def of_type(events: list[Event], kind: type[Event]) -> list[Event]:
    return [event for event in events if isinstance(event, kind)]


def agno_turn_run(*, turn: DispatchedTurn, client: BackendClient, root: Path) -> TurnRun:
    """The worker's run of `turn` with the Agno adapter, its workspaces and state under
    `root`, reporting through `client` (for tests that drive a run's steps themselves)."""
    return TurnRun(
        turn=turn,
        adapter=AgnoAdapter(),
        client=client,
        endpoint=ModelEndpoint(),
        workspace_root=root / "workspaces",
        state_root=root / "state",
        passthrough_env={},
        on_done=lambda run: None,
    )
