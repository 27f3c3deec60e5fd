"""The production server's PostgreSQL connections follow its pool, not its threads.

gunicorn as `make serve` runs it (production mode, gthread), 2 processes of 40 threads each,
on the test database, with a pool of 4 connections per process, driven by 60 requests at once:
20 workers long polling a dispatch that finds nothing (they wait at the bell) and 40 product
clients creating and reading tasks while they wait. The server's sessions, counted in
pg_stat_activity by their application name all along, never pass processes × pool size plus
each process's LISTEN connection (outside the pool), and every request is answered: idle
waiters hand their connection back, so the pool's few serve everyone else. Without a pool each
thread would keep a connection of its own (up to 60 here). The pool's timeout is long here, so
that a loaded machine's queueing is not taken for an exhausted pool: that waiters hand their
connection back is tested in tests/dispatch/test_long_polling.py
(`test_waiting_dispatches_hold_no_pooled_connection`), the 503 in tests/api/test_database_busy.py.

PostgreSQL only; the test runs on a transactional database (with the shipped bots again), so
the accounts it makes are committed and the server sees them.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token

from backend.dispatch.workers import ensure_worker_account
from tests.api.test_production import _free_port, production_env
from tests.e2e.live import REPO_ROOT
from tests.e2e.test_replicas import _test_database_url

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

PROCESSES = 2
THREADS = 40
POOL_SIZE = 4
# Each process's listener keeps a connection of its own that LISTENs, outside the pool.
LISTENERS_PER_PROCESS = 1
WAITERS = 20
PRODUCT_CLIENTS = 40
WAIT_SECONDS = 4.0
HANG_GUARD_SECONDS = 60


def _wait_until_healthy(url: str, server: subprocess.Popen[bytes], var_dir: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while True:
        try:
            if httpx.get(f"{url}/api/health/", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            errors = (var_dir / "stderr.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"the server did not come up:\n{errors}")
        time.sleep(0.2)


@pytest.fixture
def application_name() -> str:
    """What the server's sessions call themselves (libpq's PGAPPNAME), to count only them."""
    return f"baton-pool-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def server(tmp_path, application_name: str) -> Iterator[str]:
    env = production_env(
        tmp_path,
        SECRET_KEY=secrets.token_urlsafe(50),
        BATON_SSL_REDIRECT="false",  # plain HTTP on loopback
        DATABASE_URL=_test_database_url(),
        BATON_DATABASE_POOL_SIZE=str(POOL_SIZE),
        # Long enough that a request queued for one of the pool's few connections on a loaded
        # machine waits its turn: this test is about how many connections there are, and the
        # answer to a pool that stays exhausted is tested in tests/api/test_database_busy.py.
        BATON_DATABASE_POOL_TIMEOUT_SECONDS="30",
        BATON_LOG_LEVEL="WARNING",
        PGAPPNAME=application_name,
    )
    port = _free_port()
    with (tmp_path / "stdout.log").open("wb") as out, (tmp_path / "stderr.log").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "backend.wsgi"]
            + ["--config", "python:backend.gunicorn_conf", "--bind", f"127.0.0.1:{port}"]
            + ["--workers", str(PROCESSES), "--threads", str(THREADS)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=err,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(url, process, tmp_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=HANG_GUARD_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class SessionCounter:
    """Samples the server's sessions on the test database every 20 ms, on a connection of its
    own, and keeps the most seen at once."""

    def __init__(self, application_name: str) -> None:
        self.application_name = application_name
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SessionCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as watcher:
            while not self._stop.is_set():
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    [self.application_name],
                ).fetchone()
                self.most = max(self.most, row[0] if row else 0)
                self._stop.wait(0.02)


def _tokens() -> tuple[str, str]:
    owner = get_user_model().objects.create_user(username="product")
    _, worker_token = ensure_worker_account(username="pool-worker")
    return Token.objects.create(user=owner).key, worker_token


def test_the_servers_connections_stay_within_its_pools_under_many_requests(
    server: str, application_name: str
):
    product_token, worker_token = _tokens()
    answers: list[int] = []
    answers_lock = threading.Lock()

    def answered(status: int) -> None:
        with answers_lock:
            answers.append(status)

    def wait_for_a_turn(index: int) -> None:
        # A kind no task here uses: the dispatch waits all of its wait_seconds at the bell.
        body = {
            "kinds": ["agno"],
            "limit": 1,
            "worker_id": f"idle-{index}",
            "wait_seconds": WAIT_SECONDS,
        }
        with httpx.Client(base_url=server, headers={"Authorization": f"Token {worker_token}"}) as c:
            response = c.post(
                "/api/executor/dispatch/", json=body, timeout=WAIT_SECONDS + HANG_GUARD_SECONDS
            )
        answered(response.status_code)
        if response.status_code == 200:
            assert response.json()["turns"] == []

    def use_the_product(index: int) -> None:
        headers = {"Authorization": f"Token {product_token}"}
        with httpx.Client(base_url=server, headers=headers, timeout=HANG_GUARD_SECONDS) as c:
            for turn in range(3):
                body = {
                    "title": f"pool {index}.{turn}",
                    "task_type": "code",
                    "executor": "codex",
                    "message": "CI is red.",
                }
                created = c.post("/api/tasks/", json=body)
                answered(created.status_code)
                if created.status_code == 201:
                    answered(c.get(f"/api/tasks/{created.json()['id']}/").status_code)

    with SessionCounter(application_name) as sessions:
        waiters = [
            threading.Thread(target=wait_for_a_turn, args=(index,)) for index in range(WAITERS)
        ]
        for thread in waiters:
            thread.start()
        time.sleep(0.5)  # the waiters reach the bell
        clients = [
            threading.Thread(target=use_the_product, args=(index,))
            for index in range(PRODUCT_CLIENTS)
        ]
        for thread in clients:
            thread.start()
        for thread in [*clients, *waiters]:
            thread.join(timeout=WAIT_SECONDS + HANG_GUARD_SECONDS)

    assert sorted(set(answers)) == [200, 201], answers
    assert len(answers) == WAITERS + PRODUCT_CLIENTS * 3 * 2
    # The requests did reach the database through the pool...
    assert sessions.most >= PROCESSES
    # ...and no more connections than the pools and the listeners may hold.
    assert sessions.most <= PROCESSES * (POOL_SIZE + LISTENERS_PER_PROCESS), sessions.most
