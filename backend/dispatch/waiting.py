"""Long polling: an idle worker's dispatch waits for a turn instead of the worker polling.

A dispatch with `wait_seconds` that claims nothing holds the request until it claims a turn or
the wait ends (at most BATON_DISPATCH_MAX_WAIT_SECONDS), and then answers like any dispatch.
Every claim goes through `claims.claim_turns`, so exactly-once holds however many waiters
wake for one turn.

How a waiter learns that a turn may be there:
- PostgreSQL: one listener thread per server process keeps a connection of its own that
  `LISTEN`s on the channel writers `NOTIFY` (`backend.tasks.wakeups`), and rings the
  process's bell, which wakes one waiter per announcement (a woken waiter that claimed
  something wakes the next); the waiters sleep and cost nothing while nothing happens. A
  waiter also wakes when a turn it saw pending becomes claimable by the clock (a retry
  backoff or a session hold ends, `claims.next_ready_in_seconds`).
- SQLite, or PostgreSQL while the listener is not connected: every POLL_SECONDS a cheap
  EXISTS query (woken early by writes of the same process).
A lease that runs out during a wait is reclaimed by the next dispatch call, as before: at
the latest when some waiter's wait ends. With a connection pool a waiter hands its connection
back before it waits (`backend.connections`), so idle waiters hold none; the listener's
connection is its own, outside the pool (a `LISTEN` belongs to a session).

A waiter whose client hung up (a worker that stopped) stops waiting and claims nothing: the
API layer passes `still_connected`, which the waiter asks while it waits and right before each
claim.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from backend.connections import release_while_waiting
from backend.dispatch.claims import claim_turns, claimable_exists, next_ready_in_seconds
from backend.dispatch.payload import ClaimedTurn
from backend.events import log_event, opaque_id
from backend.tasks.wakeups import BELL, EVENT_BELL, EVENTS_CHANNEL, PENDING_CHANNEL, Doorbell

# How often a waiter without a listener looks for a claimable turn.
POLL_SECONDS = 0.05
# How long a waiter lets the listener connect before it polls instead.
LISTEN_CONNECT_SECONDS = 2.0
# Pause before the listener reconnects after losing its connection.
LISTEN_RETRY_SECONDS = 1.0
# How often a waiter at the bell looks whether its client is still connected (a polling
# waiter looks at every poll).
CLIENT_CHECK_SECONDS = 1.0


def _assume_connected() -> bool:
    return True


def claim_or_wait(
    *,
    worker: User,
    worker_id: str,
    kinds: Sequence[str],
    limit: int,
    wait_seconds: float,
    still_connected: Callable[[], bool] = _assume_connected,
) -> list[ClaimedTurn]:
    """Claim like `claim_turns`; with nothing to claim, wait up to `wait_seconds` for a turn
    and claim it. Empty when the wait ended with nothing claimed, or when the client hung up.

    `still_connected()` says whether the client still waits for the answer (the default, for
    a caller that cannot tell, assumes it does). A turn claimed for a client that is gone
    could never be delivered: it would stay RUNNING, its attempt used, until its lease
    expired. So the waiter asks right before each claim (the first too: a loaded server may
    come to a request after its client left) and while it waits (every poll, or every
    CLIENT_CHECK_SECONDS at the bell), and once the client is gone it returns empty, handing
    a wake-up it took to the next waiter. What is left is the instant between that last
    check and the answer: a client that hangs up there leaves its turn RUNNING until the
    lease expires, when the next dispatch reclaims it and requeues it.
    """
    deadline = time.monotonic() + wait_seconds
    listening = wait_seconds > 0 and connection.vendor == "postgresql" and LISTENER.start()
    woken = False
    while True:
        # At the bell before the claim, so a turn announced after it wakes the wait below.
        with BELL.doorbell(kinds) as doorbell:
            if not still_connected():
                if woken or doorbell.rung.is_set():
                    BELL.ring(kinds)  # the wake-up may stand for a turn: another waiter looks
                log_event("dispatch_client_gone", worker_id=opaque_id(worker_id))
                return []
            claimed = claim_turns(worker=worker, worker_id=worker_id, kinds=kinds, limit=limit)
            remaining = deadline - time.monotonic()
            if claimed or remaining <= 0:
                if (claimed and woken) or doorbell.rung.is_set():
                    # One announcement may stand for more turns: the next waiter looks.
                    BELL.ring(kinds)
                return claimed
            if listening and LISTENER.connected:
                ready_in = next_ready_in_seconds(kinds=kinds, worker_id=worker_id)
                # A turn claimable now that another worker took first: look again shortly.
                pause = (
                    remaining if ready_in is None else min(remaining, max(ready_in, POLL_SECONDS))
                )
                release_while_waiting()
                woken = _wait_at_bell(doorbell, pause, still_connected=still_connected)
            else:
                woken = _poll_until_claimable(
                    doorbell,
                    kinds=kinds,
                    worker_id=worker_id,
                    deadline=deadline,
                    listening=listening,
                    still_connected=still_connected,
                )


def _wait_at_bell(
    doorbell: Doorbell, seconds: float, *, still_connected: Callable[[], bool]
) -> bool:
    """Until the bell rings, `seconds` pass or the client hangs up; True when the bell rang."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        if doorbell.wait(min(CLIENT_CHECK_SECONDS, remaining)):
            return True
        if not still_connected():
            return False
    return False


def _poll_until_claimable(
    doorbell: Doorbell,
    *,
    kinds: Sequence[str],
    worker_id: str,
    deadline: float,
    listening: bool,
    still_connected: Callable[[], bool],
) -> bool:
    """Until a turn is claimable, the bell rings, the wait ends, the listener (re)connects or
    the client hangs up; True when the bell rang."""
    while (remaining := deadline - time.monotonic()) > 0:
        release_while_waiting()
        if doorbell.wait(min(POLL_SECONDS, remaining)):
            return True
        if listening and LISTENER.connected:
            return False
        if not still_connected():
            return False
        if claimable_exists(kinds=kinds, worker_id=worker_id, now=timezone.now()):
            return False
    return False


class PendingListener:
    """The process's PostgreSQL listener: a daemon thread with its own autocommit connection
    that LISTENs on PENDING_CHANNEL and rings `BELL` with each notification's executor kind,
    and on EVENTS_CHANNEL, ringing `EVENT_BELL` for the notification's task.

    Started by the first waiter (or event stream). After a lost connection it reconnects; on
    connecting and on losing the connection it rings every waiter, since notifications may
    have been missed (the waiters look again, and poll while it is away).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._attempted = threading.Event()
        self._stop = threading.Event()
        self.connected = False

    def start(self) -> bool:
        """Start the thread unless it runs; True once it listens (waiting a little for it)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._attempted.clear()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(connection.get_connection_params(),),
                    name="baton-pending-listener",
                    daemon=True,
                )
                self._thread.start()
        self._attempted.wait(LISTEN_CONNECT_SECONDS)
        return self.connected

    def stop(self) -> None:
        """Close the connection and end the thread (a test database is about to be dropped)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self, params: dict[str, Any]) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as listening:
                    listening.execute(f"LISTEN {PENDING_CHANNEL}")
                    listening.execute(f"LISTEN {EVENTS_CHANNEL}")
                    self._set_connected(True)
                    log_event("dispatch_listener_connected")
                    while not self._stop.is_set():
                        # The timeout only lets the thread see a stop.
                        for notify in listening.notifies(timeout=1.0):
                            if notify.channel == EVENTS_CHANNEL:
                                EVENT_BELL.ring(int(notify.payload))
                            else:
                                BELL.ring([notify.payload])
            except psycopg.Error as error:
                if not self._stop.is_set():
                    log_event(
                        "dispatch_listener_lost",
                        level=logging.WARNING,
                        error=type(error).__name__,
                    )
            finally:
                self._set_connected(False)
            self._stop.wait(LISTEN_RETRY_SECONDS)

    def _set_connected(self, connected: bool) -> None:
        changed = connected != self.connected
        self.connected = connected
        if changed:
            BELL.ring_all()
            EVENT_BELL.ring_all()
        # After the ring: a waiter that `start` let through misses no notification.
        self._attempted.set()


LISTENER = PendingListener()
