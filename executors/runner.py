"""One claimed turn, from workspace to report: the part of the worker that runs an executor.

A `TurnRun` prepares the task's workspace and artifacts, starts the executor with the prompt on
stdin, feeds its stdout to the adapter's parser, buffers progress, and makes exactly one report
for its claim — or none when the product cancelled the turn or the claim was lost. Other threads
only ask it to stop (`request_stop`: cancelled, lease lost, timeout, shutdown); the decision of
what to report is taken in the run's own thread, once, so a claim is never reported twice.

Timings (monotonic, per run) are logged without content: `overhead_ms` is the worker's own cost
— claim to executor start, plus executor exit to result recorded — with artifact downloads
counted separately (`artifacts_ms`) and the executor's run time beside it (`executor_ms`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors.adapters.base import (
    BotConfig,
    ExecutorAdapter,
    ModelEndpoint,
    RunRequest,
    SteerableParser,
    SteerRefusal,
    SteerResult,
)
from executors.client import (
    BackendClient,
    BackendError,
    BackendUnavailable,
    LeaseLost,
    TurnCancelled,
)
from executors.events import ErrorCode, Outcome, OutcomeStatus
from executors.homes import HomeTemplate, TaskHome, home_name
from executors.payloads import DispatchedTurn
from executors.process import ExecutorProcess
from executors.progress import ProgressBuffer
from executors.workspace import (
    ArtifactRefused,
    materialize_artifacts,
    open_directory,
    task_workspace,
)

logger = logging.getLogger("baton.worker")

# Why a run was stopped before its executor finished.
CANCELLED, LEASE_LOST, TIMEOUT, SHUTDOWN = "cancelled", "lease_lost", "timeout", "shutdown"
# A stopped executor gets this long to exit on SIGTERM before the tree is killed.
STOP_GRACE_SECONDS = 0.5
ERROR_TEXT_CHARS = 8000


@dataclass
class RunTimings:
    claimed: float
    artifacts_ms: float = 0.0
    started: float | None = None
    exited: float | None = None
    recorded: float | None = None

    def as_log(self) -> dict[str, float | None]:
        def ms(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else round((end - start) * 1000, 2)

        start_ms = ms(self.claimed, self.started)
        report_ms = ms(self.exited, self.recorded)
        overhead = None
        if start_ms is not None and report_ms is not None:
            overhead = round(start_ms - self.artifacts_ms + report_ms, 2)
        return {
            "overhead_ms": overhead,
            "start_ms": start_ms,
            "artifacts_ms": round(self.artifacts_ms, 2),
            "executor_ms": ms(self.started, self.exited),
            "report_ms": report_ms,
        }


@dataclass
class TurnRun:
    turn: DispatchedTurn
    adapter: ExecutorAdapter
    client: BackendClient
    endpoint: ModelEndpoint
    workspace_root: Path
    state_root: Path
    passthrough_env: dict[str, str]
    on_done: Callable[[TurnRun], None]
    claimed_at: float = field(default_factory=time.monotonic)
    progress: ProgressBuffer = field(default_factory=ProgressBuffer)
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    stop_reason: str | None = None
    # Set once the executor has exited: its progress is over; the result is what counts now.
    executor_done: bool = False
    # True when the run resumed the native session the dispatch offered.
    session_resumed: bool = False
    # What was reported for the claim ("COMPLETED", "FAILED", "RETRY", "RELEASE"), or None.
    reported: str | None = None
    _process: ExecutorProcess | None = None
    _parser: SteerableParser | None = None  # while an interactive executor runs
    # Steers handed to this run, by id, and what became of each once known: each is given to
    # the executor once, and its result is sent until a heartbeat or the report is answered.
    _steers_taken: set[int] = field(default_factory=set)
    _steer_results: dict[int, SteerResult] = field(default_factory=dict)
    _steer_results_sent: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.timings = RunTimings(claimed=self.claimed_at)
        self.deadline = self.claimed_at + self.turn.bot_config.timeout_seconds

    @property
    def claim(self) -> tuple[int, int]:
        return self.turn.subtask_id, self.turn.attempt

    # -- called from other threads ----------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop the executor soon (the first reason given wins); the run's thread reports."""
        with self._lock:
            if self.stop_reason is not None:
                return
            self.stop_reason = reason
            process = self._process
        logger.info(_log_line("turn_stopping", self, reason=reason))
        if process is not None:
            # stop() waits out the grace period: not on the caller's thread.
            threading.Thread(target=process.stop, args=(STOP_GRACE_SECONDS,), daemon=True).start()

    def take_steers(self, offers: tuple[tuple[int, str], ...]) -> None:
        """Hand each steer Baton offers to the executor, once per steer id (Baton offers each
        once per claim, but two heartbeats in flight may both carry it)."""
        for steer_id, text in offers:
            with self._lock:
                if steer_id in self._steers_taken:
                    continue
                self._steers_taken.add(steer_id)
            self.steer(text, functools.partial(self._steered, steer_id))

    def steer_results(self, *, unsent_only: bool) -> list[dict[str, Any]]:
        """What became of the steers handed to this run, as the heartbeat and the report
        carry it: all of them, or those no answered heartbeat carried yet."""
        with self._lock:
            results = dict(self._steer_results)
            sent = set(self._steer_results_sent)
        return [
            {
                "steer_id": steer_id,
                "delivered": result.delivered,
                "refusal": None if result.refusal is None else str(result.refusal),
            }
            for steer_id, result in sorted(results.items())
            if not (unsent_only and steer_id in sent)
        ]

    def steer_results_sent(self, entries: list[dict[str, Any]]) -> None:
        with self._lock:
            self._steer_results_sent.update(entry["steer_id"] for entry in entries)

    def _steered(self, steer_id: int, result: SteerResult) -> None:
        with self._lock:
            self._steer_results[steer_id] = result
        logger.info(
            _log_line(
                "turn_steered" if result.delivered else "turn_steer_refused",
                self,
                steer=steer_id,
                refusal=None if result.refusal is None else str(result.refusal),
            )
        )

    def steer(self, text: str, done: Callable[[SteerResult], None]) -> None:
        """Give `text` to the running agent as more user input (`SteerableParser.steer`);
        `done` hears exactly once whether it got there. Refused at once when this executor
        cannot take input while it runs, or when no executor of the claim runs now."""
        with self._lock:
            parser = self._parser
            over = self.stop_reason is not None or self.executor_done
        if parser is None:
            steerable = self.adapter.steerable
            refusal = SteerRefusal.NOT_RUNNING if steerable else SteerRefusal.NOT_STEERABLE
            done(SteerResult.refused(refusal))
        elif over:
            done(SteerResult.refused(SteerRefusal.NOT_RUNNING))
        else:
            parser.steer(text, done)

    # -- the run's own thread ---------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # noqa: BLE001 - a worker bug must not kill the worker
            # The type only: an exception's text may quote the prompt or the answer.
            logger.error(_log_line("turn_crashed", self, error_type=type(error).__name__))
            if self.reported is None and self.stop_reason not in (CANCELLED, LEASE_LOST):
                self._report(
                    status="FAILED",
                    error=f"The Baton worker failed running this turn ({type(error).__name__}).",
                    error_code=ErrorCode.EXECUTOR_ERROR,
                )
        finally:
            self.on_done(self)

    def _run(self) -> None:
        turn = self.turn
        logger.info(_log_line("turn_claimed", self))
        workspace = task_workspace(root=self.workspace_root, task_id=turn.task_id)
        started = time.monotonic()
        try:
            materialize_artifacts(
                client=self.client,
                workspace=workspace,
                manifest=turn.artifacts,
                artifact_lists=turn.artifact_lists,
                artifact_url_template=turn.artifact_url_template,
                manifest_version=turn.manifest_version,
            )
        except (ArtifactRefused, BackendError) as error:
            self.timings.artifacts_ms = (time.monotonic() - started) * 1000
            retryable = isinstance(error, BackendUnavailable)
            self._report(
                status="RETRY" if retryable else "FAILED",
                error=f"Baton could not put the turn's artifacts in the workspace: {error}",
                error_code=ErrorCode.NETWORK_ERROR if retryable else ErrorCode.ARTIFACT_ERROR,
            )
            return
        self.timings.artifacts_ms = (time.monotonic() - started) * 1000

        outcome, exit_code = self._run_executor(workspace=workspace)
        if self.timings.exited is None:
            self.timings.exited = time.monotonic()
        self._report_outcome(outcome, exit_code=exit_code)

    def _run_executor(self, *, workspace: Path) -> tuple[Outcome | None, int | None]:
        """Resume the bot's native session when the dispatch offers it to this worker, and
        run fresh with the full prompt, within the same claim, if that session is not here
        after all (it lived on another worker, or its files are gone)."""
        turn = self.turn
        session = turn.native_session
        if (
            session is not None
            and turn.resume_prompt is not None
            and session.worker_id == self.client.worker_id
        ):
            try:
                outcome, exit_code = self._execute(
                    workspace=workspace, prompt=turn.resume_prompt, resume_session_id=session.id
                )
            except ValueError:
                # The adapter refused the session id before starting anything.
                outcome, exit_code = None, None
            resumed = outcome is not None and not self.adapter.missing_session(outcome)
            if resumed or self.stop_reason is not None:
                self.session_resumed = resumed
                return outcome, exit_code
            logger.info(_log_line("turn_resume_failed", self))
            self.timings.exited = None
            self.executor_done = False
        return self._execute(workspace=workspace, prompt=turn.prompt, resume_session_id=None)

    def _execute(
        self, *, workspace: Path, prompt: str, resume_session_id: str | None
    ) -> tuple[Outcome | None, int | None]:
        # Made and removed link-safely: the executor may have replaced what it can reach.
        tmp_name = f"{self.marker}-{uuid.uuid4().hex[:8]}"
        tmp_dir = self.state_root / "tmp" / tmp_name
        os.close(open_directory(self.state_root, f"tmp/{tmp_name}", create=True))
        # The task's executor state of its own, made afresh from the template (`homes`).
        home = TaskHome(
            state_root=self.state_root,
            task_id=self.turn.task_id,
            name=home_name(kind=self.adapter.kind, job=self.turn.kind),
            template=HomeTemplate(session_files=self.adapter.session_files),
        )
        try:
            with home.held(), self.endpoint.for_run() as endpoint:
                # A key of the run's own, revoked once the run and what it left have ended.
                state_dir = home.make_afresh()
                try:
                    return self._execute_in(
                        workspace=workspace,
                        state_dir=state_dir,
                        tmp_dir=tmp_dir,
                        prompt=prompt,
                        resume_session_id=resume_session_id,
                        endpoint=endpoint,
                    )
                finally:
                    # Between runs a home holds only its session files (disk: Codex's
                    # skills, logs and caches are megabytes a task).
                    with suppress(OSError):
                        home.make_afresh()
        finally:
            self.executor_done = True
            with suppress(OSError):
                tmp_root = open_directory(self.state_root, "tmp", create=False)
                try:
                    # rmtree with dir_fd neither follows nor removes a link in its place.
                    shutil.rmtree(tmp_name, dir_fd=tmp_root, ignore_errors=True)
                finally:
                    os.close(tmp_root)

    def _execute_in(
        self,
        *,
        workspace: Path,
        state_dir: Path,
        tmp_dir: Path,
        prompt: str,
        resume_session_id: str | None,
        endpoint: ModelEndpoint,
    ) -> tuple[Outcome | None, int | None]:
        config = self.turn.bot_config
        request = RunRequest(
            prompt=prompt,
            bot=BotConfig(
                name=config.bot,
                model=config.model,
                instructions=config.instructions,
                permission_mode=config.permission_mode,
                max_turns=config.max_turns,
                timeout_seconds=config.timeout_seconds,
            ),
            workspace=workspace,
            state_dir=state_dir,
            tmp_dir=tmp_dir,
            endpoint=endpoint,
            resume_session_id=resume_session_id,
            passthrough_env=self.passthrough_env,
        )
        launch = self.adapter.launch(request)
        parser = self.adapter.parser(request)
        with self._lock:
            if self.stop_reason is not None:
                return None, None  # stopped before the executor started
            self._process = process = ExecutorProcess.start(launch, marker=self.marker)
            if launch.interactive and isinstance(parser, SteerableParser):
                parser.attach(process)
                self._parser = parser
        self.timings.started = time.monotonic()
        try:
            for line in process.lines():
                events = parser.feed(line)
                if events:
                    self.progress.add(events)
            exit_code = process.wait()
        finally:
            with self._lock:
                self._parser = None
        # From here on the time is the worker's own (leftover cleanup, parsing, reporting).
        self.timings.exited = time.monotonic()
        self.executor_done = True
        # Tool commands the executor left running belong to the run: end them too.
        leftovers = process.stop(grace_seconds=STOP_GRACE_SECONDS)
        if leftovers:
            logger.warning(_log_line("turn_processes_left", self, pids=len(leftovers)))
        if exit_code is None:
            exit_code = -1
        return parser.finish(exit_code=exit_code, stderr_tail=process.stderr_tail()), exit_code

    def _report_outcome(self, outcome: Outcome | None, *, exit_code: int | None) -> None:
        reason = self.stop_reason
        if reason in (CANCELLED, LEASE_LOST):
            logger.info(_log_line("turn_abandoned", self, reason=reason, exit_code=exit_code))
            if reason == CANCELLED:
                self._confirm_stopped()
            return
        if reason == SHUTDOWN:
            self._report(status="RELEASE", error="The worker shut down.", error_code="shutdown")
            return
        if reason == TIMEOUT:
            self._report(
                status="FAILED",
                error=(
                    f"The turn ran longer than bot {self.turn.bot!r}'s timeout of "
                    f"{self.turn.bot_config.timeout_seconds} s; Baton stopped the executor."
                ),
                error_code=ErrorCode.TIMEOUT,
                outcome=outcome,
            )
            return
        assert outcome is not None
        if outcome.status is OutcomeStatus.COMPLETED:
            result: dict[str, Any] = {"value": outcome.final_text or ""}
            if outcome.commands:
                result["commands"] = list(outcome.commands)
            if outcome.files_changed:
                result["files_changed"] = list(outcome.files_changed)
            self._report(status="COMPLETED", result=result, outcome=outcome)
            return
        status = "RETRY" if outcome.status is OutcomeStatus.RETRYABLE else "FAILED"
        code = outcome.error_code or ErrorCode.EXECUTOR_ERROR
        error = outcome.error.strip() or f"The executor failed ({code}, exit code {exit_code})."
        self._report(
            status=status, error=error[:ERROR_TEXT_CHARS], error_code=code, outcome=outcome
        )

    def _confirm_stopped(self) -> None:
        """Once the executor and every process of the run are gone (the executor has exited
        and `ExecutorProcess.stop` ended what it left), say so: a product's cancel may wait
        for it. Best effort: a cancel that waits in vain says so when its time is up."""
        try:
            self.client.confirm_stopped(subtask_id=self.turn.subtask_id, attempt=self.turn.attempt)
        except BackendError as failure:
            logger.warning(
                _log_line("turn_stop_unconfirmed", self, status=failure.status, code=failure.code)
            )
            return
        logger.info(_log_line("turn_stop_confirmed", self))

    def _report(
        self,
        *,
        status: str,
        result: dict[str, Any] | None = None,
        error: str = "",
        error_code: str = "",
        outcome: Outcome | None = None,
    ) -> None:
        body: dict[str, Any] = {"status": status, "error": error, "error_code": str(error_code)}
        if steers := self.steer_results(unsent_only=False):
            body["steers"] = steers
        if result is not None:
            body["result"] = result
        if outcome is not None:
            if outcome.usage is not None:
                body["usage"] = outcome.usage.to_json()
            body["native_session_id"] = outcome.session_id
            body["session_resumed"] = self.session_resumed
        try:
            self.client.report(subtask_id=self.turn.subtask_id, attempt=self.turn.attempt, **body)
        except (TurnCancelled, LeaseLost) as refused:
            logger.info(_log_line("turn_report_refused", self, code=refused.code))
            if isinstance(refused, TurnCancelled):
                self._confirm_stopped()  # cancelled as it finished: nothing of it runs now
            return
        except BackendError as failure:
            # The lease runs out and the turn is claimed again: nothing is lost.
            logger.error(
                _log_line("turn_report_failed", self, status=failure.status, code=failure.code)
            )
            return
        self.reported = status
        self.timings.recorded = time.monotonic()
        logger.info(
            _log_line(
                "turn_reported",
                self,
                reported=status,
                error_code=str(error_code) or None,
                events=self.progress.event_count,
                **self.timings.as_log(),
            )
        )


def _log_line(event: str, run: TurnRun, **fields: Any) -> str:
    """One JSON log line: ids, counts, codes and timings — never prompt, answer or command text."""
    turn = run.turn
    record = {
        "event": event,
        "task": turn.task_id,
        "subtask": turn.subtask_id,
        "attempt": turn.attempt,
        "executor": turn.executor,
        "kind": turn.kind,
        "run": run.marker,
        **fields,
    }
    return json.dumps(record, sort_keys=True)
