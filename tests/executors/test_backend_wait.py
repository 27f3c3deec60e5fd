"""A worker waits for the backend at start (`BackendClient.wait_until_up`).

`make run` starts the worker before the server answers, and a deploy may start workers before
the web tier: the worker waits for `GET /api/health/`, quietly at first, then with one line,
and starts claiming once the backend answers. The worker itself runs in a real process
(`python -m executors --once`) against a loopback stand-in for Baton that starts listening
only after the worker has started.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from executors.client import BackendClient

REPO_ROOT = Path(__file__).resolve().parents[2]
IDLE = {"turns": [], "next_ready_in_seconds": None}


class _Baton(BaseHTTPRequestHandler):
    """Baton's health check and an idle dispatch; the health check answers from `statuses`
    while any are left (then 200). Records each request's method and path."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        statuses = self.server.statuses  # type: ignore[attr-defined]
        self._answer(statuses.pop(0) if statuses else 200, {"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(200, IDLE)

    def _answer(self, status: int, payload: dict[str, object]) -> None:
        self.server.seen.append((self.command, self.path))  # type: ignore[attr-defined]
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _serve(port: int = 0, statuses: list[int] | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Baton)
    server.seen, server.statuses = [], list(statuses or [])  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def baton() -> Iterator[ThreadingHTTPServer]:
    server = _serve(statuses=[503, 503, 404])
    yield server
    server.shutdown()
    server.server_close()


def _client(url: str) -> BackendClient:
    return BackendClient(base_url=url, token="t0k", worker_id="w")


def test_a_worker_started_before_its_backend_waits_quietly_then_dispatches(tmp_path):
    port = _free_port()
    worker = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "executors", "--once", "--kinds", "codex"],
        cwd=REPO_ROOT,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "BATON_URL": f"http://127.0.0.1:{port}",
            "BATON_WORKER_TOKEN": "t0k",
            "BATON_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
            "OPENAI_API_KEY": "sk-unused",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The worker is up (it has found its executor) well before the backend listens.
        assert worker.stderr is not None
        while '"event": "executor_ready"' not in worker.stderr.readline():
            assert worker.poll() is None, worker.communicate()
        time.sleep(1.5)  # not an assertion: the backend comes up a while after the worker
        server = _serve(port)
        try:
            _, stderr = worker.communicate(timeout=60)
        finally:
            server.shutdown()
            server.server_close()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, stderr
    for noise in ("Connection refused", "ConnectError", "Traceback", "backend call failed"):
        assert noise not in stderr
    assert "waiting for the backend" not in stderr  # it answered within the quiet start
    # It asked for the backend's health, then for work.
    assert server.seen[0] == ("GET", "/api/health/")  # type: ignore[attr-defined]
    assert ("POST", "/api/executor/dispatch/") in server.seen  # type: ignore[attr-defined]
    assert '"event": "worker_started"' in stderr


def test_an_answer_that_is_not_transient_ends_the_wait(baton):
    """503 (the backend's database is down) is waited out; any final answer — here a 404, as
    from a URL that is not Baton's — ends the wait, and the first dispatch says what is wrong."""
    host, port = baton.server_address[:2]
    stop = threading.Event()
    assert _client(f"http://{host}:{port}").wait_until_up(stop=stop) is True
    assert baton.seen == [("GET", "/api/health/")] * 3


def test_a_long_wait_is_said_once_without_the_url_or_a_trace(caplog):
    url = f"http://user:s3cret@127.0.0.1:{_free_port()}/baton-secret-path"
    stop = threading.Event()

    def stop_once_said() -> None:
        while not any("waiting" in record.getMessage() for record in caplog.records):
            time.sleep(0.01)
        time.sleep(0.5)  # a few more tries: none of them says anything
        stop.set()

    stopper = threading.Thread(target=stop_once_said, daemon=True)
    with caplog.at_level(logging.DEBUG, logger="baton.worker"):
        stopper.start()
        assert _client(url).wait_until_up(stop=stop, quiet_seconds=0.3) is False
    stopper.join(timeout=30)
    [record] = [record for record in caplog.records if record.name == "baton.worker"]
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    line = record.getMessage()
    assert line.startswith("waiting for the backend (BATON_URL) to answer GET /api/health/")
    assert "(ConnectError)" in line
    for secret in ("s3cret", "baton-secret-path", "127.0.0.1"):
        assert secret not in line


def test_a_stopped_worker_ends_its_wait_at_once():
    stop = threading.Event()
    stop.set()
    assert _client(f"http://127.0.0.1:{_free_port()}").wait_until_up(stop=stop) is False
