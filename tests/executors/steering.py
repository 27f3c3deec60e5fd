"""Running an interactive executor the way the worker does, with a hand on it while it runs.

`run_as_worker` (runs.py) reads a run to its end; an interactive run (`Launch.interactive`)
also needs its parser attached to the process's stdin, as `TurnRun` does, and a steering test
needs to act in the middle: wait for an event, steer, stop the process. `LiveRun` reads the
run's lines on a thread of its own and lets the test do that from its thread; `finish()` then
checks, as `run_as_worker` does, that nothing of the run is left alive.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

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


class SteerAnswer:
    """What a steer's `done` was called with, every time it was called."""

    def __init__(self) -> None:
        self.results: list[SteerResult] = []
        self._called = threading.Event()

    def done(self, result: SteerResult) -> None:
        self.results.append(result)
        self._called.set()

    def wait(self, timeout: float = RUN_TIMEOUT_SECONDS) -> SteerResult:
        assert self._called.wait(timeout), "the steer got no answer"
        return self.results[0]


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

    def steer(self, text: str) -> SteerAnswer:
        assert isinstance(self.parser, SteerableParser)
        answer = SteerAnswer()
        self.parser.steer(text, answer.done)
        return answer

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


def run_to_end(
    adapter: ExecutorAdapter, request: RunRequest, *, launch: Launch | None = None
) -> FinishedRun:
    """`run_as_worker` for an interactive executor: attached as the worker attaches it."""
    return LiveRun(adapter, request, launch=launch).finish()
