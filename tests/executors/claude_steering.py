"""Running an interactive (steerable) adapter's executor the way the worker does, for the
Claude Code adapter tests.

`run_as_worker` in `runs.py` never attaches a parser to stdin; an interactive executor would
then wait for input forever. `run_attached` is the same run with the parser attached right after
start, as `TurnRun` does, and, meanwhile, a test's own code on another thread (to steer).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from executors.adapters.base import (
    ExecutorAdapter,
    Launch,
    RunRequest,
    SteerableParser,
    SteerResult,
)
from executors.events import Event
from executors.process import ExecutorProcess
from tests.executors.runs import RUN_TIMEOUT_SECONDS, FinishedRun


@dataclass
class SteerAnswers:
    """A steer's `done`: every answer it got (exactly one is right), waitable."""

    answers: list[SteerResult] = field(default_factory=list)
    _answered: threading.Event = field(default_factory=threading.Event)

    def __call__(self, result: SteerResult) -> None:
        self.answers.append(result)
        self._answered.set()

    def wait(self, timeout: float = 10.0) -> SteerResult:
        """The first answer; AssertionError if none came within `timeout` seconds."""
        assert self._answered.wait(timeout), f"no answer to the steer within {timeout} s"
        return self.answers[0]


@dataclass
class AttachedRun:
    """A run of `run_attached`: its parser (to steer) and its process (for the test to stop)."""

    parser: SteerableParser
    process: ExecutorProcess


def run_attached(
    adapter: ExecutorAdapter,
    request: RunRequest,
    *,
    launch: Launch | None = None,
    meanwhile: Callable[[AttachedRun], None] | None = None,
    timeout: float = RUN_TIMEOUT_SECONDS,
) -> tuple[FinishedRun, SteerableParser]:
    """Run `request` to the end with its parser attached to stdin, calling `meanwhile` on
    another thread while it runs; the finished run and its parser (to steer after the end).

    An exception in `meanwhile` stops the run and is raised here.
    """
    launch = launch or adapter.launch(request)
    assert launch.interactive
    parser = adapter.parser(request)
    assert isinstance(parser, SteerableParser)
    started = time.monotonic()
    process = ExecutorProcess.start(launch, marker=f"{adapter.kind}-test-{uuid.uuid4().hex}")
    parser.attach(process)
    watchdog = threading.Timer(timeout, process.stop, kwargs={"grace_seconds": 0})
    watchdog.start()
    failures: list[BaseException] = []

    def side() -> None:
        assert meanwhile is not None
        try:
            meanwhile(AttachedRun(parser=parser, process=process))
        except BaseException as error:  # noqa: BLE001 - re-raised on the test's thread below
            failures.append(error)
            process.stop(grace_seconds=0)

    side_thread = threading.Thread(target=side, daemon=True) if meanwhile else None
    if side_thread is not None:
        side_thread.start()
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
    if side_thread is not None:
        side_thread.join(timeout)
    if failures:
        raise failures[0]
    assert left == [], "processes of the run survived stop()"
    assert exit_code is not None
    seconds = time.monotonic() - started
    stderr = process.stderr_tail()
    outcome = parser.finish(exit_code=exit_code, stderr_tail=stderr)
    return FinishedRun(lines, events, outcome, exit_code, stderr, seconds), parser
