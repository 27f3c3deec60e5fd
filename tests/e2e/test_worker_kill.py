"""End to end: an executor never outlives its worker.

A worker killed with SIGKILL cannot report its turn (the lease runs out and the turn is claimed
again), so an executor that kept going would only spend model calls no one reads. The real
worker runs a real Claude Code or Codex CLI turn whose tool command runs until it is killed;
the worker is killed while it runs; the executor and its whole tree — the tool command, in its
own session, included — must be gone shortly after, and the model must hear no more from them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest

from executors.process_tree import processes_with_marker
from tests.e2e.live import WorkerProcess, run_processes, worker
from tests.e2e.test_executors import tool_call

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

# A tool command that runs until it is killed.
TOOL_COMMAND = "tail -f /dev/null"
STARTED_WAIT_SECONDS = 60.0
GONE_WAIT_SECONDS = 20.0


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _tool_running(running: WorkerProcess) -> list[int] | None:
    """The run's live processes once its tool command runs among them, else None."""
    if '"run": "' not in running.logs():
        return None
    pids = run_processes(running)
    return pids if any(_cmdline(pid)[:1] == [b"tail"] for pid in pids) else None


def _poll(condition, *, seconds: float):  # type: ignore[no-untyped-def]
    """The first truthy value of `condition()` within `seconds`, else the last falsy one."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["claude_code", "codex"])
def test_a_killed_workers_executor_and_its_whole_tree_die_with_it(
    kind, baton, model_server, tmp_path
):
    """Claude Code 2.1.332 and its tool command kept running after their worker was killed.
    Codex CLI 0.163 ended itself here at its next write to the dead worker's pipe; its case
    keeps that so whatever Codex does."""
    model_server.set_turns([tool_call(kind, TOOL_COMMAND), {"text": "Slept."}])
    # `live.worker` wants a clean exit at the end; this one is killed (so no assert in here:
    # pytest.raises would take it for that one).
    with (
        pytest.raises(AssertionError) as unclean,
        worker(baton, model_server, tmp_path, [kind]) as running,
    ):
        baton.create(executor=kind, message="Run the long command, then answer.")
        tree = _poll(lambda: _tool_running(running), seconds=STARTED_WAIT_SECONDS)
        calls_at_kill = len(model_server.model_requests())
        running.process.send_signal(signal.SIGKILL)
        running.process.wait(timeout=30)
    assert running.process.returncode == -signal.SIGKILL, unclean.value
    assert tree, f"the tool command never started: {running.logs()[-3000:]}"
    assert len(tree) >= 2  # the executor and its tool command, at least
    markers = set(re.findall(r'"run": "([0-9a-f]{32})"', running.logs()))

    def survivors() -> list[int]:
        return [pid for marker in markers for pid in processes_with_marker(marker)]

    try:
        gone = _poll(lambda: not survivors(), seconds=GONE_WAIT_SECONDS)
        assert gone, f"processes of the killed worker's run still alive: {survivors()}"
        # Nothing of the run is left to call the model: what it sent before the kill is all.
        assert len(model_server.model_requests()) == calls_at_kill
    finally:
        for pid in survivors():  # a failing run must not leave its tree behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
