"""A task's events as Server-Sent Events: a product follows its task live and resumes after a
disconnect with `Last-Event-ID`, missing nothing and getting nothing twice.

The stream reads the task's event log (`backend.tasks.task_events`): first what came after the
client's last event id, from storage, then new events as they commit, from its task's feed
(`backend.api.event_feeds`): one reader per process reads each new event once for every stream
of the task — on PostgreSQL when the process's listener hears the task's NOTIFY
(`backend.tasks.wakeups`), elsewhere every 50 ms — and on PostgreSQL the stream holds no
database connection while it waits. Every event's `id:` is its number in the task's sequence; a
turn's `turn.progress` events are deleted when its attempt ends, so a stream that reads them
from storage after that skips their numbers. The stream ends after BATON_EVENT_STREAM_SECONDS,
or when the client hangs up (looked at every second); a client (EventSource does this by itself)
reconnects with the last id it got. Comment lines keep idle connections open through proxies.
Each stream holds one of its server process's request threads while it is open, so a process
serves at most BATON_MAX_EVENT_STREAMS of them at once and answers 503 with Retry-After beyond
that, keeping threads free for the rest of the API.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack

from django.conf import settings
from django.db import connection
from django.http import HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.views import APIView

from backend.api.artifact_views import JSONErrorsNegotiation
from backend.api.client_connection import client_still_connected
from backend.api.errors import ErrorOutput
from backend.api.event_feeds import FEEDS, Feed, read_after, sse_frame
from backend.api.permissions import IsProductClient, authenticated_user
from backend.api.renderers import BatonJSONRenderer
from backend.connections import release_while_waiting
from backend.dispatch.waiting import CLIENT_CHECK_SECONDS, LISTENER
from backend.errors import Busy, InvalidInput
from backend.tasks import selectors
from backend.tasks.wakeups import EVENT_BELL

POLL_SECONDS = 0.05
KEEPALIVE_SECONDS = 15.0
# What EventSource waits before it reconnects, in milliseconds.
RECONNECT_MS = 1000

_streams_lock = threading.Lock()
_streams_open = 0


def _take_stream_slot() -> bool:
    global _streams_open
    with _streams_lock:
        if _streams_open >= settings.BATON_MAX_EVENT_STREAMS:
            return False
        _streams_open += 1
        return True


def _give_stream_slot() -> None:
    global _streams_open
    with _streams_lock:
        _streams_open -= 1


def _last_event_id(request: Request) -> int:
    """Where the client resumes: the `Last-Event-ID` header, else `?after=`, else 0."""
    for raw, field in (
        (request.headers.get("Last-Event-ID"), "Last-Event-ID"),
        (request.query_params.get("after"), "after"),
    ):
        if raw is None or raw == "":
            continue
        if not raw.isdigit() or len(raw) > 18:
            raise InvalidInput(
                f"{field} must be the id of an event of this stream (a whole number).",
                field=field,
            )
        return int(raw)
    return 0


class _EventStream:
    """The response's content: the events, then the end of the stream. Holds one of the
    process's stream slots from its creation until the server closes the response (also when
    the client hung up before the first byte)."""

    def __init__(
        self, *, task_id: int, after: int, still_connected: Callable[[], bool], seconds: float
    ) -> None:
        self._events = self._frames(
            task_id=task_id, after=after, still_connected=still_connected, seconds=seconds
        )
        self._slot_held = True

    def __iter__(self) -> Iterator[str]:
        return self._events

    def close(self) -> None:
        self._events.close()
        if self._slot_held:
            self._slot_held = False
            _give_stream_slot()

    @staticmethod
    def _frames(
        *, task_id: int, after: int, still_connected: Callable[[], bool], seconds: float
    ) -> Generator[str, None, None]:
        yield f"retry: {RECONNECT_MS}\n\n"
        deadline = time.monotonic() + seconds
        last_write = time.monotonic()
        cursor = after
        # Once caught up, the stream reads from its task's feed (`event_feeds`), which the
        # process's reader fills when its task's events commit: on PostgreSQL it hears the
        # task's NOTIFY through the process's listener, elsewhere it looks every 50 ms. While
        # the reader is not running, the stream reads storage itself every POLL_SECONDS (and
        # at once on writes of this process).
        listening = connection.vendor == "postgresql" and LISTENER.start()
        with ExitStack() as stack:
            rung = stack.enter_context(EVENT_BELL.watch(task_id))
            feed: Feed | None = None
            while True:
                shared = feed.frames_after(cursor) if feed is not None and FEEDS.reading else None
                if shared is None:
                    rung.clear()  # before the read: a ring during it is kept for the wait
                    shared = [
                        (event.seq, sse_frame(event)) for event in read_after(task_id, cursor)
                    ]
                for seq, frame in shared:
                    yield frame
                    cursor = seq
                now = time.monotonic()
                if shared:
                    last_write = now
                    continue
                if feed is None:
                    # Caught up: the feed reads for this stream from now on. On PostgreSQL the
                    # stream holds no database connection while it waits.
                    feed = stack.enter_context(FEEDS.subscribe(task_id, cursor))
                    if listening:
                        _release_connection()
                    else:
                        release_while_waiting()  # with a pool, even while it reads
                    continue
                if now >= deadline or not still_connected():
                    return
                if now - last_write >= KEEPALIVE_SECONDS:
                    yield ": keepalive\n\n"
                    last_write = now
                if FEEDS.reading:
                    pause = min(
                        CLIENT_CHECK_SECONDS,
                        deadline - now,
                        KEEPALIVE_SECONDS - (now - last_write),
                    )
                    feed.wait(cursor, max(pause, 0.0))
                else:
                    rung.wait(POLL_SECONDS)


def _release_connection() -> None:
    """Close this thread's database connection until it next needs one (never inside a
    transaction: a test's, for one)."""
    if not connection.in_atomic_block:
        connection.close()


# One event of the stream, as an EventSource reader parses it (the schema of each event).
SSE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "event": {"type": "string"},
        "data": {"type": "string", "description": "One JSON object."},
    },
    "required": ["id", "event", "data"],
}


class TaskEventsApi(APIView):
    permission_classes = [IsProductClient]
    renderer_classes = [BatonJSONRenderer]
    content_negotiation_class = JSONErrorsNegotiation

    @extend_schema(
        operation_id="tasks_events",
        parameters=[
            OpenApiParameter(
                "after",
                OpenApiTypes.INT,
                description="Resume after this event id (the Last-Event-ID header wins).",
            ),
            OpenApiParameter(
                "Last-Event-ID",
                OpenApiTypes.INT,
                location=OpenApiParameter.HEADER,
                description="The id of the last event the client got: the stream resumes after it.",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                SSE_EVENT_SCHEMA,
                description="Server-Sent Events: `id` (the event's number in the task's "
                "sequence), `event` (turn.created, turn.claimed, turn.progress, "
                "turn.requeued, turn.completed, turn.failed, turn.cancelled, "
                "turn.interrupted, message.queued, message.withdrawn) and one JSON `data` "
                "line. A turn's turn.progress events are deleted when its attempt ends: read "
                "from storage after that, their numbers are skipped.",
            ),
            (400, "application/json"): ErrorOutput,
            (404, "application/json"): ErrorOutput,
            (503, "application/json"): ErrorOutput,
        },
        summary="Follow a task's events live (Server-Sent Events), resuming after an event id",
    )
    def get(self, request: Request, task_id: int) -> HttpResponseBase:
        task = selectors.get_task(user=authenticated_user(request), task_id=task_id)
        after = _last_event_id(request)
        if not _take_stream_slot():
            raise Busy(
                "This server process already serves its most event streams "
                "(BATON_MAX_EVENT_STREAMS); reconnect in a few seconds.",
                retry_after_seconds=5,
            )
        response = StreamingHttpResponse(
            _EventStream(
                task_id=task.pk,
                after=after,
                still_connected=client_still_connected(request),
                seconds=settings.BATON_EVENT_STREAM_SECONDS,
            ),
            content_type="text/event-stream; charset=utf-8",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass events on as they come
        return response
