"""The live parts end-to-end tests drive: the product's HTTP client against pytest-django's live
server, and the real worker (`python -m executors`) in its own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from executors.process_tree import processes_with_marker
from executors.standin import ModelServer, extract_prompt

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "INTERRUPTED"}
UNFINISHED = {"PENDING", "RUNNING"}
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Baton:
    """The product's side: its HTTP client, and the worker account's token."""

    url: str
    product: httpx.Client
    worker_token: str

    def create(self, **body: Any) -> dict[str, Any]:
        body = {"title": "e2e", "task_type": "code", **body}
        response = self.product.post("/api/tasks/", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def follow_up(self, task_id: int, message: str) -> None:
        response = self.product.post(f"/api/tasks/{task_id}/messages/", json={"message": message})
        assert response.status_code == 201, response.text

    def task(self, task_id: int) -> dict[str, Any]:
        response = self.product.get(f"/api/tasks/{task_id}/")
        assert response.status_code == 200, response.text
        return response.json()

    def whole_text(self, spilled: dict[str, Any]) -> str:
        """The whole text behind a spilled text's preview object (a turn's text endpoint)."""
        response = self.product.get(spilled["url"])
        assert response.status_code == 200, response.text
        return response.content.decode("utf-8")

    def wait(self, task_id: int, *, timeout: float = 90.0) -> dict[str, Any]:
        """The task once its latest turn has finished, the task's status says so too and no
        message waits queued.

        The task row and its turns are read by separate queries, so a read that lands while a
        result commits can show the turn finished and the task a moment behind: wait for both.
        """
        deadline = time.monotonic() + timeout
        while True:
            task = self.task(task_id)
            if (
                task["turns"][-1]["status"] in FINISHED
                and task["status"] not in UNFINISHED
                and not task["queued_messages"]
            ):
                return task
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} did not finish: {task['turns'][-1]}")
            time.sleep(0.1)


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    workspace_root: Path
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def worker(
    baton: Baton, model: ModelServer, tmp_path: Path, kinds: list[str], **extra_env: str
) -> Iterator[WorkerProcess]:
    """The real worker in its own process, stopped with SIGTERM afterwards (it must exit 0)."""
    workspace_root = tmp_path / "workspaces"
    log = tmp_path / "worker.log"
    env = {
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",
        "BATON_URL": baton.url,
        "BATON_WORKER_TOKEN": baton.worker_token,
        "BATON_WORKSPACE_ROOT": str(workspace_root),
        "BATON_EXECUTOR_KINDS": ",".join(kinds),
        "BATON_WORKER_SLOTS": "2",
        "BATON_WORKER_POLL_SECONDS": "0.1",
        "BATON_WORKER_CLAIM_CHECK_SECONDS": "0.25",
        "BATON_MODEL_RETRIES": "0",
        "OPENAI_BASE_URL": f"{model.url}/v1",
        "OPENAI_API_KEY": "sk-e2e-openai",
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-e2e",
        "PYTHONPATH": str(REPO_ROOT),
        **extra_env,
    }
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "executors"],
            cwd=REPO_ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    running = WorkerProcess(process=process, workspace_root=workspace_root, log=log)
    try:
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0, running.logs()[-5000:]
    # The worker's log carries ids, counts and timings: never a key.
    assert "sk-e2e-openai" not in running.logs()
    assert "sk-ant-e2e" not in running.logs()


def prompts(model: ModelServer) -> list[str]:
    return [extract_prompt(request.api, request.body) for request in model.model_requests()]


def run_processes(running: WorkerProcess) -> list[int]:
    """Live processes of this worker's runs: each run's marker is in the worker's log, and
    every process of the run carries it in its environment."""
    markers = set(re.findall(r'"run": "([0-9a-f]{32})"', running.logs()))
    assert markers, "the worker logged no run"
    return [pid for marker in markers for pid in processes_with_marker(marker)]
