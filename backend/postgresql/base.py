"""Django's PostgreSQL backend, with a cheaper check of a reused connection.

A reused connection is checked before a request uses it, so that one the server dropped (a
restart, a terminated backend, a pooler's recycling) is replaced instead of failing the
request. Django's checks are round trips: `SELECT 1` before the first query of every request
that reuses a persistent connection (`CONN_HEALTH_CHECKS`), and with a pool psycopg's
`check_connection`, an empty query each time a thread takes a connection from the pool. On the
dispatch cycle such a round trip per request was about a tenth of the server's CPU
(docs/performance-history.md, "Fewer round trips").

Between requests a connection has no query in flight, so a server that is still there has
nothing to say: Baton's request connections never `LISTEN` (the listener has a connection of
its own, `backend.dispatch.waiting`). A server that ends a session sends an error and closes
the socket, and a backend process that dies has its socket closed by the kernel; either way
the socket becomes readable. So a connection whose socket has nothing to read is usable as it
is, and only one with something waiting, one left inside a transaction (an aborted one fails
any query) or one whose socket cannot be checked gets the round trip, which reads what came
and judges it. The same judgement serves both: `DatabaseWrapper.is_usable` for persistent
connections (BATON_DATABASE_POOL_SIZE=none), `check_quiet_connection` for the pool's.
"""

from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool


class DatabaseWrapper(base.DatabaseWrapper):
    # Django's, which its type stubs leave out: the process's pools by alias, and what sets up a
    # new connection (time zone, role), which the pool runs on each connection it opens.
    _connection_pools: dict[str, ConnectionPool[Any]]
    _configure_connection: Callable[[psycopg.Connection[Any]], Any]

    def is_usable(self) -> bool:
        if self.connection is None or self.connection.closed:
            return False
        if _is_quiet(self.connection):
            return True
        return super().is_usable()

    @property
    def pool(self) -> ConnectionPool[Any] | None:
        """This process's pool for the alias, as Django builds it (`OPTIONS["pool"]`), with
        `check_quiet_connection` as its check where Django's would run a query for every
        connection handed out (Django passes its own `check`, so the pool's options cannot)."""
        options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not options:
            return None
        if self.alias not in self._connection_pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            connect_kwargs = self.get_connection_params()
            # Django sets the connection's autocommit when it takes it from the pool.
            connect_kwargs["autocommit"] = True
            pool: ConnectionPool[Any] = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,  # opened by the first connection the process asks for
                configure=self._configure_connection,
                check=(
                    check_quiet_connection if self.settings_dict["CONN_HEALTH_CHECKS"] else None
                ),
                **({} if options is True else options),
            )
            # Threads that race here build a pool each; the first one stored is everyone's.
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]


def check_quiet_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection it hands out: quiet, or psycopg's round trip
    (`ConnectionPool.check_connection`); raises when the connection is not usable."""
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    if not _is_quiet(conn):
        ConnectionPool.check_connection(conn)


def _is_quiet(conn: psycopg.Connection[Any]) -> bool:
    """Between transactions, with nothing from the server waiting on its socket."""
    return conn.info.transaction_status == TransactionStatus.IDLE and not _has_input(conn.fileno())


def _has_input(fileno: int) -> bool:
    """Whether the socket has bytes to read, or an end or an error to report (poll does not
    wait)."""
    try:
        poller = select.poll()
        poller.register(fileno, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # not checkable here: let the query decide
