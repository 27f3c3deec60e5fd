"""Progress of one run, buffered between posts so a chatty executor cannot flood the backend.

The reading thread adds normalized events as they come; the worker's supervisor takes a batch
at most every `MIN_POST_INTERVAL` seconds. A batch respects the backend's limits: at most
`MAX_EVENTS_PER_POST` events (the rest wait for the next post) and a partial text of at most
`MAX_PARTIAL_TEXT_BYTES` (its end is kept: that is what is being written now). Message deltas
are not posted one by one: they accumulate into the partial text. Text fields of events are
bounded too; the run's whole answer travels in its result, not in progress.

A post sends only what the partial text gained since the last post Baton accepted
(`partial_text_append`, at `partial_text_offset`, the length Baton holds), so a long answer's
progress costs what it adds, not its whole length each time. The whole text goes instead when
the worker does not know what Baton holds (the first post, after a refused or failed one) or
when the text is no longer an extension of it (a `MessageCompleted` replaced it, or its end
was cut to the limit). The worker tells the buffer what became of each batch (`accepted`,
`refused`); a batch Baton refused for its offset is sent again whole (`ProgressBatch.whole`).
So Baton's stored text is always what the buffer last sent and Baton accepted: nothing lost,
nothing twice.

A batch travels in the worker's batched heartbeat, beside its claim (`to_json`), and the
heartbeat's answer says what became of it (`settle`); a batch too large to ride along
(`HEARTBEAT_PROGRESS_BYTES`), or one Baton refused for its offset, goes as a progress post of
its own (`deliver`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from executors.client import PartialTextMismatch
from executors.events import Event, MessageCompleted, MessageDelta, UsageReported
from executors.payloads import ProgressOutcome

MIN_POST_INTERVAL = 0.5
MAX_EVENTS_PER_POST = 1000
MAX_PARTIAL_TEXT_BYTES = 1024 * 1024 - 1024
EVENT_TEXT_CHARS = 4000
# The progress one heartbeat carries, all its turns together, as JSON: what does not fit goes as
# progress posts of their own. Within Baton's limit for a heartbeat (one progress post's).
HEARTBEAT_PROGRESS_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ProgressBatch:
    events: list[dict[str, Any]]
    # The whole partial text, replacing Baton's; or what it gained, at the offset Baton's
    # text must have; or neither (the text did not change).
    partial_text: str | None
    partial_text_append: str | None = None
    partial_text_offset: int | None = None
    # The whole text Baton holds once it accepts this batch (None: the text did not change).
    sent_text: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The batch as a progress post's body (and a heartbeat's `progress`) carries it."""
        body: dict[str, Any] = {"events": self.events}
        if self.partial_text is not None:
            body["partial_text"] = self.partial_text
        if self.partial_text_append is not None:
            body["partial_text_append"] = self.partial_text_append
            body["partial_text_offset"] = self.partial_text_offset
        return body

    def json_bytes(self) -> int:
        """The size of `to_json` as the worker's client sends it."""
        return len(json.dumps(self.to_json(), ensure_ascii=False).encode("utf-8", "replace"))

    def whole(self) -> ProgressBatch:
        """The same batch with the whole text instead of an append."""
        if self.partial_text_append is None:
            return self
        return replace(
            self,
            partial_text=self.sent_text,
            partial_text_append=None,
            partial_text_offset=None,
        )


class ProgressBuffer:
    """Thread-safe: one thread adds, another takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._partial: list[str] = []
        self._partial_changed = False
        # The partial text Baton holds, as far as this worker knows (None: it does not know).
        self._stored: str | None = None
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
            self._last_post = now
            if not self._partial_changed:
                return ProgressBatch(events=events, partial_text=None)
            self._partial_changed = False
            text = "".join(self._partial)
            self._partial = [text]
            sent = _tail_within(text, MAX_PARTIAL_TEXT_BYTES)
            stored = self._stored
            if stored is None or not sent.startswith(stored):
                return ProgressBatch(events=events, partial_text=sent, sent_text=sent)
            if len(sent) == len(stored):
                return ProgressBatch(events=events, partial_text=None)
            return ProgressBatch(
                events=events,
                partial_text=None,
                partial_text_append=sent[len(stored) :],
                partial_text_offset=len(stored),
                sent_text=sent,
            )

    def deliver(self, batch: ProgressBatch, *, send: Callable[[ProgressBatch], int | None]) -> None:
        """Post `batch` with `send` (which returns the length of the text Baton then holds)
        and record what became of it. When Baton's text is not the length an append assumed
        (a post whose answer was lost, say), the batch goes again at once with the whole
        text. An error of `send` is raised again once the batch is marked refused."""
        try:
            try:
                stored_chars = send(batch)
            except PartialTextMismatch:
                batch = batch.whole()
                stored_chars = send(batch)
        except BaseException:
            self.refused(batch)
            raise
        self.accepted(batch, stored_chars=stored_chars)

    def settle(self, batch: ProgressBatch, outcome: ProgressOutcome | None) -> ProgressBatch | None:
        """Record what a heartbeat's answer says of `batch` (None: it says nothing). Returns
        the batch to post on its own now, with the whole text, when Baton refused its offset
        (as `deliver` would send it again); None otherwise."""
        if outcome is not None and outcome.stored:
            self.accepted(batch, stored_chars=outcome.partial_text_chars)
            return None
        if outcome is not None and outcome.code == "partial_text_mismatch":
            return batch.whole()
        self.refused(batch)
        return None

    def accepted(self, batch: ProgressBatch, *, stored_chars: int | None) -> None:
        """Baton stored `batch`; `stored_chars` is the length it says its text has now."""
        if batch.sent_text is None:
            return
        with self._lock:
            # A length that differs (text Baton reads otherwise): send the whole text next.
            known = stored_chars is None or stored_chars == len(batch.sent_text)
            self._stored = batch.sent_text if known else None

    def refused(self, batch: ProgressBatch) -> None:
        """`batch` did not reach Baton, or Baton refused it: the next post sends the whole
        text (Baton may hold the text before it, or not)."""
        if batch.sent_text is None:
            return
        with self._lock:
            self._stored = None
            self._partial_changed = True


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
