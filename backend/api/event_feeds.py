"""Shared readers for live event streams: one read per server process and task, whatever the
number of streams that follow the task.

A stream that has caught up subscribes to its task's feed; on PostgreSQL it also lets go of its
database connection. The feed is filled by one reader thread per process, with a connection of
its own: woken by the task's bell (a NOTIFY the process's listener heard — see
`backend.dispatch.waiting.LISTENER` —, a write of this process, or the listener reconnecting),
or every POLL_SECONDS where no NOTIFY comes (SQLite, or PostgreSQL while the listener is away),
it reads the events after the newest it holds, renders each as an SSE frame once, and wakes
every subscribed stream, which sends the frames after its own cursor. So a process with 200
open streams holds one connection for them (besides the listener's) — with a pool, only while
it reads (it hands the connection back before each wait) —, makes one query per task per
wake-up and encodes each event once.

A feed keeps the last BUFFER_EVENTS frames it read. A stream whose cursor is older than what
the feed holds (it joined with an older cursor, or fell far behind) reads the gap from storage
itself; the feed never skips an event (each read takes everything after the newest it holds,
and the log commits in number order), so a stream that reads from it sees no gap and no
duplicate. While the reader is not running (it ended on a bug), streams read storage
themselves.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection

from backend.connections import release_while_waiting
from backend.dispatch.waiting import LISTENER
from backend.events import log_event
from backend.tasks.models import Task, TaskEvent
from backend.tasks.wakeups import EVENT_BELL
from backend.webhooks.services import turn_page_path

BUFFER_EVENTS = 1000
# Events read from storage per query.
READ_BATCH = 200
# How often the reader reads every feed when no NOTIFY tells it of new events.
POLL_SECONDS = 0.05
# Pause before the reader reads again after a database error.
RETRY_SECONDS = 1.0


def sse_frame(event: TaskEvent) -> str:
    payload = {
        "seq": event.seq,
        "type": event.type,
        "task_id": event.task_id,
        "created_at": event.created_at,
        **event.data,
    }
    if "text_omitted_chars" in event.data and "message_id" in event.data:
        # A progress event holds at most PROGRESS_TEXT_CHARS of new text: the turn's page of
        # the task's turns has its whole partial text.
        payload["partial_text_url"] = turn_page_path(
            task_id=event.task_id, message_id=event.data["message_id"]
        )
    body = json.dumps(payload, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":"))
    # JSON has no raw line breaks, so the data is one `data:` line.
    return f"id: {event.seq}\nevent: {event.type}\ndata: {body}\n\n"


def read_after(task_id: int, cursor: int) -> list[TaskEvent]:
    """The task's events after `cursor` from storage, oldest first, at most READ_BATCH."""
    return list(
        TaskEvent.objects.filter(task_id=task_id, seq__gt=cursor).order_by("seq")[:READ_BATCH]
    )


class Feed:
    """One task's recent events as frames, newest last: every event numbered in (`base`,
    `head`] is among them."""

    def __init__(self, task_id: int, head: int, *, on_ring: Callable[[Feed], None]) -> None:
        self.task_id = task_id
        self.base = head
        self.head = head
        self._seqs: deque[int] = deque()
        self._frames: deque[str] = deque()
        self._changed = threading.Condition()
        self._on_ring = on_ring
        self.subscribers = 0

    def set(self) -> None:
        """The task's bell rang (the flag protocol of `TaskEventBell.watch`)."""
        self._on_ring(self)

    def frames_after(self, cursor: int) -> list[tuple[int, str]] | None:
        """(seq, frame) of the events after `cursor` that the feed holds, oldest first; None
        when the feed no longer holds all of them (the caller reads storage)."""
        with self._changed:
            if cursor < self.base:
                return None
            # From the newest back: a stream that keeps up wants the last few frames.
            newer: list[tuple[int, str]] = []
            for seq, frame in zip(reversed(self._seqs), reversed(self._frames), strict=True):
                if seq <= cursor:
                    break
                newer.append((seq, frame))
            newer.reverse()
            return newer

    def wait(self, cursor: int, timeout: float) -> None:
        """Until the feed holds an event after `cursor`, or `timeout` passes."""
        with self._changed:
            self._changed.wait_for(lambda: self.head > cursor, timeout)

    def extend(self, events: list[tuple[int, str]]) -> None:
        with self._changed:
            for seq, frame in events:
                if seq <= self.head:
                    continue
                self._seqs.append(seq)
                self._frames.append(frame)
                self.head = seq
            while len(self._seqs) > BUFFER_EVENTS:
                self.base = self._seqs.popleft()
                self._frames.popleft()
            self._changed.notify_all()


class EventFeeds:
    """The process's feeds, by task, and the thread that reads them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._feeds: dict[int, Feed] = {}
        self._due: set[int] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0
        """Queries the reader made (for tests and benchmarks)."""

    @contextmanager
    def subscribe(self, task_id: int, cursor: int) -> Iterator[Feed]:
        """The task's feed while the caller follows it. A new feed starts at `cursor` (the
        caller has read every event up to it) and reads at once what came since."""
        with self._lock:
            feed = self._feeds.get(task_id)
            if feed is None:
                feed = self._feeds[task_id] = Feed(task_id, cursor, on_ring=self._ring)
                EVENT_BELL.add(task_id, feed)
                self._due.add(task_id)
                self._wake.set()
            self._start()
            feed.subscribers += 1
        try:
            yield feed
        finally:
            with self._lock:
                feed.subscribers -= 1
                if feed.subscribers == 0 and self._feeds.get(task_id) is feed:
                    del self._feeds[task_id]
                    EVENT_BELL.discard(task_id, feed)

    @property
    def reading(self) -> bool:
        """Whether the reader thread runs: a stream whose feed has no reader reads storage."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def stop(self) -> None:
        """End the reader and close its connection (a test database is about to be dropped)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._wake.set()
        if thread is not None:
            thread.join(timeout=5)

    def _ring(self, feed: Feed) -> None:
        with self._lock:
            self._due.add(feed.task_id)
        self._wake.set()

    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="baton-event-feeds", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_look = time.monotonic()
        try:
            while not self._stop.is_set():
                # Without a listener to hear other processes' NOTIFY (SQLite, or PostgreSQL
                # while it reconnects), the reader looks every POLL_SECONDS for feeds whose
                # task has numbered events past what they hold.
                # (Rings for this process's own writes do not put the look off.)
                notified = connection.vendor == "postgresql" and LISTENER.connected
                release_while_waiting()
                self._wake.wait(None if notified else max(next_look - time.monotonic(), 0.0))
                self._wake.clear()
                with self._lock:
                    due = {task: self._feeds[task] for task in self._due if task in self._feeds}
                    self._due.clear()
                    feeds = dict(self._feeds)
                try:
                    if not notified and time.monotonic() >= next_look:
                        next_look = time.monotonic() + POLL_SECONDS
                        if feeds:
                            due.update(_behind(feeds))
                    for feed in due.values():
                        if self._stop.is_set():
                            break
                        self._read(feed)
                except DatabaseError as error:  # the database went away: read again later
                    log_event(
                        "event_feed_read_failed", level=logging.WARNING, error=type(error).__name__
                    )
                    connection.close()
                    with self._lock:
                        self._due.update(due)
                    self._stop.wait(RETRY_SECONDS)
        except BaseException as error:
            # A bug, not the database: the thread ends, its streams read storage themselves,
            # and the next new feed starts a reader again.
            log_event("event_feed_reader_ended", level=logging.ERROR, error=type(error).__name__)
            raise
        finally:
            connection.close()

    def _read(self, feed: Feed) -> None:
        while True:
            events = read_after(feed.task_id, feed.head)
            self.reads += 1
            feed.extend([(event.seq, sse_frame(event)) for event in events])
            if len(events) < READ_BATCH:
                return


def _behind(feeds: dict[int, Feed]) -> dict[int, Feed]:
    """The feeds whose task has committed an event after the newest they hold: one query for
    all of them (a task's counter is the number its next event will get)."""
    counters = Task.objects.filter(pk__in=list(feeds)).values_list("pk", "next_event_seq")
    return {task: feeds[task] for task, counter in counters if counter - 1 > feeds[task].head}


FEEDS = EventFeeds()
