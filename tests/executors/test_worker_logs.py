"""The worker's log names no URL: a model endpoint's may carry a gateway's credentials
(docs/architecture.md, principle 7: logs carry counts, sizes, ids and flags)."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from executors.logs import configure_logging

URL_WITHHELD = "<URL withheld>"

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET = "gw-secret-5b2e"


def _dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_worker_says_which_endpoint_it_uses_never_its_url(tmp_path: Path) -> None:
    """`executor_ready` says where each kind's model calls go — the provider's default, a
    configured endpoint or the stand-in — without the URL, whose credentials stay unlogged."""
    worker = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "executors", "--kinds", "codex,claude_code,agno"],
        cwd=REPO_ROOT,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "BATON_URL": f"http://127.0.0.1:{_dead_port()}",
            "BATON_WORKER_TOKEN": "t0k",
            "BATON_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
            "OPENAI_BASE_URL": f"https://user:{SECRET}@gateway.example/{SECRET}/v1?key={SECRET}",
            "OPENAI_API_KEY": "sk-unused",
            "BATON_STANDIN_MODEL": "auto",  # Claude Code: no Anthropic key or URL here
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert worker.stderr is not None
        while len([line for line in lines if "executor_ready" in line]) < 3:
            line = worker.stderr.readline()
            assert line or worker.poll() is None, "".join(lines)
            lines.append(line)
        worker.send_signal(signal.SIGTERM)
        lines.append(worker.communicate(timeout=60)[1])
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    logs = "".join(lines)
    assert SECRET not in logs and "gateway.example" not in logs and "://" not in logs
    ready = [
        json.loads(line.split(" baton.worker ", 1)[1])
        for line in logs.splitlines()
        if "executor_ready" in line
    ]
    assert {line["kind"]: line["model_endpoint"] for line in ready} == {
        "codex": "configured",
        "claude_code": "standin",
        "agno": "configured",
    }


def test_no_log_line_of_the_worker_names_a_url() -> None:
    """Whichever logger writes a URL, in its text or in its exception, the worker's handler
    prints URL_WITHHELD in its place, and a JSON line stays JSON."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers = []
    try:
        configure_logging("DEBUG")
        [handler] = root.handlers
        lines = io.StringIO()
        handler.setStream(lines)  # type: ignore[attr-defined]
        url = f"https://user:{SECRET}@gateway.example/v1?key={SECRET}"
        logging.getLogger("baton.worker").info(json.dumps({"event": "x", "endpoint": url}))
        logging.getLogger("some.library").warning("calling %s now", url)
        try:
            raise ConnectionError(f"cannot reach {url}")
        except ConnectionError:
            logging.getLogger("baton.worker").exception("failed")
    finally:
        root.handlers, root.level = saved
    printed = lines.getvalue()
    assert SECRET not in printed and "gateway.example" not in printed
    first, second = printed.splitlines()[:2]
    assert json.loads(first.split(" baton.worker ", 1)[1]) == {
        "event": "x",
        "endpoint": URL_WITHHELD,
    }
    assert second.endswith(f"some.library calling {URL_WITHHELD} now")
    assert f"ConnectionError: cannot reach {URL_WITHHELD}" in printed
