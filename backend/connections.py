"""A request thread's database connection while it waits for something other than the database.

A dispatch long poll waits at its process's bell for up to BATON_DISPATCH_MAX_WAIT_SECONDS, and
the event reader waits for its tasks' bells; neither needs a connection while it waits. With a
pool (PostgreSQL, BATON_DATABASE_POOL_SIZE), `release_while_waiting` hands the connection back
before such a wait, so idle waiters hold none and the pool's connections go to the threads that
query; the next query takes one again, with the statements it prepared (the pool keeps its
connections). Without a pool a thread's connection is its own for 60 s: it is kept, since
closing it would cost a new connection after every wait.
"""

from __future__ import annotations

from django.db import connection


def release_while_waiting() -> None:
    """Hand this thread's pooled connection back to the pool until its next query (never
    inside a transaction: a test's, for one)."""
    if connection.connection is None or connection.in_atomic_block:
        return
    if getattr(connection, "pool", None) is not None:  # only PostgreSQL's backend pools
        connection.close()
