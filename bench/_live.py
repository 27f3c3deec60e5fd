"""A live Baton for benchmarks: gunicorn on a throwaway database, accounts, and the real worker;
and what its processes (and PostgreSQL's) spend, read from /proc.

What users see is measured over real HTTP against the production server, so benchmarks that
involve the worker start Baton under gunicorn (4 sync workers) and the worker
(`python -m executors`) as its own process, exactly as they run in production.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._django import REPO_ROOT


@dataclass(frozen=True)
class LiveBaton:
    url: str
    product: httpx.Client
    worker_token: str
    product_token: str
    server_pid: int  # gunicorn's master process


def gunicorn_workers(master_pid: int) -> list[int]:
    """The pids of the worker processes of the gunicorn master `master_pid` (Linux)."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return [int(child) for child in children]


def gunicorn_worker(master_pid: int) -> int:
    """The pid of the one worker process of the gunicorn master `master_pid`."""
    children = gunicorn_workers(master_pid)
    if len(children) != 1:
        raise SystemExit(f"expected one gunicorn worker, found {children}")
    return children[0]


def memory_kib(pid: int, field: str) -> int:
    """A process's `VmRSS` (now) or `VmHWM` (peak) in KiB, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} for process {pid}")


def reset_peak(pid: int) -> None:
    """Make the process's `VmHWM` its current `VmRSS`, so the next peak is a request's."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each of the processes `pids` still running, from /proc
    (Linux; a PostgreSQL backend whose connection closed has none)."""
    seconds = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # 14, 15
    return seconds


def server_cpu_seconds(master_pid: int) -> float:
    """User + system CPU time of gunicorn's master and its worker processes."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return sum(cpu_seconds([master_pid, *map(int, children)]).values())


def postgres_backends(*, other_than_mine: bool) -> list[int]:
    """The PostgreSQL backends of the benchmark's database (PostgreSQL runs on this host):
    this process's own, or every other one (the server's)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if other_than_mine:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT pg_backend_pid()")
        return [cursor.fetchone()[0]]


def machine_cpu_seconds() -> float:
    """CPU time the whole machine spent busy (all cores), from /proc/stat."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def _server_output(*, production: bool, log_dir: Path | None) -> Iterator[tuple[Any, Any]]:
    """Where the server's stdout and stderr go: the console (development), /dev/null
    (production), or `log_dir`'s `server-access.log` and `server-errors.log` (production: its
    access log is on stdout, everything else on stderr)."""
    if not production:
        yield None, None
    elif log_dir is None:
        yield subprocess.DEVNULL, subprocess.DEVNULL
    else:
        log_dir.mkdir(parents=True, exist_ok=True)
        with (
            (log_dir / "server-access.log").open("ab") as access,
            (log_dir / "server-errors.log").open("ab") as errors,
        ):
            yield access, errors


@contextmanager
def live_baton(
    *, workers: int = 4, threads: int = 0, production: bool = False, log_dir: Path | None = None
) -> Iterator[LiveBaton]:
    """Baton under gunicorn (`workers` sync workers, or with `threads` that many threads each)
    on the database `bench_database` configured, with a product account and a worker account.

    `production`: as `make serve` runs it, `BATON_ENV=production` with `backend/gunicorn_conf.py`
    (gthread, `threads` request threads a process plus one per event stream it may serve, JSON
    log lines, the access log; written to /dev/null here), plain HTTP on the loopback."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from backend.dispatch.workers import ensure_worker_account

    owner, _ = get_user_model().objects.get_or_create(username="bench-product")
    product_token = Token.objects.get_or_create(user=owner)[0].key
    _, worker_token = ensure_worker_account(username="bench-worker")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ALLOWED_HOSTS": "127.0.0.1", "BATON_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "gunicorn", "backend.wsgi", "--workers", str(workers)]
    if production:
        env |= {
            "BATON_ENV": "production",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "BATON_SSL_REDIRECT": "false",
            "BATON_LOG_LEVEL": "INFO",
            "BATON_WEB_THREADS": str(threads or 8),
        }
        command += ["--config", "python:backend.gunicorn_conf"]
    else:
        command += ["--log-level", "warning"]
        if threads:
            command += ["--worker-class", "gthread", "--threads", str(threads)]
    with _server_output(production=production, log_dir=log_dir) as (stdout, stderr):
        server = subprocess.Popen(
            [*command, "--bind", f"127.0.0.1:{port}"],
            cwd=REPO_ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/api/schema/", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the backend did not come up at {url}") from None
                time.sleep(0.2)
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Token {product_token}"}, timeout=30
        ) as product:
            yield LiveBaton(
                url=url,
                product=product,
                worker_token=worker_token,
                product_token=product_token,
                server_pid=server.pid,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)


def start_worker(
    baton: LiveBaton, *, workdir: Path, kinds: list[str], **env: str
) -> subprocess.Popen[bytes]:
    """The real worker, one slot, polling every 50 ms (`env` overrides its environment), its
    workspace root in `workdir` and its output appended to `workdir`'s `worker.log`. A worker
    started again on the same `workdir` is known to Baton by the same worker id."""
    workdir.mkdir(parents=True, exist_ok=True)
    worker_env = {
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",
        "BATON_URL": baton.url,
        "BATON_WORKER_TOKEN": baton.worker_token,
        "BATON_WORKSPACE_ROOT": str(workdir / "workspaces"),
        "BATON_EXECUTOR_KINDS": ",".join(kinds),
        "BATON_WORKER_SLOTS": "1",
        "BATON_WORKER_POLL_SECONDS": "0.05",
        # Polling, as these benchmarks were measured: a long poll would hold one of the
        # server's sync workers.
        "BATON_WORKER_WAIT_SECONDS": "0",
        **env,
    }
    with (workdir / "worker.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "executors"],
            cwd=REPO_ROOT,
            env=worker_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@contextmanager
def running_worker(
    baton: LiveBaton, *, workdir: Path, kinds: list[str], **env: str
) -> Iterator[Path]:
    """The real worker (`start_worker`) for the block, stopped with SIGTERM after it; yields
    its log file's path."""
    worker = start_worker(baton, workdir=workdir, kinds=kinds, **env)
    try:
        yield workdir / "worker.log"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)


def model_env(model: Any) -> dict[str, str]:
    """The worker's environment for the executors' model calls to go to the loopback `model`
    server (`executors.standin.ModelServer`), without retries."""
    return {
        "OPENAI_BASE_URL": f"{model.url}/v1",
        "OPENAI_API_KEY": "sk-bench",
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-bench",
        "BATON_MODEL_RETRIES": "0",
    }


def wait_for_task(baton: LiveBaton, task_id: int, *, timeout: float = 120) -> dict:
    """The task once its latest turn has finished."""
    deadline = time.monotonic() + timeout
    while True:
        task = baton.product.get(f"/api/tasks/{task_id}/").json()
        # The task row can trail its turns by a moment (separate reads): wait for both.
        finished = task["turns"][-1]["status"] in ("COMPLETED", "FAILED", "CANCELLED")
        if finished and task["status"] not in ("PENDING", "RUNNING"):
            return task
        if time.monotonic() > deadline:
            raise SystemExit(f"task {task_id} did not finish")
        time.sleep(0.05)
