"""Start an executor process and stop every process it started, however it was detached.

Why this exists: killing an executor's process group is not enough. Codex runs each tool command
in its own session, so a tool's `sleep` outlived its run, re-parented to PID 1. A worker that
runs many turns must be able to end a run completely (cancel, timeout, shutdown) and to check
afterwards that nothing of it is left.

How a run's processes are found: each run gets a marker, added to the executor's environment
as `BATON_RUN_ID=<marker>`. Descendants inherit it through fork and exec, whatever sessions or
groups they create, so the run is "every process whose /proc/<pid>/environ holds that exact
entry", plus every member of the executor's own process group (which catches a child that cleared
its environment but did not leave the group). Signals are sent through a pidfd after re-checking
the marker, so a pid that was reused between the scan and the kill is never hit.

Invariant: when `ExecutorProcess.stop()` returns an empty list, no live process carries the run's
marker or belongs to the executor's process group. (Zombies are dead; with `enable_subreaper()`
the worker adopts orphans and `reap_adopted_zombies()` removes their zombies too.)

An executor never outlives its worker, however the worker ends (kill -9 included): a worker that
cannot report a turn must not go on spending model calls on it. Every executor also carries
`BATON_WORKER_GUARD=<token>`, one token per worker process, and the first executor start spawns a
guard: a small process in its own session whose stdin is a pipe only the worker holds the write
end of (close-on-exec, so no executor inherits it). The kernel closes that end when the worker
dies; the guard reads EOF, SIGKILLs every process carrying the token — the executors and their
whole trees, tool commands in their own sessions included, since the entry is inherited through
fork and exec — and exits. `PR_SET_PDEATHSIG` alone would not do: it reaches only the direct
child, fires when the forking *thread* ends rather than the process, and needs a `preexec_fn`,
which is unsafe in the threaded worker. A process that clears its environment escapes the guard
as it escapes the marker scan.

Linux only: the scan reads /proc. This module never logs environments (they hold API keys),
stdin or stdout; only pids, counts and the marker.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import NamedTuple

from executors.adapters.base import Launch

logger = logging.getLogger(__name__)

RUN_MARKER_VARIABLE = "BATON_RUN_ID"
WORKER_GUARD_VARIABLE = "BATON_WORKER_GUARD"
STDERR_TAIL_BYTES = 64 * 1024
MAX_KILL_ROUNDS = 50  # SIGKILL scans before stop() gives up (a fork bomb or a process stuck in D)

_READ_CHUNK_BYTES = 256 * 1024
_POLL_MS = 50  # how often blocked pipe threads look at whether the run is over
_GRACE_POLL_SECONDS = 0.025
_THREAD_JOIN_SECONDS = 1.0  # pipe threads end within one poll interval of the run being over
_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>

# Pids of the executor processes this module started and whose Popen has not reaped them yet.
# reap_adopted_zombies() never waits on these: reaping one would make Popen report exit code 0.
# A Counter, because a reaped pid can be reused by our next executor before its old entry goes.
_owned_lock = threading.Lock()
_owned_pids: Counter[int] = Counter()

# The directory that holds the `executors` package: the guard imports this module from there.
_EXECUTORS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GUARD_PROGRAM = "import sys; from executors.process import guard_worker; sys.exit(guard_worker())"


def processes_with_marker(marker: str) -> list[int]:
    """Live pids (never zombies, never this process) whose environment holds the run's marker."""
    return _scan(_marker_entry(marker), group=None)


def enable_subreaper() -> bool:
    """Make this process adopt orphaned descendants instead of PID 1 (Linux); False if not.

    It affects the whole process for its lifetime: call it once at worker start, and pair it with
    `reap_adopted_zombies()` (which `stop()` calls) so adopted orphans do not stay zombies.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    # prctl reads its extra arguments as unsigned longs: pass them as such, not as C ints.
    unused = ctypes.c_ulong(0)
    result = libc.prctl(
        ctypes.c_int(_PR_SET_CHILD_SUBREAPER), ctypes.c_ulong(1), unused, unused, unused
    )
    if result != 0:
        logger.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: errno %d", ctypes.get_errno())
        return False
    return True


def reap_adopted_zombies() -> int:
    """Reap zombie children this module did not start; return how many were reaped.

    Only orphans adopted from executor runs are reaped: never an executor Popen of this module
    (its own wait() reports the exit code), and never a zombie in this process's own session,
    which is where children started elsewhere in the worker with plain `subprocess` live (runs
    are started in new sessions, so nothing adopted from a run can be in ours). One waitid()
    call when there is no zombie; a /proc scan only when the first zombie must be left alone.
    """
    if not sys.platform.startswith("linux"):
        return 0
    own_session = os.getsid(0)
    reaped = 0
    with _owned_lock:
        while True:
            try:
                # WNOWAIT: look at a zombie child without reaping it.
                peek = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return reaped  # no children at all
            if peek is None or peek.si_pid == 0:
                return reaped
            if not _may_reap(peek.si_pid, _proc_stat(peek.si_pid), own_session):
                break
            if not _reap(peek.si_pid):
                break  # raced with another waiter: let the scan below sort it out
            reaped += 1
        # The kernel keeps offering a zombie we must not reap: find the others by their parent.
        me = os.getpid()
        for pid in _proc_pids():
            stat = _proc_stat(pid)
            is_zombie_child = stat is not None and stat.ppid == me and stat.state == "Z"
            if is_zombie_child and _may_reap(pid, stat, own_session):
                reaped += _reap(pid)
    return reaped


class _Guard(NamedTuple):
    """This worker process's guard: its Popen, the pipe end it watches, the token it kills by."""

    owner: int  # the pid that started it (a forked copy of the worker needs its own)
    popen: subprocess.Popen[bytes]
    write_end: int
    token: str


_guard_lock = threading.Lock()
_guard: _Guard | None = None


def worker_guard_token() -> str:
    """The token of this process's guard, started first if none runs (see the module doc)."""
    global _guard
    with _guard_lock:
        guard = _guard
        if guard is not None and guard.owner == os.getpid() and guard.popen.poll() is None:
            return guard.token
        if guard is not None and guard.owner == os.getpid():
            # It died (killed?), and poll() reaped it: a new one watches a new pipe.
            os.close(guard.write_end)
            with _owned_lock:
                _owned_pids[guard.popen.pid] -= 1
                if _owned_pids[guard.popen.pid] <= 0:
                    del _owned_pids[guard.popen.pid]
        token = uuid.uuid4().hex
        read_end, write_end = os.pipe()  # both close-on-exec: no executor inherits them
        try:
            with _owned_lock:
                popen = subprocess.Popen(  # noqa: S603 - a fixed command line, no shell
                    [sys.executable, "-P", "-c", _GUARD_PROGRAM, token],
                    stdin=read_end,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd="/",
                    env={"PYTHONPATH": _EXECUTORS_ROOT},  # no keys: it needs none
                    start_new_session=True,  # a signal to the worker's group spares it
                )
                _owned_pids[popen.pid] += 1  # never reaped as an adopted orphan
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        _guard = _Guard(owner=os.getpid(), popen=popen, write_end=write_end, token=token)
        logger.debug("started the executor guard, pid %d", popen.pid)
        return token


def guard_worker() -> int:
    """The guard's program: wait for the worker to end, then kill every process of its runs.

    Runs in the guard process (`worker_guard_token` starts it with the token as argv[1] and the
    pipe as stdin). Returns 0 once none is left, 1 if some survived MAX_KILL_ROUNDS.
    """
    entry = _entry(WORKER_GUARD_VARIABLE, sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while os.read(0, 4096):  # the worker never writes: this waits for EOF, its end
            pass
    for kill_round in range(MAX_KILL_ROUNDS):
        alive = _scan(entry, group=None)
        if not alive:
            return 0
        for pid in alive:
            _signal_if_still(pid, signal.SIGKILL, lambda pid: _carries_marker(pid, entry))
        time.sleep(min(0.005 * (kill_round + 1), 0.05))
    return 1 if _scan(entry, group=None) else 0


class ExecutorProcess:
    """One executor run: its process started with a marker, its output read, its tree stopped.

    Threads: a writer feeds stdin (it may be larger than a pipe buffer, so writing must never
    wait for stdout to be read) and a reader keeps the last 64 KiB of stderr. `lines()` is read
    by one thread; `stop()` may be called from any thread, any number of times, meanwhile.
    """

    def __init__(self, popen: subprocess.Popen[bytes], *, marker: str, stdin: bytes) -> None:
        """Use `ExecutorProcess.start()`; this only wires an already started Popen."""
        self._popen = popen
        self.pid: int = popen.pid
        self.marker = marker
        self._entry = _marker_entry(marker)
        self._stopped = threading.Event()  # set when stop() has finished: the run is over
        self._stop_lock = threading.Lock()
        self._owned_released = False
        # Group members without the marker count as the run's only until stop() has ended them:
        # after that the group id is free and could, in time, name an unrelated group.
        self._group_active = True
        self._stderr_lock = threading.Lock()
        self._stderr_tail = bytearray()
        self._lines_started = False
        self._stdin_thread = threading.Thread(
            target=self._write_stdin, args=(stdin,), name=f"baton-stdin-{self.pid}", daemon=True
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
        _marker_entry(marker)  # validate before starting anything
        # The guard runs before the executor starts, so no moment leaves it unwatched.
        env = {
            **launch.env,
            RUN_MARKER_VARIABLE: marker,
            WORKER_GUARD_VARIABLE: worker_guard_token(),
        }
        # Registered under the lock: a child that exits at once must not be reaped as an orphan
        # between its fork and its registration.
        with _owned_lock:
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
            _owned_pids[popen.pid] += 1
        logger.debug(
            "started executor %s pid %d for run %s",
            os.path.basename(launch.argv[0]),
            popen.pid,
            marker,
        )
        return cls(popen, marker=marker, stdin=launch.stdin)

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
        return sorted(_scan(self._entry, group=self.pid if self._group_active else None))

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
                    _signal_if_still(pid, signal.SIGTERM, self._belongs)
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
                _signal_if_still(pid, signal.SIGKILL, self._belongs)
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
        if _carries_marker(pid, self._entry):
            return True
        return self._group_active and _in_group(pid, self.pid)

    def _run_over(self) -> bool:
        if self._stopped.is_set():
            return True
        exited = self._popen.poll() is not None
        if exited:
            self._release_owned()
        return exited

    def _release_owned(self) -> None:
        with _owned_lock:
            if self._owned_released:
                return
            self._owned_released = True
            _owned_pids[self.pid] -= 1
            if _owned_pids[self.pid] <= 0:
                del _owned_pids[self.pid]

    def _write_stdin(self, data: bytes) -> None:
        pipe = self._popen.stdin
        assert pipe is not None  # started with stdin=PIPE
        try:
            fd = pipe.fileno()
            # Non-blocking with poll: a child that never reads must not pin this thread forever.
            os.set_blocking(fd, False)
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            view = memoryview(data)
            while view and not self._run_over():
                if not poller.poll(_POLL_MS):
                    continue
                try:
                    written = os.write(fd, view)
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    return  # the child exited or closed stdin before reading it all: its choice
                view = view[written:]
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

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


class _Stat(NamedTuple):
    state: str
    ppid: int
    pgrp: int
    session: int


def _marker_entry(marker: str) -> bytes:
    return _entry(RUN_MARKER_VARIABLE, marker)


def _entry(variable: str, value: str) -> bytes:
    if not value or "\0" in value:
        raise ValueError("a run marker must be a non-empty string without NUL characters")
    return f"{variable}={value}".encode()


def _proc_pids() -> list[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def _read_proc(pid: int, name: str) -> bytes | None:
    # os.open/os.read: about half the cost of open() per file, which matters across /proc.
    try:
        fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # vanished, or not ours to read
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _proc_stat(pid: int) -> _Stat | None:
    data = _read_proc(pid, "stat")
    if not data:
        return None
    # The command name is in parentheses and may itself contain spaces and parentheses.
    fields = data[data.rindex(b")") + 2 :].split()
    return _Stat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]))


def _carries_marker(pid: int, entry: bytes) -> bool:
    environ = _read_proc(pid, "environ")  # empty for zombies and kernel threads
    if not environ or entry not in environ:
        return False
    # Exact entry only: BATON_RUN_ID=abc must not match BATON_RUN_ID=abcd or X_BATON_RUN_ID=abc.
    return entry in environ.split(b"\0")


def _in_group(pid: int, group: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat.pgrp == group and stat.state not in ("Z", "X")


def _scan(entry: bytes, *, group: int | None) -> list[int]:
    me = os.getpid()
    return [
        pid
        for pid in _proc_pids()
        if pid != me
        and (_carries_marker(pid, entry) or (group is not None and _in_group(pid, group)))
    ]


def _signal_if_still(pid: int, sig: signal.Signals, belongs: Callable[[int], bool]) -> bool:
    """Send `sig` to `pid` only if it is still one of the run's; True if it was sent.

    The pidfd is opened first and the check made after: if the pid is the same process when
    checked, the pidfd refers to it, and if that process died meanwhile the send fails (ESRCH)
    instead of reaching whoever reused the pid.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        pidfd = None  # no pidfds (kernel before 5.3): accept the small reuse race
    try:
        if not belongs(pid):
            return False
        if pidfd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _may_reap(pid: int, stat: _Stat | None, own_session: int) -> bool:
    return pid not in _owned_pids and stat is not None and stat.session != own_session


def _reap(pid: int) -> int:
    try:
        reaped_pid, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return 1 if reaped_pid == pid else 0


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
