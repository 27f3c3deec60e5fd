"""Wake-ups: telling the workers that wait in a dispatch that a turn became pending, and the
event streams of a task that its events committed.

Every write that makes an assistant turn pending (a new round, the next pipeline step, a
requeue, a summary job) calls `announce_pending` inside its transaction. Once the transaction
commits, waiters are woken: on PostgreSQL in every process, through `NOTIFY` on
PENDING_CHANNEL whose payload is the executor kind (each process's dispatch listener rings its
own `BELL`, see `backend.dispatch.waiting`); elsewhere in this process, through `BELL`. A
write that rolls back wakes nobody. A wake-up is a hint, never a claim: a waiter that wakes
claims through the exactly-once claim like any dispatch, and may find nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Protocol

from django.db import connection, transaction

from backend import queries

# The PostgreSQL channels; a notification's payload is one executor kind, or one task's id.
PENDING_CHANNEL = "baton_turn_pending"
EVENTS_CHANNEL = "baton_task_events"


class Doorbell:
    """One waiter's place at the bell, from before it looks for a turn until it stops
    waiting: a ring while it looks is kept, so no announcement falls between its look and its
    wait."""

    def __init__(self, bell: PendingBell, kinds: frozenset[str]) -> None:
        self.kinds = kinds
        self.rung = threading.Event()
        self._bell = bell

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a ring; True if there was one."""
        return self.rung.wait(timeout)

    def __enter__(self) -> Doorbell:
        self._bell._join(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._bell._leave(self)


class PendingBell:
    """Wakes the threads of this process that wait for a pending turn of some executor kinds.

    An announcement wakes one waiter of each of its kinds, the longest waiting, not all of
    them: one turn needs one worker, and a herd of waiters claiming at once would only delay
    the one that gets it. A waiter that was woken and claimed something passes the ring on
    (`claim_or_wait`), since one announcement may stand for several turns; one that finds
    nothing ends the chain. `ring_all` wakes every waiter (a listener that reconnected may
    have missed announcements).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._doorbells: list[Doorbell] = []  # in the order they began to wait

    def doorbell(self, kinds: Iterable[str]) -> Doorbell:
        """A place for a waiter, to enter (`with`) before it looks for a turn."""
        return Doorbell(self, frozenset(kinds))

    def ring(self, kinds: Iterable[str]) -> None:
        with self._lock:
            for kind in set(kinds):
                idle = (bell for bell in self._doorbells if kind in bell.kinds)
                for doorbell in idle:
                    if not doorbell.rung.is_set():  # a rung waiter is busy looking already
                        doorbell.rung.set()
                        break

    def ring_all(self) -> None:
        with self._lock:
            for doorbell in self._doorbells:
                doorbell.rung.set()

    def _join(self, doorbell: Doorbell) -> None:
        with self._lock:
            self._doorbells.append(doorbell)

    def _leave(self, doorbell: Doorbell) -> None:
        with self._lock:
            self._doorbells.remove(doorbell)


BELL = PendingBell()


def announce_pending(*, executors: Iterable[str]) -> None:
    """Wake the workers waiting for turns of these executor kinds once the current transaction
    commits (at once outside a transaction). A failure to notify is logged, never raised: the
    write is committed, and waiters find the turn at the end of their wait anyway."""
    kinds = sorted(set(executors))
    if kinds:
        transaction.on_commit(partial(_wake, kinds), robust=True)


def _wake(kinds: list[str]) -> None:
    if connection.vendor != "postgresql":
        BELL.ring(kinds)
        return
    # Every process's listener, this one's too, rings its bell once per notification.
    for kind in kinds:
        queries.fetch("notify", {"channel": PENDING_CHANNEL, "payload": kind})


class Flag(Protocol):
    def set(self) -> None: ...


class TaskEventBell:
    """Wakes the event streams of this process that follow a task (every one of them: each
    listener needs every event), and the feeds that read for them (`backend.api.event_feeds`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flags: dict[int, set[Flag]] = {}

    @contextmanager
    def watch(self, task_id: int) -> Iterator[threading.Event]:
        """A stream's flag, set by each ring for the task while the stream is inside."""
        rung = threading.Event()
        self.add(task_id, rung)
        try:
            yield rung
        finally:
            self.discard(task_id, rung)

    def add(self, task_id: int, flag: Flag) -> None:
        """Set `flag` on each ring for the task, until `discard`."""
        with self._lock:
            self._flags.setdefault(task_id, set()).add(flag)

    def discard(self, task_id: int, flag: Flag) -> None:
        with self._lock:
            flags = self._flags.get(task_id, set())
            flags.discard(flag)
            if not flags:
                self._flags.pop(task_id, None)

    def ring(self, task_id: int) -> None:
        with self._lock:
            flags = list(self._flags.get(task_id, ()))
        for flag in flags:
            flag.set()

    def ring_all(self) -> None:
        with self._lock:
            flags = [flag for task_flags in self._flags.values() for flag in task_flags]
        for flag in flags:
            flag.set()


EVENT_BELL = TaskEventBell()


def announce_events(*, task_id: int) -> None:
    """Wake the streams following the task once the current transaction commits."""
    transaction.on_commit(partial(_wake_streams, task_id), robust=True)


def _wake_streams(task_id: int) -> None:
    if connection.vendor != "postgresql":
        EVENT_BELL.ring(task_id)
        return
    queries.fetch("notify", {"channel": EVENTS_CHANNEL, "payload": str(task_id)})
