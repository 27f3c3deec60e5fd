"""Body limits behind real HTTP servers, over raw sockets: gunicorn (the production server) and
Django's own (pytest-django's live server).

A client that declares a huge Content-Length and sends a few bytes gets its 413 at once: were
the server waiting for the body, the answer would never come (the socket's timeout fails the
test). gunicorn decodes chunked bodies, so Baton measures them as they arrive; Django's server
does not, so there a chunked body is refused with 411.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MESSAGE_LIMIT = 1_000
# NEW_TASK's limit with MESSAGE_LIMIT and the shipped 16 pipeline steps (test_body_limits
# checks the formula).
NEW_TASK_LIMIT = 6 * MESSAGE_LIMIT + 64 * 1024 + 16 * 2 * 1024
SINGLE = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "codex"}
HANG_GUARD_SECONDS = 30


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    worker_token: str = ""


def _head(path: str, *, token: str = "", **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if token:
        lines.append(f"Authorization: Token {token}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, dict(response.getheaders()), response.read()


@pytest.fixture
def connect():
    opened: list[socket.socket] = []

    def open_socket(server: Server) -> socket.socket:
        sock = socket.create_connection((server.host, server.port), timeout=HANG_GUARD_SECONDS)
        opened.append(sock)
        return sock

    yield open_socket
    for sock in opened:
        sock.close()


def huge_declared_body(
    sock: socket.socket, path: str = "/api/tasks/", *, size: int = 100 * 2**20, token: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """Declare a body of `size` bytes, send its first bytes, and wait for the answer."""
    sock.sendall(_head(path, token=token, Content_Length=str(size)) + b'{"worker_id": "w')
    return _answer(sock)


def chunked_until_answered(
    sock: socket.socket, path: str, body: bytes, *, token: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """Send `body` in 8 KiB chunks, stopping as soon as the server answers."""
    sock.sendall(_head(path, token=token, Transfer_Encoding="chunked"))
    chunks = [body[start : start + 8192] for start in range(0, len(body), 8192)]
    for chunk in [*chunks, b""]:
        if select.select([sock], [], [], 0)[0]:
            break  # answered before the whole body was sent
        try:
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            break  # the server stopped reading; its answer is waiting
    return _answer(sock)


# --- gunicorn ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def gunicorn(tmp_path_factory) -> Iterator[Server]:
    """Baton under gunicorn (one sync worker) on a database of its own, with a worker account."""
    pytest.importorskip("gunicorn")
    var_dir = tmp_path_factory.mktemp("gunicorn")
    env = {
        **os.environ,
        "DATABASE_URL": "",
        "BATON_VAR_DIR": str(var_dir),
        "BATON_MAX_MESSAGE_BYTES": str(MESSAGE_LIMIT),
        "BATON_LOG_LEVEL": "WARNING",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO_ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    manage("migrate", "--verbosity", "0")
    token = manage("create_worker", "worker-http").strip()
    port = _free_port()
    with gunicorn_serving(
        ["backend.wsgi", "--workers", "1", "--log-level", "warning"],
        env=env,
        port=port,
        worker_token=token,
    ) as server:
        yield server


@contextlib.contextmanager
def gunicorn_serving(
    arguments: list[str], *, env: dict[str, str], port: int, worker_token: str, **popen: Any
) -> Iterator[Server]:
    """gunicorn with `arguments`, bound to 127.0.0.1:`port`, until it listens; stopped after
    (killed if a worker still waits for a body a failed test never sent)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *arguments, "--bind", f"127.0.0.1:{port}"],
        cwd=REPO_ROOT,
        env=env,
        **popen,
    )
    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("gunicorn did not start") from None
                time.sleep(0.1)
        yield Server("127.0.0.1", port, worker_token=worker_token)
    finally:
        server.terminate()
        try:
            server.wait(timeout=HANG_GUARD_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_gunicorn_answers_a_huge_declared_body_at_once(gunicorn, connect):
    status, headers, content = huge_declared_body(connect(gunicorn))
    assert status == 413
    assert headers["Content-Type"] == "application/json"
    body = json.loads(content)
    assert body["code"] == "too_large"
    assert body["detail"].startswith(
        f"The request body is 104857600 bytes; POST /api/tasks/ accepts at most "
        f"{NEW_TASK_LIMIT} bytes"
    )


def test_gunicorn_answers_a_worker_declaring_a_huge_result_at_once(gunicorn, connect):
    """Authenticated, on the endpoint with the largest limit: the view would read the body."""
    result_limit = 6 * 64 * 2**20 + 2**20  # the shipped BATON_MAX_RESULT_BYTES, 64 MiB
    path = "/api/executor/subtasks/1/result/"
    status, _, content = huge_declared_body(
        connect(gunicorn), path, size=2**30, token=gunicorn.worker_token
    )
    assert status == 413
    assert json.loads(content)["detail"] == (
        f"The request body is {2**30} bytes; POST {path} accepts at most {result_limit} bytes "
        "(result: at most 67108864 bytes of UTF-8, BATON_MAX_RESULT_BYTES)."
    )


def test_gunicorn_stops_reading_a_chunked_body_one_byte_over_the_limit(gunicorn, connect):
    body = json.dumps(SINGLE).encode() + b" " * (2 * NEW_TASK_LIMIT)
    status, _, content = chunked_until_answered(connect(gunicorn), "/api/tasks/", body)
    assert status == 413
    assert json.loads(content)["detail"] == (
        f"The request body is larger than the {NEW_TASK_LIMIT} bytes POST /api/tasks/ accepts "
        f"(message: at most {MESSAGE_LIMIT} bytes of UTF-8, BATON_MAX_MESSAGE_BYTES)."
    )


def test_gunicorn_serves_a_chunked_body_within_the_limit(gunicorn, connect):
    body = json.dumps({"kinds": ["codex"], "worker_id": "w1"}).encode()
    status, _, content = chunked_until_answered(
        connect(gunicorn), "/api/executor/dispatch/", body, token=gunicorn.worker_token
    )
    assert status == 200, content
    assert json.loads(content)["turns"] == []


# --- Django's development server -----------------------------------------------------------------


@pytest.fixture
def dev_server(live_server, settings) -> Server:
    settings.BATON_MAX_MESSAGE_BYTES = MESSAGE_LIMIT
    host, port = live_server.url.removeprefix("http://").split(":")
    return Server(host, int(port))


def test_the_development_server_answers_a_huge_declared_body_at_once(dev_server, connect):
    status, _, content = huge_declared_body(connect(dev_server))
    assert status == 413
    assert json.loads(content)["detail"].startswith(
        f"The request body is 104857600 bytes; POST /api/tasks/ accepts at most "
        f"{NEW_TASK_LIMIT} bytes"
    )


def test_the_development_server_refuses_a_chunked_body_with_411(dev_server, connect):
    body = json.dumps(SINGLE).encode()
    status, _, content = chunked_until_answered(connect(dev_server), "/api/tasks/", body)
    assert status == 411
    assert json.loads(content)["code"] == "length_required"
