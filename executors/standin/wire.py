"""What every wire module returns, and the small pieces they share.

A wire module (``openai_responses``, ``openai_chat``, ``anthropic_messages``) is a pure function
from a scripted :class:`~executors.standin.script.Turn` and the request body to a :class:`Reply`:
either one JSON document with a status, or a list of server-sent events. Keeping the HTTP writing
in ``server`` lets the event sequences be read (and tested) as plain data.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

# Scripted answers are short; a few deltas are enough to exercise a client's accumulation.
MAX_TEXT_DELTAS = 16


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event; ``event`` None sends only the ``data:`` line (Chat Completions)."""

    data: str
    event: str | None = None

    def encode(self) -> bytes:
        head = f"event: {self.event}\n" if self.event is not None else ""
        return json_bytes(f"{head}data: {self.data}\n\n")


def json_bytes(text: str) -> bytes:
    """UTF-8 of text holding JSON: a lone surrogate in a scripted answer, which UTF-8 cannot
    carry, goes as its JSON escape (`\\ud800`), as a provider sends one."""
    return text.encode("utf-8", "backslashreplace")


def sse(event_type: str, payload: dict[str, Any]) -> SseEvent:
    """An event whose ``event:`` line repeats the payload's type, as OpenAI and Anthropic do."""
    return SseEvent(data=json.dumps(payload, ensure_ascii=False), event=event_type)


@dataclass(frozen=True)
class JsonReply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamReply:
    events: list[SseEvent]
    status: int = 200


Reply = JsonReply | StreamReply


class IdSource:
    """Unique ids for responses, items and calls.

    A random token per server keeps ids unique across servers too: a session resumed against a
    new server resends the ids of the first one, and clients group streamed content by id.
    """

    def __init__(self) -> None:
        self._token = secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def next(self, prefix: str) -> str:
        with self._lock:
            number = next(self._counter)
        return f"{prefix}_standin_{self._token}_{number:04d}"


def text_deltas(text: str) -> list[str]:
    """``text`` split at word starts into at most MAX_TEXT_DELTAS pieces that join back to it."""
    words = re.findall(r"\s*\S+|\s+$", text)
    if len(words) <= MAX_TEXT_DELTAS:
        return words
    size = -(-len(words) // MAX_TEXT_DELTAS)
    return ["".join(words[start : start + size]) for start in range(0, len(words), size)]


def model_name(body: dict[str, Any], default: str) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else default
