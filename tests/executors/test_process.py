"""Executor processes: whole-tree stop, marker scan, pipes and adopted zombies, with real processes.

No database: these tests start bash and python children and look at /proc.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from executors.adapters.base import Launch
from executors.process import STDERR_TAIL_BYTES, ExecutorProcess
from executors.process_tree import processes_with_marker, reap_adopted_zombies

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

REPO_ROOT = Path(__file__).resolve().parents[2]
WATCHDOG_SECONDS = 10.0

# Forks, starts a new session, forks again and sleeps: the classic daemon, outside the run's
# session and process group, re-parented away from the run as soon as its parents exit.
DOUBLE_FORK_DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open("daemon.pid.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace("daemon.pid.tmp", "daemon.pid")
        time.sleep(60)
    os._exit(0)
os.wait()
"""


def _launch(tmp_path: Path, *argv: str, stdin: bytes = b"") -> Launch:
    return Launch(argv=list(argv), env={"PATH": os.environ["PATH"]}, cwd=tmp_path, stdin=stdin)


def _bash(tmp_path: Path, script: str, stdin: bytes = b"") -> Launch:
    return _launch(tmp_path, "bash", "-c", script, stdin=stdin)


@contextmanager
def _running(launch: Launch) -> Iterator[ExecutorProcess]:
    """A started run that a watchdog stops if a test hangs, and that is always stopped after."""
    proc = ExecutorProcess.start(launch, marker=uuid.uuid4().hex)
    watchdog = threading.Timer(WATCHDOG_SECONDS, proc.stop, kwargs={"grace_seconds": 0})
    watchdog.start()
    try:
        yield proc
    finally:
        watchdog.cancel()
        proc.stop(grace_seconds=0)


def _read_pid_file(path: Path) -> int:
    deadline = time.monotonic() + 5
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} was never written"
        time.sleep(0.01)
    return int(path.read_text())


def _eventually(condition: Callable[[], bool]) -> None:
    """Wait for background processes started just before to have exec'd."""
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def _gone_or_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(b")") + 2 :].split()[0] == b"Z"


def test_stop_kills_setsid_double_forked_and_unmarked_group_members(tmp_path: Path) -> None:
    script = f"""
    setsid sh -c 'echo $$ > setsid.pid.tmp && mv setsid.pid.tmp setsid.pid; exec sleep 60' &
    {sys.executable} -c '{DOUBLE_FORK_DAEMON}'
    env -u BATON_RUN_ID sh -c 'echo $$ > unmarked.pid.tmp && mv unmarked.pid.tmp unmarked.pid
        exec sleep 60' &
    echo ready
    sleep 60
    """
    with _running(_bash(tmp_path, script)) as proc:
        lines = proc.lines()
        assert next(lines) == "ready"
        setsid_pid = _read_pid_file(tmp_path / "setsid.pid")
        daemon_pid = _read_pid_file(tmp_path / "daemon.pid")
        unmarked_pid = _read_pid_file(tmp_path / "unmarked.pid")
        marked = processes_with_marker(proc.marker)
        assert {proc.pid, setsid_pid, daemon_pid} <= set(marked)
        assert unmarked_pid not in marked  # found only through the process group
        assert unmarked_pid in proc.alive_pids()

        assert proc.stop(grace_seconds=1) == []

        assert processes_with_marker(proc.marker) == []
        assert proc.alive_pids() == []
        for pid in (proc.pid, setsid_pid, daemon_pid, unmarked_pid):
            assert _gone_or_zombie(pid), pid
        # The daemons held stdout open; with them dead the reader sees the end.
        assert list(lines) == []


def test_a_child_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    # The ignored SIGTERM is inherited by the setsid'd sleep, outside the executor's group.
    script = "trap '' TERM; setsid sleep 60 & echo ready; sleep 60"
    with _running(_bash(tmp_path, script)) as proc:
        assert next(proc.lines()) == "ready"
        _eventually(lambda: len(proc.alive_pids()) == 2)  # bash exec'd the last sleep
        started = time.monotonic()
        assert proc.stop(grace_seconds=1) == []
        elapsed = time.monotonic() - started
        assert 1.0 <= elapsed < 4.0
        assert proc.wait(timeout=1) == -9
        assert processes_with_marker(proc.marker) == []


def test_large_stdin_arrives_intact_while_a_large_line_is_read(tmp_path: Path) -> None:
    prompt = os.urandom(5_000_000)
    long_line = "ab€" * 60_000  # 300 KB, multi-byte characters across read boundaries
    # The child writes its long line before reading stdin: both pipes are full at once, which
    # deadlocks unless stdin is written while stdout is being read.
    child = (
        "import hashlib, sys\n"
        "sys.stdout.write('ab\u20ac' * 60_000 + '\\n'); sys.stdout.flush()\n"
        "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())\n"
    )
    launch = _launch(tmp_path, sys.executable, "-c", child, stdin=prompt)
    with _running(launch) as proc:
        lines = list(proc.lines())
        assert proc.wait(timeout=5) == 0
    assert lines == [long_line, hashlib.sha256(prompt).hexdigest()]


def test_stderr_tail_is_bounded_and_keeps_the_end(tmp_path: Path) -> None:
    child = "import sys\nsys.stderr.write(''.join(f'{i:08d}\\n' for i in range(30_000)))\n"
    with _running(_launch(tmp_path, sys.executable, "-c", child)) as proc:
        assert list(proc.lines()) == []
        assert proc.wait(timeout=5) == 0
        everything = "".join(f"{i:08d}\n" for i in range(30_000))
        assert proc.stderr_tail() == everything[-STDERR_TAIL_BYTES:]


def test_lines_in_order_and_exit_code(tmp_path: Path) -> None:
    with _running(_bash(tmp_path, r"printf 'one\ntwo\n\nthree'; exit 3")) as proc:
        assert list(proc.lines()) == ["one", "two", "", "three"]
        assert proc.wait(timeout=5) == 3


def test_a_child_that_never_reads_stdin_does_not_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    # Larger than a pipe buffer: the writer is blocked when the child exits.
    with _running(_bash(tmp_path, "echo bye; exit 0", stdin=b"x" * 1_000_000)) as proc:
        assert list(proc.lines()) == ["bye"]
        assert proc.wait(timeout=5) == 0  # also waits for the stdin writer to end
    assert thread_errors == []


def test_stop_from_another_thread_ends_the_line_iteration(tmp_path: Path) -> None:
    with _running(_bash(tmp_path, "echo first; sleep 60")) as proc:
        lines = proc.lines()
        assert next(lines) == "first"
        stopper = threading.Timer(0.2, proc.stop, kwargs={"grace_seconds": 5})
        started = time.monotonic()
        stopper.start()
        assert list(lines) == []
        stopper.join()
        # sleep obeys SIGTERM: nothing waits for the 5 s grace.
        assert time.monotonic() - started < 2.0
        assert proc.wait(timeout=1) == -15
        assert proc.stop() == []  # a second stop is harmless


def test_lines_end_when_the_executor_exits_even_if_a_descendant_holds_stdout(
    tmp_path: Path,
) -> None:
    script = "setsid sleep 60 & env -u BATON_RUN_ID sleep 60 & echo done"
    with _running(_bash(tmp_path, script)) as proc:
        started = time.monotonic()
        assert list(proc.lines()) == ["done"]
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - started < 2.0
        # The worker's final check finds the leftovers (the unmarked one through the executor's
        # process group, which outlives the reaped executor), and stop() removes them.
        _eventually(lambda: len(processes_with_marker(proc.marker)) == 1)
        _eventually(lambda: len(proc.alive_pids()) == 2)
        assert proc.stop(grace_seconds=1) == []
        assert proc.alive_pids() == []
        assert processes_with_marker(proc.marker) == []


def test_reaping_never_takes_an_exit_code_from_an_executor_process(tmp_path: Path) -> None:
    stop_reaping = threading.Event()

    def reap_constantly() -> None:
        while not stop_reaping.is_set():
            reap_adopted_zombies()

    reaper = threading.Thread(target=reap_constantly)
    reaper.start()
    try:
        codes = []
        for _ in range(10):
            with _running(_bash(tmp_path, "exit 7")) as proc:
                time.sleep(0.05)  # it is a zombie now, while the reaper runs
                codes.append(proc.wait(timeout=5))
    finally:
        stop_reaping.set()
        reaper.join()
    # A reaped-elsewhere child makes Popen report 0.
    assert codes == [7] * 10


def test_scan_is_fast_and_stop_ends_a_wide_tree(tmp_path: Path) -> None:
    script = "for i in $(seq 300); do sleep 60 & done; echo ready; wait"
    with _running(_bash(tmp_path, script)) as proc:
        assert next(proc.lines()) == "ready"
        # A child caught in the middle of its exec shows no environment for a moment.
        _eventually(lambda: len(processes_with_marker(proc.marker)) == 301)
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            found = processes_with_marker(proc.marker)
            timings.append(time.perf_counter() - started)
        assert len(found) == 301
        # About 5 ms here with ~400 processes; a generous bound so a busy CI machine passes.
        assert min(timings) < 0.1
        assert proc.stop(grace_seconds=2) == []
        assert processes_with_marker(proc.marker) == []


SUBREAPER_CHECK = """
import os, uuid
from pathlib import Path
from executors.adapters.base import Launch
from executors.process import ExecutorProcess
from executors.process_tree import enable_subreaper

assert enable_subreaper()
launch = Launch(
    argv=["bash", "-c", "sleep 60 >/dev/null 2>&1 </dev/null & echo $!"],
    env={"PATH": os.environ["PATH"]},
    cwd=Path.cwd(),
    stdin=b"",
)
proc = ExecutorProcess.start(launch, marker=uuid.uuid4().hex)
orphan = int(next(proc.lines()))
assert proc.wait(timeout=5) == 0
stat = Path(f"/proc/{orphan}/stat").read_bytes()
parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
assert parent == os.getpid(), f"the orphan went to {parent}, not to this subreaper"
assert proc.stop(grace_seconds=1) == []
# Killed, it became this process's zombie; stop() reaped it.
assert not Path(f"/proc/{orphan}").exists(), "the killed orphan is still a zombie"
print("ok")
"""


def test_subreaper_adopts_orphans_and_their_zombies_are_reaped(tmp_path: Path) -> None:
    # In a separate interpreter: being a subreaper lasts for the whole process.
    result = subprocess.run(
        [sys.executable, "-c", SUBREAPER_CHECK],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"


def test_an_interactive_runs_stdin_stays_open_for_writes_in_order_until_closed(
    tmp_path: Path,
) -> None:
    # Echoes each stdin line back, and says when stdin ended.
    script = 'while IFS= read -r line; do echo "got $line"; done; echo eof'
    launch = Launch(
        argv=["bash", "-c", script],
        env={"PATH": os.environ["PATH"]},
        cwd=tmp_path,
        stdin=b"first\n",
        interactive=True,
    )
    with _running(launch) as proc:
        lines = proc.lines()
        assert next(lines) == "got first"
        # Nothing ends stdin but close_stdin: the child is still reading.
        big = "x" * (256 * 1024)  # larger than a pipe buffer: written without blocking us
        assert proc.write_stdin(b"second\n")
        assert proc.write_stdin(big.encode() + b"\n")
        assert next(lines) == "got second"
        assert next(lines) == f"got {big}"
        proc.close_stdin()
        assert list(lines) == ["eof"]
        assert proc.write_stdin(b"too late\n") is False
        proc.close_stdin()  # again: nothing
        assert proc.wait(timeout=5) == 0


def test_a_run_that_is_not_interactive_closes_stdin_after_its_bytes(tmp_path: Path) -> None:
    with _running(_bash(tmp_path, "cat; echo eof", stdin=b"all of it\n")) as proc:
        assert list(proc.lines()) == ["all of it", "eof"]
        assert proc.write_stdin(b"more\n") is False
