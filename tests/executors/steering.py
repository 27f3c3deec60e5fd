"""Running an interactive executor the way the worker does, with a hand on it while it runs.

`run_as_worker` (runs.py) reads a run to its end; an interactive run (`Launch.interactive`)
also needs its parser attached to the process's stdin, as `TurnRun` does, and a steering test
needs to act in the middle: wait for an event, steer, stop the process. `LiveRun` reads the
run's lines on a thread of its own and lets the test do that from its thread; `finish()` then
checks, as `run_as_worker` does, that nothing of the run is left alive. `run_attached` is the
same with the test's own steps on a thread of their own.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

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


class SteerAnswers:
    """A steer's `done`: every answer it got (exactly one is right), waitable."""

    def __init__(self) -> None:
        self.answers: list[SteerResult] = []
        self._called = threading.Event()

    def __call__(self, result: SteerResult) -> None:
        self.answers.append(result)
        self._called.set()

    def wait(self, timeout: float = RUN_TIMEOUT_SECONDS) -> SteerResult:
        """The first answer; AssertionError if none came within `timeout` seconds."""
        assert self._called.wait(timeout), f"no answer to the steer within {timeout} s"
        return self.answers[0]


class LiveRun:
    """One run of `adapter` for `request`, started now and read on a thread of its own."""

    def __init__(
        self,
        adapter: ExecutorAdapter,
        request: RunRequest,
        *,
        launch: Launch | None = None,
        timeout: float = RUN_TIMEOUT_SECONDS,
    ) -> None:
        launch = launch or adapter.launch(request)
        self.parser = adapter.parser(request)
        self._timeout = timeout
        self._started = time.monotonic()
        self.process = ExecutorProcess.start(
            launch, marker=f"{adapter.kind}-test-{uuid.uuid4().hex}"
        )
        if launch.interactive and isinstance(self.parser, SteerableParser):
            self.parser.attach(self.process)
        self._watchdog = threading.Timer(timeout, self.process.stop, kwargs={"grace_seconds": 0})
        self._watchdog.start()
        self.lines: list[str] = []
        self.events: list[Event] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.lines():
            events = self.parser.feed(line)
            with self._changed:
                self.lines.append(line)
                self.events += events
                self._changed.notify_all()

    def steer(self, text: str) -> SteerAnswers:
        assert isinstance(self.parser, SteerableParser)
        answers = SteerAnswers()
        self.parser.steer(text, answers)
        return answers

    def wait_for(self, found: Callable[[list[Event]], bool]) -> None:
        """Until the events so far satisfy `found` (a failure after the run's timeout)."""
        deadline = time.monotonic() + self._timeout
        with self._changed:
            while not found(self.events):
                left = deadline - time.monotonic()
                assert left > 0, "the run never got there"
                self._changed.wait(left)

    def finish(self) -> FinishedRun:
        """Read the run to its end, check nothing of it is left, and parse its outcome."""
        try:
            self._reader.join(self._timeout)
            exit_code = self.process.wait(timeout=self._timeout)
        finally:
            self._watchdog.cancel()
            left = self.process.stop(grace_seconds=0.5)
        assert left == [], "processes of the run survived stop()"
        assert exit_code is not None
        seconds = time.monotonic() - self._started
        stderr = self.process.stderr_tail()
        outcome = self.parser.finish(exit_code=exit_code, stderr_tail=stderr)
        return FinishedRun(self.lines, self.events, outcome, exit_code, stderr, seconds)


@dataclass
class AttachedRun:
    """A run of `run_attached`: its parser (to steer) and its process (for the test to stop)."""

    parser: SteerableParser
    process: ExecutorProcess


def run_attached(
    adapter: ExecutorAdapter,
    request: RunRequest,
    *,
    meanwhile: Callable[[AttachedRun], None],
    launch: Launch | None = None,
    timeout: float = RUN_TIMEOUT_SECONDS,
) -> tuple[FinishedRun, SteerableParser]:
    """Run `request` to the end, calling `meanwhile` on another thread while it runs; the
    finished run and its parser (to steer after the end). An exception in `meanwhile` stops
    the run and is raised here."""
    live = LiveRun(adapter, request, launch=launch, timeout=timeout)
    assert isinstance(live.parser, SteerableParser)
    failures: list[BaseException] = []

    def side() -> None:
        assert isinstance(live.parser, SteerableParser)
        try:
            meanwhile(AttachedRun(parser=live.parser, process=live.process))
        except BaseException as error:  # noqa: BLE001 - re-raised on the test's thread below
            failures.append(error)
            live.process.stop(grace_seconds=0)

    side_thread = threading.Thread(target=side, daemon=True)
    side_thread.start()
    try:
        run = live.finish()
    finally:
        side_thread.join(timeout)
    if failures:
        raise failures[0]
    return run, live.parser
