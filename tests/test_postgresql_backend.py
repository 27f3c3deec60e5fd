"""A reused PostgreSQL connection — a thread's own, or one from the process's pool — is checked
without a round trip while the server has nothing to say, and replaced when the server has
dropped it (`backend.postgresql`)."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from django.db import OperationalError, connection
from psycopg_pool import PoolTimeout

from backend.api.errors import pool_exhausted
from backend.postgresql.base import DatabaseWrapper, _has_input

pytestmark = [pytest.mark.django_db, pytest.mark.postgres_only]


@pytest.fixture
def request_connection():
    """A connection of Baton's backend to the test database, reused across requests as the
    settings without a pool reuse one (its own, so that ending it leaves the test's alone)."""
    options = {
        name: value for name, value in connection.settings_dict["OPTIONS"].items() if name != "pool"
    }
    wrapper = DatabaseWrapper(
        {
            **connection.settings_dict,
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": options,
        },
        "probe",
    )
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


# --- The pool (BATON_DATABASE_POOL_SIZE) -------------------------------------------------------


@pytest.fixture
def pooled_connection():
    """A connection of Baton's backend to the test database through a pool of one connection
    (its own alias, so its own pool), handed back to the pool when a request would end."""
    settings_dict = {
        **connection.settings_dict,
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {
            **connection.settings_dict["OPTIONS"],
            "pool": {"min_size": 1, "max_size": 1, "timeout": 0.5},
        },
    }
    wrapper = DatabaseWrapper(settings_dict, "pool-probe")
    yield wrapper
    wrapper.close()
    wrapper.close_pool()


def test_the_pool_hands_out_a_quiet_connection_without_a_query(pooled_connection, server):
    pid = _backend_pid(pooled_connection)
    marker = f"SELECT 'last query {uuid.uuid4().hex}'"
    with pooled_connection.cursor() as cursor:
        cursor.execute(marker)
    pooled_connection.close()  # the request's end: back to the pool
    assert pooled_connection.connection is None

    pooled_connection.ensure_connection()  # the next request takes it again, checked

    # The pool's check ran no query on the server: same session, the marker is its last.
    assert _last_query(server, pid) == marker
    assert _backend_pid(pooled_connection) == pid


def test_the_pool_replaces_a_connection_the_server_ended(pooled_connection, server):
    pid = _backend_pid(pooled_connection)
    pooled_connection.close()
    assert server.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0] is True
    deadline = time.monotonic() + 10
    while server.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
        assert time.monotonic() < deadline, "the backend did not end"
        time.sleep(0.01)

    # The request's first query runs on a new session instead of failing.
    assert _backend_pid(pooled_connection) != pid


def test_the_pool_keeps_what_its_connections_prepared(pooled_connection):
    statement = "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s"
    probe = f"%probe {uuid.uuid4().hex}%"
    threshold = pooled_connection.settings_dict["OPTIONS"]["prepare_threshold"]
    for _ in range(threshold + 2):
        with pooled_connection.cursor() as cursor:
            cursor.execute(f"SELECT 'probe {probe[1:-1]}' WHERE %s", [True])
        pooled_connection.close()
    with pooled_connection.cursor() as cursor:
        cursor.execute(statement, [probe])
        assert cursor.fetchone()[0] == 1


def test_a_pool_with_no_free_connection_gives_up_after_its_timeout(pooled_connection):
    pooled_connection.ensure_connection()  # the pool's only connection, held
    other_thread = DatabaseWrapper(pooled_connection.settings_dict, "pool-probe")
    started = time.monotonic()
    with pytest.raises(OperationalError) as raised:
        other_thread.ensure_connection()
    assert 0.4 < time.monotonic() - started < 3
    assert isinstance(raised.value.__cause__, PoolTimeout)
    assert pool_exhausted(raised.value)

    pooled_connection.close()
    other_thread.ensure_connection()  # a connection handed back serves the next request
    other_thread.close()
