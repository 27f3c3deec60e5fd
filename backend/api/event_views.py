"""A task's events as Server-Sent Events: a product follows its task live and resumes after a
disconnect with `Last-Event-ID`, missing nothing and getting nothing twice.

The stream reads the task's event log (`backend.tasks.task_events`): first what came after the
client's last event id, from storage, then new events as they commit: on PostgreSQL a stream
sleeps until its process's listener hears a NOTIFY for its task (`backend.tasks.wakeups`), so an
idle stream costs nothing but a look at its client every second; elsewhere, or while the
listener is not connected, it looks every POLL_SECONDS. Every event's `id:` is its number in
the task's sequence. The stream ends after BATON_EVENT_STREAM_SECONDS, or when the client
hangs up; a client (EventSource does this by itself) reconnects with the last id it got.
Comment lines keep idle connections open through proxies. Each stream holds one of its server
process's request threads while it is open, so a process serves at most
BATON_MAX_EVENT_STREAMS of them at once and answers 503 with Retry-After beyond that, keeping
threads free for the rest of the API.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Generator, Iterator

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.http import HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.views import APIView

from backend.api.artifact_serializers import ErrorOutput
from backend.api.artifact_views import JSONErrorsNegotiation
from backend.api.client_connection import client_still_connected
from backend.api.permissions import IsProductClient, authenticated_user
from backend.api.renderers import BatonJSONRenderer
from backend.dispatch.waiting import CLIENT_CHECK_SECONDS, LISTENER
from backend.errors import Busy, InvalidInput
from backend.tasks import selectors
from backend.tasks.models import TaskEvent
from backend.tasks.wakeups import EVENT_BELL

POLL_SECONDS = 0.05
KEEPALIVE_SECONDS = 15.0
# Events read from storage per query while catching up.
READ_BATCH = 200
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


def sse_frame(event: TaskEvent) -> str:
    payload = {
        "seq": event.seq,
        "type": event.type,
        "task_id": event.task_id,
        "created_at": event.created_at,
        **event.data,
    }
    body = json.dumps(payload, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":"))
    # JSON has no raw line breaks, so the data is one `data:` line.
    return f"id: {event.seq}\nevent: {event.type}\ndata: {body}\n\n"


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
        # PostgreSQL: woken by NOTIFY through the process's listener; else every POLL_SECONDS
        # (and at once by writes of this process).
        listening = connection.vendor == "postgresql" and LISTENER.start()
        with EVENT_BELL.watch(task_id) as rung:
            while True:
                rung.clear()  # before the read: a ring during it is kept for the wait below
                events = list(
                    TaskEvent.objects.filter(task_id=task_id, seq__gt=cursor).order_by("seq")[
                        :READ_BATCH
                    ]
                )
                for event in events:
                    yield sse_frame(event)
                    cursor = event.seq
                now = time.monotonic()
                if events:
                    last_write = now
                    continue
                if now >= deadline or not still_connected():
                    return
                if now - last_write >= KEEPALIVE_SECONDS:
                    yield ": keepalive\n\n"
                    last_write = now
                pause = POLL_SECONDS
                if listening and LISTENER.connected:
                    pause = min(
                        CLIENT_CHECK_SECONDS,
                        deadline - now,
                        KEEPALIVE_SECONDS - (now - last_write),
                    )
                rung.wait(max(pause, 0.0))


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
                OpenApiTypes.STR,
                description="Server-Sent Events: `id` (the event's number in the task's "
                "sequence), `event` (turn.created, turn.claimed, turn.progress, "
                "turn.requeued, turn.completed, turn.failed, turn.cancelled, "
                "turn.interrupted, message.queued, message.withdrawn) and one JSON `data` "
                "line.",
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
