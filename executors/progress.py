"""Progress of one run, buffered between posts so a chatty executor cannot flood the backend.

The reading thread adds normalized events as they come; the worker's supervisor takes a batch
at most every `MIN_POST_INTERVAL` seconds. A batch respects the backend's limits: at most
`MAX_EVENTS_PER_POST` events (the rest wait for the next post) and a partial text of at most
`MAX_PARTIAL_TEXT_BYTES` (its end is kept: that is what is being written now). Message deltas
are not posted one by one: they accumulate into the partial text. Text fields of events are
bounded too; the run's whole answer travels in its result, not in progress.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from executors.events import Event, MessageCompleted, MessageDelta, UsageReported

MIN_POST_INTERVAL = 0.5
MAX_EVENTS_PER_POST = 1000
MAX_PARTIAL_TEXT_BYTES = 1024 * 1024 - 1024
EVENT_TEXT_CHARS = 4000


@dataclass(frozen=True)
class ProgressBatch:
    events: list[dict[str, Any]]
    partial_text: str | None


class ProgressBuffer:
    """Thread-safe: one thread adds, another takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._partial: list[str] = []
        self._partial_changed = False
        self._last_post = 0.0
        self.event_count = 0

    def add(self, events: list[Event]) -> None:
        with self._lock:
            for event in events:
                self.event_count += 1
                if isinstance(event, MessageDelta):
                    self._partial.append(event.text)
                    self._partial_changed = True
                    continue
                if isinstance(event, MessageCompleted):
                    self._partial = [event.text]
                    self._partial_changed = True
                self._events.append(_bounded(event))

    def take(self, *, now: float | None = None, force: bool = False) -> ProgressBatch | None:
        """The next batch to post, or None when nothing changed or the last post was too recent."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._events and not self._partial_changed:
                return None
            if not force and now - self._last_post < MIN_POST_INTERVAL:
                return None
            events = self._events[:MAX_EVENTS_PER_POST]
            del self._events[:MAX_EVENTS_PER_POST]
            partial = None
            if self._partial_changed:
                text = "".join(self._partial)
                self._partial = [text]
                partial = _tail_within(text, MAX_PARTIAL_TEXT_BYTES)
                self._partial_changed = False
            self._last_post = now
            return ProgressBatch(events=events, partial_text=partial)


def _bounded(event: Event) -> dict[str, Any]:
    data = event.to_json()
    if isinstance(event, UsageReported):
        data["usage"] = event.usage.to_json()
    for key, value in data.items():
        if isinstance(value, str) and len(value) > EVENT_TEXT_CHARS:
            half = EVENT_TEXT_CHARS // 2
            removed = len(value) - 2 * half
            data[key] = f"{value[:half]}…{removed} chars truncated…{value[-half:]}"
    return data


def _tail_within(text: str, limit_bytes: int) -> str:
    """The longest end of `text` whose UTF-8 fits in `limit_bytes`."""
    if len(text) * 4 <= limit_bytes:
        return text
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit_bytes:
        return text
    return encoded[-limit_bytes:].decode("utf-8", "ignore")
