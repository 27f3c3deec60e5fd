"""End to end: a restarted worker resumes the native sessions it left on its disk.

A worker is known to the backend by the id kept in its workspace root (`executors.identity`),
so a new worker process on the same root, started without BATON_WORKER_ID — as a deploy
starts one — is the worker the backend recorded each session on: the follow-up's dispatch
offers the resume prompt and the executor resumes its own session. The first worker stops as
a deploy stops it (SIGTERM), or dies (SIGKILL), which leaves no lock behind.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from backend.dispatch.models import PromptReport
from backend.tasks.models import NativeSession
from executors.standin import ModelServer
from tests.e2e.live import Baton, WorkerProcess, worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]


def kept_worker_id(running: WorkerProcess) -> str:
    return (running.workspace_root / ".baton" / "worker-id").read_text().removesuffix("\n")


@contextmanager
def killed_at_the_end(
    baton: Baton, model: ModelServer, tmp_path: Path, kinds: list[str]
) -> Iterator[WorkerProcess]:
    """`live.worker`, ended with SIGKILL instead of SIGTERM: no shutdown of its own runs."""
    with pytest.raises(AssertionError) as stopped, worker(baton, model, tmp_path, kinds) as running:
        yield running
        running.process.send_signal(signal.SIGKILL)
        running.process.wait(timeout=30)
    # `live.worker` wants a clean exit; this one was killed, and nothing else went wrong.
    assert running.process.returncode == -signal.SIGKILL, stopped.value


@pytest.mark.parametrize(
    ("kind", "stop"),
    [("codex", "sigterm"), ("claude_code", "sigterm"), ("codex", "sigkill")],
)
def test_a_new_worker_process_on_the_same_root_resumes_the_session(
    kind, stop, baton: Baton, model_server, tmp_path
):
    model_server.set_turns([{"text": "First answer."}, {"text": "Second answer."}])
    first_run = killed_at_the_end if stop == "sigkill" else worker
    with first_run(baton, model_server, tmp_path, [kind]) as first_worker:
        task = baton.create(executor=kind, message="First question.")
        first = baton.wait(task["id"])["turns"][1]
    worker_id = NativeSession.objects.get(task_id=task["id"]).worker_id
    with worker(baton, model_server, tmp_path, [kind]) as restarted:  # no BATON_WORKER_ID
        baton.follow_up(task["id"], "Second question.")
        done = baton.wait(task["id"])
    assert restarted.process.pid != first_worker.process.pid
    second = done["turns"][3]
    assert (second["status"], second["result"]["value"]) == ("COMPLETED", "Second answer.")
    # The dispatch offered the resume prompt, the worker sent it, the executor resumed.
    assert second["native_session_id"] == first["native_session_id"]
    reports = dict(
        PromptReport.objects.filter(subtask_id=second["id"]).values_list("kind", "resume_reason")
    )
    assert reports == {"full": "resume", "resume": "resumed"}
    assert sorted(
        PromptReport.objects.filter(subtask_id=second["id"]).values_list("kind", "sent")
    ) == [("full", False), ("resume", True)]
    assert '"event": "turn_resume_failed"' not in restarted.logs()
    # The model read the first exchange once: from the session, not again from Baton.
    last = json.dumps(model_server.model_requests()[-1].body, ensure_ascii=False)
    assert (last.count("First question."), last.count("First answer.")) == (1, 1)
    session = NativeSession.objects.get(task_id=task["id"])
    assert (session.worker_id, session.session_id, session.turns) == (
        worker_id,
        first["native_session_id"],
        2,
    )
    # The id both were known by is the one kept in the root.
    assert kept_worker_id(restarted) == worker_id
    assert f'"worker_id": "{worker_id}", "source": "kept"' in restarted.logs()
