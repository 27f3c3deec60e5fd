"""The worker loop: claim turns for free slots, run each in its own thread, watch the claims.

The main thread asks the backend for up to `free slots` turns and starts a `TurnRun` thread
for each. A supervisor thread does what must happen while runs are going: it checks every claim
about twice a second with one batched heartbeat — which renews leases when due, is how a cancel
reaches a run within the 2 s the product expects, and carries every running turn's buffered
progress, so a worker sends one request per interval however many turns it runs — and stops
runs that outlive their bot's timeout.

Before its first dispatch the worker waits, quietly, for the backend to answer its health check
(`wait_for_backend`): a worker may start before the server beside it answers. A signal during
that wait ends it with nothing claimed.

Shutdown (SIGTERM or SIGINT): the worker stops claiming — a dispatch waiting at the backend is
hung up on at once, so a stop never waits for a long poll to end — lets running turns finish
for the grace period, then stops the rest and releases them to the backend (RELEASE: they go
back to pending at once for another worker). A second signal skips the grace period. `--once`
ends the loop when nothing is pending for the worker's kinds and nothing is running.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Mapping
from types import FrameType

from executors.adapters.base import ExecutorAdapter, ModelEndpoint
from executors.client import (
    BackendClient,
    BackendError,
    BackendUnavailable,
    DispatchAbandoned,
    LeaseLost,
    TurnCancelled,
)
from executors.config import WorkerSettings
from executors.payloads import DispatchedTurn
from executors.process_tree import enable_subreaper, reap_adopted_zombies
from executors.progress import HEARTBEAT_PROGRESS_BYTES, ProgressBatch
from executors.runner import CANCELLED, LEASE_LOST, SHUTDOWN, TIMEOUT, TurnRun

logger = logging.getLogger("baton.worker")

SUPERVISOR_TICK_SECONDS = 0.1


class Worker:
    def __init__(
        self,
        *,
        settings: WorkerSettings,
        client: BackendClient,
        adapters: Mapping[str, ExecutorAdapter],
        endpoints: Mapping[str, ModelEndpoint],
    ) -> None:
        self.settings = settings
        self.client = client
        self.adapters = dict(adapters)
        self.endpoints = dict(endpoints)
        self._runs: dict[int, tuple[TurnRun, threading.Thread]] = {}
        self._runs_lock = threading.Lock()
        self._wake = threading.Event()  # a slot was freed, or shutdown began
        self._stopping = threading.Event()
        self._hurry = threading.Event()  # second signal: no grace period
        self._finished = threading.Event()
        self.turns_run = 0

    # -- lifecycle --------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping.is_set():
            self._hurry.set()
        self.stop()

    def stop(self) -> None:
        """Begin a graceful shutdown (safe from any thread and from signal handlers)."""
        self._stopping.set()
        self.client.stop_dispatching()
        self._wake.set()

    def wait_for_backend(self) -> bool:
        """Wait until the backend answers; False when the worker was stopped first (the
        client is then closed: `run` is not to follow)."""
        if self.client.wait_until_up(stop=self._stopping):
            return True
        self.client.close()
        return False

    def run(self) -> int:
        """Serve until stopped (or, with --once, until idle). Returns the process exit code."""
        enable_subreaper()
        self.settings.state_root.mkdir(parents=True, exist_ok=True)
        supervisor = threading.Thread(target=self._supervise, name="baton-supervisor", daemon=True)
        supervisor.start()
        logger.info(
            json.dumps(
                {
                    "event": "worker_started",
                    "worker_id": self.client.worker_id,
                    "kinds": list(self.settings.kinds),
                    "slots": self.settings.slots,
                }
            )
        )
        try:
            code = self._claim_loop()
        finally:
            self._shut_down()
            self._finished.set()
            supervisor.join(timeout=5)
            self.client.close()
        logger.info(json.dumps({"event": "worker_stopped", "turns_run": self.turns_run}))
        return code

    # -- claiming ---------------------------------------------------------------------------

    def _claim_loop(self) -> int:
        """Ask for turns while slots are free. After an answer with nothing in it, the next
        dispatch waits at the backend (long polling) instead of the worker sleeping and asking
        again; `--once` never waits, since it ends when nothing is pending."""
        settings = self.settings
        dispatch_wait = settings.dispatch_wait_seconds if not settings.once else 0.0
        wait_now = 0.0
        while not self._stopping.is_set():
            free = settings.slots - self._running_count()
            wait = settings.poll_seconds
            if free > 0:
                try:
                    dispatch = self.client.dispatch(
                        kinds=settings.kinds, limit=free, wait_seconds=wait_now
                    )
                except DispatchAbandoned:
                    break  # `stop` hung up on it; the backend claims nothing for a worker gone
                except BackendUnavailable as error:
                    logger.warning(
                        json.dumps({"event": "dispatch_unavailable", "error": str(error)})
                    )
                    self._wake.wait(settings.poll_seconds)
                    self._wake.clear()
                    continue
                except BackendError as error:
                    if wait_now and error.status == 400:
                        # A backend whose limit is below our wait: poll as before.
                        logger.warning(json.dumps({"event": "dispatch_wait_refused"}))
                        dispatch_wait = wait_now = 0.0
                        continue
                    # Not transient: a wrong URL, token or version. Say so and stop.
                    hint = {
                        401: "is the token right?",
                        403: "is it a worker account's token (manage.py create_worker)?",
                        404: "is BATON_URL the Baton backend's base URL?",
                    }.get(error.status or 0, "")
                    logger.error("the backend refused to dispatch: %s %s", error, hint)
                    return 2
                if self._stopping.is_set() and dispatch.turns:
                    # Answered just as the worker stopped: give them back at once.
                    self._release(dispatch.turns)
                    break
                for turn in dispatch.turns:
                    self._start(turn)
                if dispatch.turns:
                    wait_now = 0.0
                    continue  # there may be more
                idle = self._running_count() == 0 and dispatch.next_ready_in_seconds is None
                if settings.once and idle:
                    return 0
                if dispatch_wait:
                    # The backend waited (or, the first time, will): ask again at once.
                    wait_now = dispatch_wait
                    continue
                if dispatch.next_ready_in_seconds is not None:
                    wait = min(wait, max(0.05, dispatch.next_ready_in_seconds))
            self._wake.wait(wait)
            self._wake.clear()
        return 0

    def _release(self, turns: list[DispatchedTurn]) -> None:
        for turn in turns:
            try:
                self.client.report(
                    subtask_id=turn.subtask_id,
                    attempt=turn.attempt,
                    status="RELEASE",
                    error="The worker shut down.",
                    error_code="shutdown",
                )
            except BackendError as error:  # its lease runs out and Baton requeues it then
                logger.warning(
                    json.dumps(
                        {"event": "release_failed", "subtask": turn.subtask_id, "error": str(error)}
                    )
                )

    def _start(self, turn: DispatchedTurn) -> None:
        run = TurnRun(
            turn=turn,
            adapter=self.adapters[turn.executor],
            client=self.client,
            endpoint=self.endpoints[turn.executor],
            workspace_root=self.settings.workspace_root,
            state_root=self.settings.state_root,
            passthrough_env=self.settings.passthrough_env,
            on_done=self._run_done,
        )
        thread = threading.Thread(target=run.run, name=f"baton-turn-{turn.subtask_id}", daemon=True)
        with self._runs_lock:
            self._runs[turn.subtask_id] = (run, thread)
        thread.start()

    def _run_done(self, run: TurnRun) -> None:
        with self._runs_lock:
            self._runs.pop(run.turn.subtask_id, None)
            self.turns_run += 1
        reap_adopted_zombies()
        self._wake.set()

    def _running_count(self) -> int:
        with self._runs_lock:
            return len(self._runs)

    def _current_runs(self) -> list[TurnRun]:
        with self._runs_lock:
            return [run for run, _ in self._runs.values()]

    # -- shutdown ---------------------------------------------------------------------------

    def _shut_down(self) -> None:
        deadline = time.monotonic() + self.settings.grace_seconds
        while self._running_count() and time.monotonic() < deadline and not self._hurry.is_set():
            self._wake.wait(0.1)
            self._wake.clear()
        for run in self._current_runs():
            run.request_stop(SHUTDOWN)
        with self._runs_lock:
            threads = [thread for _, thread in self._runs.values()]
        for thread in threads:
            thread.join(timeout=30)

    # -- supervision ------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Until the worker has finished: timeouts, heartbeats, cancels and steers. Nothing
        one round meets ends the thread — without it no lease is renewed and no cancel or
        timeout reaches a run — so a round that fails is logged (its error's type only: its
        text may quote what an executor said) and the next one goes on."""
        next_check = 0.0
        while not self._finished.is_set():
            now = time.monotonic()
            try:
                runs = self._current_runs()
                for run in runs:
                    if now > run.deadline:
                        run.request_stop(TIMEOUT)
                if runs and now >= next_check:
                    next_check = now + self.settings.claim_check_seconds
                    self._check_claims(runs, now)
            except Exception as error:  # noqa: BLE001 - the supervisor must outlive any round
                logger.error(
                    json.dumps({"event": "supervisor_round_failed", "error_type": _type(error)})
                )
            self._finished.wait(SUPERVISOR_TICK_SECONDS)

    def _check_claims(self, runs: list[TurnRun], now: float) -> None:
        """One batched heartbeat for every claim, carrying each running turn's progress; a
        batch too large to ride along, or refused for its offset, goes as a post of its own."""
        carried: list[tuple[TurnRun, ProgressBatch]] = []
        alone: list[tuple[TurnRun, ProgressBatch]] = []
        room = HEARTBEAT_PROGRESS_BYTES
        for run in runs:
            if run.stop_reason is not None or run.executor_done:
                continue  # the result carries the answer
            batch = run.progress.take(now=now)
            if batch is None:
                continue
            size = batch.json_bytes()
            if size > room:
                alone.append((run, batch))
                continue
            room -= size
            carried.append((run, batch))
        steers = {
            run.claim: results for run in runs if (results := run.steer_results(unsent_only=True))
        }
        try:
            states = self.client.heartbeat(
                [run.claim for run in runs],
                progress={run.claim: batch.to_json() for run, batch in carried},
                steers=steers,
            )
        except Exception as error:  # noqa: BLE001 - the next heartbeat sends the progress again
            status = error.status if isinstance(error, BackendError) else None
            logger.warning(
                json.dumps(
                    {"event": "heartbeat_failed", "status": status, "error_type": _type(error)}
                )
            )
            for run, batch in carried:
                run.progress.refused(batch)
            states = []
        by_claim = {(state.subtask_id, state.attempt): state for state in states}
        for run in runs:
            state = by_claim.get(run.claim)
            if state is not None and run.claim in steers:
                run.steer_results_sent(steers[run.claim])
            if state is not None and state.steers:
                run.take_steers(state.steers)
            if state is not None and state.state == "cancelled":
                run.request_stop(CANCELLED)
            elif state is not None and state.state == "lease_lost":
                run.request_stop(LEASE_LOST)
        if states:
            for run, batch in carried:
                state = by_claim.get(run.claim)
                again = run.progress.settle(batch, None if state is None else state.progress)
                if again is not None:
                    alone.append((run, again))
        for run, batch in alone:
            if run.stop_reason is None:
                self._post_progress(run, batch)

    def _post_progress(self, run: TurnRun, batch: ProgressBatch) -> None:
        try:
            run.progress.deliver(
                batch,
                send=lambda batch: self.client.progress(
                    subtask_id=run.turn.subtask_id,
                    attempt=run.turn.attempt,
                    progress=batch.to_json(),
                ),
            )
        except TurnCancelled:
            run.request_stop(CANCELLED)
        except LeaseLost:
            run.request_stop(LEASE_LOST)
        except BackendError as error:
            # Progress is best effort; the result carries the answer. The next post sends
            # the whole partial text.
            logger.warning(
                json.dumps(
                    {
                        "event": "progress_failed",
                        "subtask": run.turn.subtask_id,
                        "status": error.status,
                    }
                )
            )


def _type(error: BaseException) -> str:
    """What a log line says of an error: its type's name, never its text."""
    return type(error).__name__
