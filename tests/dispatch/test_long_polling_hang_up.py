"""A waiting dispatch whose worker hung up claims nothing (`dispatch.waiting`,
`api.client_connection`), over real HTTP: behind gunicorn (gthread workers, as `make serve` runs
it) and behind Django's own server (pytest-django's live server).

A raw socket starts a dispatch that would wait 20 s, then closes. A turn created afterwards,
while that wait would still run, stays pending, and the next dispatch gets it as its first
attempt. Were the hang-up unseen, the waiter would claim the turn for nobody, and it would stay
RUNNING until its lease expired. Both servers run on SQLite, where a waiter polls every 50 ms
and is woken in-process by the turn's announcement.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from backend.dispatch.waiting import LISTENER
from backend.dispatch.workers import ensure_worker_account

REPO_ROOT = Path(__file__).resolve().parents[2]
DISPATCH = "/api/executor/dispatch/"
HANG_GUARD_SECONDS = 30
# Long enough for a loaded machine to take the request and begin its wait.
SETTLE_SECONDS = 0.5
# Far longer than a waiter takes to claim a turn it is woken for (or polls into).
CLAIM_SECONDS = 1.5


@dataclass(frozen=True)
class Server:
    url: str
    worker_token: str
    product_token: str
    # The event names the server logged on `baton.events` so far.
    events: Callable[[], list[str]]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def gunicorn_server(tmp_path_factory) -> Iterator[Server]:
    """Baton under gunicorn (one gthread process, 4 threads) on a SQLite database of its own,
    with a worker account and a product account."""
    var_dir = tmp_path_factory.mktemp("gunicorn")
    env = {**os.environ, "DATABASE_URL": "", "BATON_VAR_DIR": str(var_dir)}
    env.update(BATON_LOG_LEVEL="INFO", BATON_LOG_FORMAT="json")
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO_ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    manage("migrate", "--verbosity", "0")
    worker_token = manage("create_worker", "worker-http")
    product_token = manage(
        "shell",
        "--verbosity",
        "0",
        "-c",
        "from django.contrib.auth.models import User; "
        "from rest_framework.authtoken.models import Token; "
        "print(Token.objects.create(user=User.objects.create_user('product')).key)",
    )
    port = _free_port()
    log = var_dir / "stderr.log"
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "backend.wsgi", "--worker-class", "gthread"]
            + ["--workers", "1", "--threads", "4", "--bind", f"127.0.0.1:{port}"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )

    def events() -> list[str]:
        lines = log.read_text(errors="replace").splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        return [record["event"] for record in records if "event" in record]

    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("gunicorn did not start") from None
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}"
        # The first request loads the app: the test's dispatch should find it ready to wait.
        assert httpx.get(f"{url}/api/health/", timeout=HANG_GUARD_SECONDS).status_code == 200
        yield Server(url, worker_token, product_token, events)
    finally:
        server.terminate()
        try:
            server.wait(timeout=HANG_GUARD_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def django_server(live_server, caplog, shipped_bots) -> Iterator[Server]:
    """Baton behind Django's own server, in this process, on the test database."""
    _, worker_token = ensure_worker_account(username="worker-http")
    owner = get_user_model().objects.create_user(username="product")
    product_token = Token.objects.create(user=owner).key
    with caplog.at_level(logging.INFO, logger="baton.events"):

        def events() -> list[str]:
            return [
                json.loads(record.getMessage())["event"]
                for record in caplog.records
                if record.name == "baton.events"
            ]

        yield Server(live_server.url, worker_token, product_token, events)
    LISTENER.stop()


def _start_waiting_dispatch(server: Server) -> socket.socket:
    """A worker's dispatch that waits 20 s for a codex turn, sent on a raw connection."""
    body = json.dumps(
        {"kinds": ["codex"], "limit": 1, "worker_id": "gone", "wait_seconds": 20}
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=HANG_GUARD_SECONDS)
    head = (
        f"POST {DISPATCH} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Token {server.worker_token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode("ascii") + body)
    return sock


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server_fixture", ["gunicorn_server", "django_server"])
def test_a_waiting_dispatch_whose_worker_hung_up_claims_nothing(request, server_fixture):
    server: Server = request.getfixturevalue(server_fixture)
    seen_before = server.events().count("dispatch_client_gone")
    waiting = _start_waiting_dispatch(server)
    time.sleep(SETTLE_SECONDS)
    waiting.close()
    product = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Token {server.product_token}"},
        timeout=HANG_GUARD_SECONDS,
    )
    worker = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Token {server.worker_token}"},
        timeout=HANG_GUARD_SECONDS,
    )
    with product, worker:
        created = product.post(
            "/api/tasks/",
            json={"title": "t", "task_type": "code", "message": "CI is red.", "executor": "codex"},
        )
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        time.sleep(CLAIM_SECONDS)
        turn = product.get(f"/api/tasks/{task_id}/").json()["turns"][1]
        assert (turn["status"], turn["attempts"]) == ("PENDING", 0)
        # The waiter saw its client go (it did not just miss the turn), long before its 20 s.
        assert server.events().count("dispatch_client_gone") == seen_before + 1
        # The next worker gets the turn, as its first attempt.
        answer = worker.post(DISPATCH, json={"kinds": ["codex"], "limit": 1, "worker_id": "next"})
        assert answer.status_code == 200, answer.text
        [claimed] = answer.json()["turns"]
    assert (claimed["subtask_id"], claimed["attempt"]) == (turn["id"], 1)
