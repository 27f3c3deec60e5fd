"""Start an executor process and stop every process it started, however it was detached.

Why this exists: killing an executor's process group is not enough. Codex runs each tool command
in its own session, so a tool's `sleep` outlived its run, re-parented to PID 1. A worker that
runs many turns must be able to end a run completely (cancel, timeout, shutdown) and to check
afterwards that nothing of it is left.

How a run's processes are found and signalled, and the guard that kills them when the worker
ends, is `process_tree`.

Invariant: when `ExecutorProcess.stop()` returns an empty list, no live process carries the run's
marker or belongs to the executor's process group. (Zombies are dead; with `enable_subreaper()`
the worker adopts orphans and `reap_adopted_zombies()` removes their zombies too.)

This module never logs environments (they hold API keys), stdin or stdout; only pids, counts
and the marker.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType

from executors.adapters.base import Launch
from executors.process_tree import (
    MAX_KILL_ROUNDS,
    RUN_MARKER_VARIABLE,
    WORKER_GUARD_VARIABLE,
    carries_marker,
    in_group,
    marker_entry,
    owned_lock,
    owned_pids,
    reap_adopted_zombies,
    scan,
    signal_if_still,
    worker_guard_token,
)

logger = logging.getLogger(__name__)

STDERR_TAIL_BYTES = 64 * 1024

_READ_CHUNK_BYTES = 256 * 1024
_POLL_MS = 50  # how often blocked pipe threads look at whether the run is over
_GRACE_POLL_SECONDS = 0.025
_THREAD_JOIN_SECONDS = 1.0  # pipe threads end within one poll interval of the run being over


class ExecutorProcess:
    """One executor run: its process started with a marker, its output read, its tree stopped.

    Threads: a writer feeds stdin (it may be larger than a pipe buffer, so writing must never
    wait for stdout to be read) and a reader keeps the last 64 KiB of stderr. `lines()` is read
    by one thread; `stop()` may be called from any thread, any number of times, meanwhile.

    Stdin is written in order from a queue: the launch's bytes first, then whatever an
    interactive run's parser writes (`write_stdin`) until it closes it (`close_stdin`). A run
    that is not interactive closes stdin after the launch's bytes.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        marker: str,
        stdin: bytes,
        interactive: bool = False,
    ) -> None:
        """Use `ExecutorProcess.start()`; this only wires an already started Popen."""
        self._popen = popen
        self.pid: int = popen.pid
        self.marker = marker
        self._entry = marker_entry(marker)
        self._stopped = threading.Event()  # set when stop() has finished: the run is over
        self._stop_lock = threading.Lock()
        self._owned_released = False
        # Group members without the marker count as the run's only until stop() has ended them:
        # after that the group id is free and could, in time, name an unrelated group.
        self._group_active = True
        self._stderr_lock = threading.Lock()
        self._stderr_tail = bytearray()
        self._lines_started = False
        self._stdin_lock = threading.Lock()
        self._stdin_queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._stdin_closed = False
        self.write_stdin(stdin)
        if not interactive:
            self.close_stdin()
        self._stdin_thread = threading.Thread(
            target=self._write_stdin, name=f"baton-stdin-{self.pid}", daemon=True
        )
        self._stderr_thread = threading.Thread(
            target=self._drain_stderr, name=f"baton-stderr-{self.pid}", daemon=True
        )
        self._stdin_thread.start()
        self._stderr_thread.start()

    @classmethod
    def start(cls, launch: Launch, *, marker: str) -> ExecutorProcess:
        """Start `launch` in a new session with `BATON_RUN_ID=<marker>` added to its environment.

        The marker must be unique to the run (a uuid or the run's id): stop() ends every process
        that carries it.
        """
        marker_entry(marker)  # validate before starting anything
        # The guard runs before the executor starts, so no moment leaves it unwatched.
        env = {
            **launch.env,
            RUN_MARKER_VARIABLE: marker,
            WORKER_GUARD_VARIABLE: worker_guard_token(),
        }
        # Registered under the lock: a child that exits at once must not be reaped as an orphan
        # between its fork and its registration.
        with owned_lock:
            # argv comes from an adapter's fixed command line, never through a shell.
            popen = subprocess.Popen(  # noqa: S603
                launch.argv,
                cwd=launch.cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            owned_pids[popen.pid] += 1
        logger.debug(
            "started executor %s pid %d for run %s",
            os.path.basename(launch.argv[0]),
            popen.pid,
            marker,
        )
        return cls(popen, marker=marker, stdin=launch.stdin, interactive=launch.interactive)

    def write_stdin(self, data: bytes) -> bool:
        """Queue `data` for stdin after what was queued before; False once stdin is closed."""
        with self._stdin_lock:
            if self._stdin_closed:
                return False
            if data:
                self._stdin_queue.put(data)
            return True

    def close_stdin(self) -> None:
        """Close stdin once everything queued before is written."""
        with self._stdin_lock:
            if self._stdin_closed:
                return
            self._stdin_closed = True
            self._stdin_queue.put(None)

    def lines(self) -> Iterator[str]:
        """Stdout lines as they arrive, decoded as UTF-8 (errors replaced), without the newline.

        Ends at EOF, once the executor process has exited and its output is drained (a
        background descendant holding stdout open does not keep it going), or once stop() has
        finished. Call it once; a second call yields nothing.
        """
        if self._lines_started:
            return
        self._lines_started = True
        pipe = self._popen.stdout
        assert pipe is not None  # started with stdout=PIPE
        pending = bytearray()
        try:
            for chunk in _pipe_chunks(pipe.fileno(), self._run_over):
                # Split each chunk once: a many-MB line costs linear time, not quadratic.
                parts = chunk.split(b"\n")
                if len(parts) == 1:
                    pending += chunk
                    continue
                pending += parts[0]
                yield pending.decode("utf-8", errors="replace")
                for part in parts[1:-1]:
                    yield part.decode("utf-8", errors="replace")
                pending = bytearray(parts[-1])
            if pending:
                yield pending.decode("utf-8", errors="replace")
        finally:
            pipe.close()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running at timeout.

        Once it returns a code, stdin writing has ended and `stderr_tail()` is complete.
        """
        try:
            code = self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._release_owned()
        # Both threads end within one poll interval of the exit (see _pipe_chunks).
        self._stdin_thread.join(timeout=_THREAD_JOIN_SECONDS)
        self._stderr_thread.join(timeout=_THREAD_JOIN_SECONDS)
        return code

    def stderr_tail(self) -> str:
        """The last 64 KiB of stderr as UTF-8 (a character cut at the start is replaced)."""
        with self._stderr_lock:
            return self._stderr_tail.decode("utf-8", errors="replace")

    def alive_pids(self) -> list[int]:
        """Live pids of this run: marker carriers and process group members (never zombies)."""
        return sorted(scan(self._entry, group=self.pid if self._group_active else None))

    def stop(self, grace_seconds: float = 5.0) -> list[int]:
        """End every process of the run; return the pids still alive (normally none).

        SIGTERM to all, up to `grace_seconds` for them to exit (newcomers get SIGTERM too), then
        SIGKILL to whatever is left, rescanning until nothing is (at most MAX_KILL_ROUNDS, for a
        process that forks while being killed). Then the executor is reaped, adopted zombies are
        reaped and lines() ends. Safe to call again and from another thread than the reader.
        """
        with self._stop_lock:
            deadline = time.monotonic() + grace_seconds
            self._signal_group(signal.SIGTERM)
            terminated: set[int] = set()
            while True:
                alive = set(self.alive_pids())
                for pid in alive - terminated:
                    signal_if_still(pid, signal.SIGTERM, self._belongs)
                terminated |= alive
                if not alive or time.monotonic() >= deadline:
                    break
                time.sleep(_GRACE_POLL_SECONDS)
            survivors = self._kill_until_gone()
            try:
                self._popen.wait(timeout=1)
                self._release_owned()
            except subprocess.TimeoutExpired:
                pass  # the executor itself survived SIGKILL: reported through survivors
            if not survivors:
                self._group_active = False
            self._stopped.set()
            reap_adopted_zombies()
        # The normal end of every run signals nothing; only a real stop is worth a line.
        logger.log(
            logging.INFO if terminated or survivors else logging.DEBUG,
            "stopped run %s: %d processes signalled, %d left alive",
            self.marker,
            len(terminated),
            len(survivors),
        )
        return survivors

    def __enter__(self) -> ExecutorProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _kill_until_gone(self) -> list[int]:
        for kill_round in range(MAX_KILL_ROUNDS):
            alive = self.alive_pids()
            if not alive:
                return []
            self._signal_group(signal.SIGKILL)
            for pid in alive:
                signal_if_still(pid, signal.SIGKILL, self._belongs)
            # A killed process shows its environment until it has released its memory.
            time.sleep(min(0.005 * (kill_round + 1), 0.05))
        survivors = self.alive_pids()
        if survivors:
            logger.warning(
                "run %s: %d processes survived %d SIGKILL rounds",
                self.marker,
                len(survivors),
                MAX_KILL_ROUNDS,
            )
        return survivors

    def _signal_group(self, sig: signal.Signals) -> None:
        # Only while Popen has not reaped the executor: its unreaped pid keeps the group id from
        # being reused, so the group cannot be someone else's.
        if self._popen.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _belongs(self, pid: int) -> bool:
        if carries_marker(pid, self._entry):
            return True
        return self._group_active and in_group(pid, self.pid)

    def _run_over(self) -> bool:
        if self._stopped.is_set():
            return True
        exited = self._popen.poll() is not None
        if exited:
            self._release_owned()
        return exited

    def _release_owned(self) -> None:
        with owned_lock:
            if self._owned_released:
                return
            self._owned_released = True
            owned_pids[self.pid] -= 1
            if owned_pids[self.pid] <= 0:
                del owned_pids[self.pid]

    def _write_stdin(self) -> None:
        pipe = self._popen.stdin
        assert pipe is not None  # started with stdin=PIPE
        try:
            fd = pipe.fileno()
            # Non-blocking with poll: a child that never reads must not pin this thread forever.
            os.set_blocking(fd, False)
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            while not self._run_over():
                try:
                    data = self._stdin_queue.get(timeout=_POLL_MS / 1000)
                except queue.Empty:
                    continue
                if data is None or not self._write_all(fd, poller, data):
                    return
        finally:
            with self._stdin_lock:
                self._stdin_closed = True
            with contextlib.suppress(OSError):
                pipe.close()

    def _write_all(self, fd: int, poller: select.poll, data: bytes) -> bool:
        """Write `data` whole; False when the run ended or the child closed its stdin."""
        view = memoryview(data)
        while view:
            if self._run_over():
                return False
            if not poller.poll(_POLL_MS):
                continue
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                continue
            except BrokenPipeError:
                return False  # the child exited or closed stdin before reading it all
            view = view[written:]
        return True

    def _drain_stderr(self) -> None:
        pipe = self._popen.stderr
        assert pipe is not None  # started with stderr=PIPE
        try:
            for chunk in _pipe_chunks(pipe.fileno(), self._run_over):
                with self._stderr_lock:
                    self._stderr_tail += chunk
                    del self._stderr_tail[:-STDERR_TAIL_BYTES]
        finally:
            pipe.close()


def _pipe_chunks(fd: int, run_over: Callable[[], bool]) -> Iterator[bytes]:
    """Chunks read from `fd` until EOF, or until the run is over and the pipe is drained.

    Once the run is over (the executor exited or stop() finished), only what the pipe held at
    that moment is still the executor's: at most one pipe capacity. Reading no more than that
    keeps a descendant that escaped the kill and writes forever from holding a reader open.
    """
    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    budget: int | None = None  # bytes left to drain once the run is over
    while True:
        if budget is None and run_over():
            budget = _pipe_capacity(fd)
        if budget is not None and budget <= 0:
            return
        if not poller.poll(_POLL_MS if budget is None else 0):
            if budget is not None:
                return
            continue
        try:
            chunk = os.read(
                fd, _READ_CHUNK_BYTES if budget is None else min(budget, _READ_CHUNK_BYTES)
            )
        except BlockingIOError:
            continue
        if not chunk:
            return
        if budget is not None:
            budget -= len(chunk)
        yield chunk


def _pipe_capacity(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (AttributeError, OSError):
        return 1024 * 1024  # the default /proc/sys/fs/pipe-max-size
