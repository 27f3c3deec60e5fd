"""Requests Baton cannot take are 4xx JSON errors naming the problem, never 500s: a NUL in a
path's name or id (PostgreSQL refuses NUL in text), and, under gunicorn over a real socket, a
chunked body whose size line is not hexadecimal, one cut off by the client, and one that
stalls (cut off after BATON_REQUEST_BODY_TIMEOUT_SECONDS, the server answering on)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.api.test_body_limits_http import (
    REPO_ROOT,
    Server,
    _answer,
    _free_port,
    _head,
    connect,  # noqa: F401 (a fixture)
    gunicorn_serving,
)

NUL_DETAIL = "The URL's path holds a NUL character, which no id or name can contain."
BODY_TIMEOUT_SECONDS = 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/bots/a%00b/",
        "/api/artifacts/a%00b/",
        "/api/artifacts/a%00b/content/",
        "/api/policies/a%00b/",
        "/api/bots/%00/",
    ],
)
def test_a_nul_in_a_path_name_is_a_400_naming_it(api, path):
    response = api.get(path)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": NUL_DETAIL, "code": "bad_request"}


@pytest.mark.django_db
def test_a_name_without_nul_is_looked_up_as_before(api):
    assert api.get("/api/bots/no-such-bot/").json()["code"] == "not_found"


# --- gunicorn, as `make serve` runs it -----------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Server]:
    """Baton under gunicorn with backend/gunicorn_conf.py (gthread), a short body timeout."""
    var_dir = tmp_path_factory.mktemp("gunicorn-bodies")
    env = {
        **os.environ,
        "DATABASE_URL": "",
        "BATON_VAR_DIR": str(var_dir),
        "BATON_REQUEST_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT_SECONDS),
        "BATON_LOG_LEVEL": "WARNING",
        "BATON_WEB_THREADS": "2",
        "BATON_MAX_EVENT_STREAMS": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
    )
    token = subprocess.run(
        [sys.executable, "manage.py", "create_worker", "worker-bodies"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    port = _free_port()
    with gunicorn_serving(
        ["-c", "python:backend.gunicorn_conf", "backend.wsgi", "--workers", "1"],
        env=env,
        port=port,
        worker_token=token,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as server:
        yield server


DISPATCH = "/api/executor/dispatch/"
BODY = json.dumps({"kinds": ["codex"], "worker_id": "w1"}).encode()


def chunked(server: Server, sock: socket.socket, raw_body: bytes) -> None:
    head = _head(DISPATCH, token=server.worker_token, Transfer_Encoding="chunked")
    sock.sendall(head + raw_body)


def still_answers(server: Server, connect) -> None:  # noqa: F811 (the fixture, passed on)
    sock = connect(server)
    head = _head(DISPATCH, token=server.worker_token, Content_Length=str(len(BODY)))
    sock.sendall(head + BODY)
    status, _, content = _answer(sock)
    assert status == 200, content


def error_of(sock: socket.socket) -> tuple[int, dict[str, object]]:
    status, headers, content = _answer(sock)
    assert headers["Content-Type"] == "application/json", content
    return status, json.loads(content)


def test_a_chunk_size_that_is_not_hexadecimal_is_a_400(served, connect):  # noqa: F811
    sock = connect(served)
    chunked(served, sock, b"zz\r\n" + BODY + b"\r\n0\r\n\r\n")
    status, body = error_of(sock)
    assert status == 400
    assert body["code"] == "malformed_body"
    assert "chunked encoding is malformed" in str(body["detail"])
    still_answers(served, connect)


def test_a_chunked_body_cut_off_by_the_client_is_a_400(served, connect):  # noqa: F811
    sock = connect(served)
    chunked(served, sock, f"{len(BODY) + 100:x}\r\n".encode() + BODY)
    sock.shutdown(socket.SHUT_WR)  # the client sends no more, and still reads the answer
    status, body = error_of(sock)
    assert status == 400
    assert body["code"] == "incomplete_body"
    still_answers(served, connect)


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_stalled_body_is_cut_off_with_a_408(served, connect, framing):  # noqa: F811
    sock = connect(served)  # its timeout (HANG_GUARD_SECONDS) fails the test if none comes
    if framing == "chunked":
        chunked(served, sock, f"{len(BODY) + 100:x}\r\n".encode() + BODY)
    else:
        head = _head(DISPATCH, token=served.worker_token, Content_Length=str(len(BODY) + 100))
        sock.sendall(head + BODY)
    # ...and then nothing, the connection kept open.
    status, body = error_of(sock)
    assert status == 408
    assert body == {
        "detail": f"The request body stalled: no bytes came for {BODY_TIMEOUT_SECONDS} seconds "
        "(BATON_REQUEST_BODY_TIMEOUT_SECONDS).",
        "code": "body_timeout",
    }
    still_answers(served, connect)
