"""Wake-ups: telling the workers that wait in a dispatch that a turn became pending.

Every write that makes an assistant turn pending (a new round, the next pipeline step, a
requeue, a summary job) calls `announce_pending` inside its transaction. Once the transaction
commits, the waiters are woken: those of this process through `BELL`, and on PostgreSQL those
of every process through `NOTIFY` on PENDING_CHANNEL, whose payload is the executor kind (the
dispatch listener rings its own process's bell, see `backend.dispatch.waiting`). A write that
rolls back wakes nobody. A wake-up is a hint, never a claim: a waiter that wakes claims
through the exactly-once claim like any dispatch, and may find nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import partial

from django.db import connection, transaction

# The PostgreSQL channel; a notification's payload is one executor kind.
PENDING_CHANNEL = "baton_turn_pending"


class PendingBell:
    """Wakes the threads of this process that wait for a pending turn of some executor kinds.

    Each kind has a counter that every ring moves on. A waiter takes a `mark` before it looks
    for a turn and waits for the mark to go stale, so a ring between its look and its wait is
    never lost. `ring_all` wakes every waiter (a listener that reconnected may have missed
    notifications).
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._rings: dict[str, int] = {}
        self._everyone = 0

    def mark(self, kinds: Iterable[str]) -> tuple[int, ...]:
        with self._changed:
            return self._mark(kinds)

    def ring(self, kinds: Iterable[str]) -> None:
        with self._changed:
            for kind in kinds:
                self._rings[kind] = self._rings.get(kind, 0) + 1
            self._changed.notify_all()

    def ring_all(self) -> None:
        with self._changed:
            self._everyone += 1
            self._changed.notify_all()

    def wait(self, mark: tuple[int, ...], *, kinds: Iterable[str], timeout: float) -> bool:
        """Wait up to `timeout` seconds for a ring of one of `kinds` after `mark` was taken;
        True if there was one."""
        kinds = list(kinds)
        with self._changed:
            return self._changed.wait_for(lambda: self._mark(kinds) != mark, timeout=timeout)

    def _mark(self, kinds: Iterable[str]) -> tuple[int, ...]:
        return (self._everyone, *(self._rings.get(kind, 0) for kind in kinds))


BELL = PendingBell()


def announce_pending(*, executors: Iterable[str]) -> None:
    """Wake the workers waiting for turns of these executor kinds once the current transaction
    commits (at once outside a transaction). A failure to notify is logged, never raised: the
    write is committed, and waiters find the turn at the end of their wait anyway."""
    kinds = sorted(set(executors))
    if kinds:
        transaction.on_commit(partial(_wake, kinds), robust=True)


def _wake(kinds: list[str]) -> None:
    BELL.ring(kinds)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for kind in kinds:
                cursor.execute("SELECT pg_notify(%s, %s)", [PENDING_CHANNEL, kind])
