"""Whether a request's client is still connected (`api.client_connection`), on real loopback
TCP connections handed to the check as each WSGI server hands them to a view.

The whole path — a waiting dispatch behind gunicorn and Django's server whose worker hangs up —
is tested in tests/dispatch/test_long_polling_hang_up.py.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest
from django.test import RequestFactory

from backend.api.client_connection import client_still_connected


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the server's end, the client's end) of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    with server, client:
        yield server, client


def _request(**environ: object) -> HttpRequest:
    request = RequestFactory().post("/api/executor/dispatch/")
    request.META.update(environ)
    return request


def _gunicorn(server: socket.socket) -> HttpRequest:
    return _request(**{"gunicorn.socket": server})


def _django_server(server: socket.socket) -> HttpRequest:
    # What Django's ServerHandler makes of the connection's reader (basehttp).
    return _request(**{"wsgi.input": LimitedStream(server.makefile("rb"), 0)})


def _close(client: socket.socket) -> None:
    client.close()


def _reset(client: socket.socket) -> None:
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def _eventually_false(check: Callable[[], bool]) -> bool:
    """The check, once it turned False or after a few seconds (the FIN or RST is in flight)."""
    deadline = time.monotonic() + 5
    while check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


@pytest.mark.parametrize("server_kind", [_gunicorn, _django_server], ids=["gunicorn", "django"])
@pytest.mark.parametrize("hang_up", [_close, _reset], ids=["close", "reset"])
def test_a_client_that_hangs_up_is_seen_gone(connection, server_kind, hang_up):
    server, client = connection
    still_connected = client_still_connected(server_kind(server))
    assert still_connected()
    hang_up(client)
    assert _eventually_false(still_connected) is False


def test_a_request_sent_ahead_neither_counts_as_a_hang_up_nor_is_read(connection):
    server, client = connection
    still_connected = client_still_connected(_gunicorn(server))
    client.sendall(b"GET /api/health/ HTTP/1.1\r\n")
    time.sleep(0.05)
    assert still_connected()
    assert server.recv(100) == b"GET /api/health/ HTTP/1.1\r\n"


@pytest.mark.parametrize(
    "environ",
    [
        {},  # Django's test client: a FakePayload
        {"wsgi.input": io.BytesIO(b"{}")},
        {"wsgi.input": LimitedStream(io.BytesIO(b"{}"), 2)},
    ],
    ids=["test-client", "bytes", "limited-bytes"],
)
def test_without_a_socket_to_look_at_the_client_is_assumed_connected(environ):
    assert client_still_connected(_request(**environ))()


def test_a_body_that_is_no_socket_is_not_taken_for_the_connection():
    """A pipe whose writer is done reports a hang-up when polled: it says nothing of a client."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    with os.fdopen(read_end, "rb") as body:
        assert client_still_connected(_request(**{"wsgi.input": LimitedStream(body, 0)}))()
