"""Django's PostgreSQL backend, with a cheaper check of a reused connection.

With `CONN_HEALTH_CHECKS`, Django runs `SELECT 1` before the first query of every request that
reuses a connection, so that a connection the server dropped (a restart, a terminated backend,
a pooler's recycling) is replaced instead of failing the request. That is a round trip per
request: on the dispatch cycle, about a tenth of the server's CPU
(docs/performance-history.md, "Fewer round trips").

Between requests a connection has no query in flight, so a server that is still there has
nothing to say: Baton's request connections never `LISTEN` (the listener has a connection of
its own, `backend.dispatch.waiting`). A server that ends a session sends an error and closes
the socket, and a backend process that dies has its socket closed by the kernel; either way
the socket becomes readable. So a connection whose socket has nothing to read is usable as it
is, and only one with something waiting, one left inside a transaction (an aborted one fails
any query) or one whose socket cannot be checked gets Django's `SELECT 1`, which reads what
came and judges it.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        if self.connection is None or self.connection.closed:
            return False
        idle = self.connection.info.transaction_status == TransactionStatus.IDLE
        if idle and not _has_input(self.connection.fileno()):
            return True
        return super().is_usable()


def _has_input(fileno: int) -> bool:
    """Whether the socket has bytes to read, or an end or an error to report (poll does not
    wait)."""
    try:
        poller = select.poll()
        poller.register(fileno, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # not checkable here: let the query decide
