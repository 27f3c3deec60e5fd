"""A run's processes found and signalled through /proc, and the guard that outlives no worker.

How a run's processes are found: each run gets a marker, added to the executor's environment
as `BATON_RUN_ID=<marker>`. Descendants inherit it through fork and exec, whatever sessions or
groups they create, so the run is "every process whose /proc/<pid>/environ holds that exact
entry", plus every member of the executor's own process group (which catches a child that cleared
its environment but did not leave the group). Signals are sent through a pidfd after re-checking
the marker, so a pid that was reused between the scan and the kill is never hit.

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

Linux only: the scan reads /proc. This module never logs environments (they hold API keys);
only pids, counts and the marker.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

logger = logging.getLogger(__name__)

RUN_MARKER_VARIABLE = "BATON_RUN_ID"
WORKER_GUARD_VARIABLE = "BATON_WORKER_GUARD"
MAX_KILL_ROUNDS = 50  # SIGKILL scans before stop() gives up (a fork bomb or a process stuck in D)
_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>

# Pids of the executor processes (and the guard) the worker started and whose Popen has not
# reaped them yet.
# reap_adopted_zombies() never waits on these: reaping one would make Popen report exit code 0.
# A Counter, because a reaped pid can be reused by our next executor before its old entry goes.
owned_lock = threading.Lock()
owned_pids: Counter[int] = Counter()

# The directory that holds the `executors` package: the guard imports this module from there.
_EXECUTORS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GUARD_PROGRAM = (
    "import sys; from executors.process_tree import guard_worker; sys.exit(guard_worker())"
)


def processes_with_marker(marker: str) -> list[int]:
    """Live pids (never zombies, never this process) whose environment holds the run's marker."""
    return scan(marker_entry(marker), group=None)


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
    """Reap zombie children the worker did not start; return how many were reaped.

    Only orphans adopted from executor runs are reaped: never an executor Popen of `ExecutorProcess`
    (its own wait() reports the exit code), and never a zombie in this process's own session,
    which is where children started elsewhere in the worker with plain `subprocess` live (runs
    are started in new sessions, so nothing adopted from a run can be in ours). One waitid()
    call when there is no zombie; a /proc scan only when the first zombie must be left alone.
    """
    if not sys.platform.startswith("linux"):
        return 0
    own_session = os.getsid(0)
    reaped = 0
    with owned_lock:
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
            with owned_lock:
                owned_pids[guard.popen.pid] -= 1
                if owned_pids[guard.popen.pid] <= 0:
                    del owned_pids[guard.popen.pid]
        token = uuid.uuid4().hex
        read_end, write_end = os.pipe()  # both close-on-exec: no executor inherits them
        try:
            with owned_lock:
                popen = subprocess.Popen(  # noqa: S603 - a fixed command line, no shell
                    [sys.executable, "-P", "-c", _GUARD_PROGRAM, token],
                    stdin=read_end,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd="/",
                    env={"PYTHONPATH": _EXECUTORS_ROOT},  # no keys: it needs none
                    start_new_session=True,  # a signal to the worker's group spares it
                )
                owned_pids[popen.pid] += 1  # never reaped as an adopted orphan
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
        alive = scan(entry, group=None)
        if not alive:
            return 0
        for pid in alive:
            signal_if_still(pid, signal.SIGKILL, lambda pid: carries_marker(pid, entry))
        time.sleep(min(0.005 * (kill_round + 1), 0.05))
    return 1 if scan(entry, group=None) else 0


class _Stat(NamedTuple):
    state: str
    ppid: int
    pgrp: int
    session: int


def marker_entry(marker: str) -> bytes:
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


def carries_marker(pid: int, entry: bytes) -> bool:
    environ = _read_proc(pid, "environ")  # empty for zombies and kernel threads
    if not environ or entry not in environ:
        return False
    # Exact entry only: BATON_RUN_ID=abc must not match BATON_RUN_ID=abcd or X_BATON_RUN_ID=abc.
    return entry in environ.split(b"\0")


def in_group(pid: int, group: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat.pgrp == group and stat.state not in ("Z", "X")


def scan(entry: bytes, *, group: int | None) -> list[int]:
    me = os.getpid()
    return [
        pid
        for pid in _proc_pids()
        if pid != me
        and (carries_marker(pid, entry) or (group is not None and in_group(pid, group)))
    ]


def signal_if_still(pid: int, sig: signal.Signals, belongs: Callable[[int], bool]) -> bool:
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
    return pid not in owned_pids and stat is not None and stat.session != own_session


def _reap(pid: int) -> int:
    try:
        reaped_pid, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return 1 if reaped_pid == pid else 0
