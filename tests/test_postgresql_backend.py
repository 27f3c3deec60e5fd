"""A reused PostgreSQL connection is checked without a round trip while the server has nothing
to say, and replaced when the server has dropped it (`backend.postgresql`)."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from django.db import connection

from backend.postgresql.base import DatabaseWrapper, _has_input

pytestmark = [pytest.mark.django_db, pytest.mark.postgres_only]


@pytest.fixture
def request_connection():
    """A connection of Baton's backend to the test database, reused across requests as the
    production settings reuse one (its own, so that ending it leaves the test's alone)."""
    wrapper = DatabaseWrapper({**connection.settings_dict, "CONN_HEALTH_CHECKS": True}, "probe")
    wrapper.ensure_connection()
    yield wrapper
    wrapper.close()


@pytest.fixture
def server():
    """A separate session that watches and ends the request connection's backend."""
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as admin:
        yield admin


def _backend_pid(wrapper: DatabaseWrapper) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _last_query(server, pid: int) -> str:
    return server.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]


def _until_readable(wrapper: DatabaseWrapper) -> None:
    deadline = time.monotonic() + 10
    while not _has_input(wrapper.connection.fileno()):
        assert time.monotonic() < deadline, "the server never wrote to the connection"
        time.sleep(0.01)


def _next_request(wrapper: DatabaseWrapper) -> None:
    """What Django does when a request starts: the next query runs the health check first."""
    wrapper.close_if_unusable_or_obsolete()


def test_a_quiet_connection_is_reused_without_a_query(request_connection, server):
    pid = _backend_pid(request_connection)
    marker = f"SELECT 'last query {uuid.uuid4().hex}'"
    with request_connection.cursor() as cursor:
        cursor.execute(marker)

    _next_request(request_connection)
    assert request_connection.is_usable() is True
    request_connection.close_if_health_check_failed()

    # The server saw no `SELECT 1`: the marker is still the session's last statement, and the
    # session is the same one.
    assert _last_query(server, pid) == marker
    assert _backend_pid(request_connection) == pid


def test_a_connection_the_server_ended_is_replaced_before_the_next_query(
    request_connection, server
):
    pid = _backend_pid(request_connection)
    _next_request(request_connection)
    assert server.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0] is True
    _until_readable(request_connection)

    assert request_connection.is_usable() is False
    # The request's first query runs on a new session instead of failing.
    assert _backend_pid(request_connection) != pid


def test_a_live_connection_with_something_to_read_is_judged_by_a_query(request_connection, server):
    """A notice or notification waiting on the socket is not an ended session: the check
    reads it with Django's `SELECT 1` and keeps the connection."""
    channel = f"probe_{uuid.uuid4().hex}"
    with request_connection.cursor() as cursor:
        cursor.execute(f"LISTEN {channel}")
    pid = _backend_pid(request_connection)
    server.execute("SELECT pg_notify(%s, 'hello')", [channel])
    _until_readable(request_connection)

    assert request_connection.is_usable() is True
    assert _last_query(server, pid) == "SELECT 1"
    assert _backend_pid(request_connection) == pid


def test_a_connection_left_in_a_failed_transaction_is_judged_by_a_query(request_connection):
    request_connection.set_autocommit(False)
    with pytest.raises(psycopg.errors.DivisionByZero):
        request_connection.connection.execute("SELECT 1 / 0")
    assert request_connection.is_usable() is False
