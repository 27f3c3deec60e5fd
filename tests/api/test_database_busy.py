"""A request that finds every connection of its process's database pool in use is answered at
once with 503 `busy` and Retry-After, in a view or before one, never a 500 with a traceback.

Django raises a wait for a pooled connection that timed out as an OperationalError caused by
psycopg's PoolTimeout (`tests/test_postgresql_backend.py` makes a real one; `tests/e2e/
test_connection_pool.py` answers one over HTTP): these tests raise that shape where a request
would meet it.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.contrib.sessions.middleware import SessionMiddleware
from django.db import OperationalError
from psycopg_pool import PoolTimeout

from backend.api import views
from backend.api.errors import pool_exhausted

BUSY = {
    "detail": "Every database connection of this server process is in use; retry in a second.",
    "code": "busy",
}


def _pool_timeout() -> OperationalError:
    """What Django raises when the pool has no connection for it in time."""
    try:
        try:
            raise PoolTimeout("couldn't get a connection after 5.00 sec")
        except PoolTimeout as cause:
            raise OperationalError(*cause.args) from cause
    except OperationalError as error:
        return error


def _events(caplog) -> list[dict[str, object]]:
    return [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "baton.events"
    ]


def test_a_pool_timeout_in_a_view_is_503_busy_with_retry_after(api, monkeypatch, caplog):
    def wait_for_a_connection(self, request):
        raise _pool_timeout()

    monkeypatch.setattr(views.TaskListCreateApi, "get", wait_for_a_connection)
    with caplog.at_level(logging.INFO):
        response = api.get("/api/tasks/")

    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.json() == BUSY
    assert {"event": "database_pool_exhausted"} in _events(caplog)
    assert not [record for record in caplog.records if record.exc_info]


def test_a_pool_timeout_before_the_view_is_503_busy_too(api, monkeypatch, caplog):
    def wait_for_a_connection(self, request):
        raise _pool_timeout()

    monkeypatch.setattr(SessionMiddleware, "process_request", wait_for_a_connection)
    api.raise_request_exception = False
    with caplog.at_level(logging.INFO):
        response = api.get("/api/tasks/")

    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "1"
    assert response.json() == BUSY
    events = _events(caplog)
    assert {"event": "database_pool_exhausted"} in events
    assert not [event for event in events if event["event"] == "request_failed"]
    assert not [record for record in caplog.records if record.exc_info]


def test_other_database_errors_stay_500(api, monkeypatch):
    def fail(self, request):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(views.TaskListCreateApi, "get", fail)
    api.raise_request_exception = False
    response = api.get("/api/tasks/")
    assert response.status_code == 500
    assert response.json()["code"] == "server_error"


@pytest.mark.parametrize(
    ("error", "exhausted"),
    [
        (_pool_timeout(), True),
        (PoolTimeout("couldn't get a connection"), True),
        (OperationalError("server closed the connection unexpectedly"), False),
        (RuntimeError("no"), False),
        (None, False),
    ],
)
def test_pool_exhausted_knows_a_pool_timeout_by_its_cause(error, exhausted):
    assert pool_exhausted(error) is exhausted
