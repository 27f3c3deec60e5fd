"""Structured event log lines: one JSON object per line, holding ids, counts, sizes and flags.

Every layer of Baton logs its events through `log_event`, on the `baton.events` logger. Logs
must never carry a message, a prompt or a result (docs/architecture.md, principle 7), so `log_event`
takes only values that cannot hold content: numbers, flags, None and short identifier-like
strings (ids, status and error codes, kinds). Anything else — free text, a long string, a list,
a dict — raises before a line is written, so a field that would leak text fails in the tests
instead of in production.

A name a client chose (a worker id) is not guaranteed to look like an identifier; pass it
through `opaque_id`, which keeps it when it does and logs a short digest of it otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from typing import TypeAlias

EventValue: TypeAlias = int | float | bool | str | None

# Ids, codes and kinds: "worker-1", "lease_expired", "cl100k_base", "sha256:…". Empty is an
# unset code. No spaces, so no sentence fits; at most 64 characters, so no text does.
IDENTIFIER = re.compile(r"[A-Za-z0-9_.:-]{0,64}")
EVENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

logger = logging.getLogger("baton.events")


def log_event(event: str, /, *, level: int = logging.INFO, **fields: EventValue) -> None:
    """Log `event` with `fields` as one JSON object (keys sorted, `event` among them).

    Raises TypeError for a value that is not an int, float, bool, None or str, and ValueError
    for a string that is not identifier-like, a float that is not finite or a bad event name.
    """
    if not EVENT_NAME.fullmatch(event):
        raise ValueError(f"event name {event!r} is not a lowercase identifier")
    if "event" in fields:
        raise ValueError("'event' is the event's name, not a field")
    for name, value in fields.items():
        _check(name, value)
    if logger.isEnabledFor(level):
        logger.log(level, json.dumps({"event": event, **fields}, sort_keys=True))


def opaque_id(value: str) -> str:
    """`value` if it is identifier-like, else `sha256:` and the start of its digest.

    For names clients choose: an unusual one can neither break the caller's log line nor put
    its text in the log, and equal names still log equal.
    """
    if IDENTIFIER.fullmatch(value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _check(name: str, value: object) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"field {name!r}: {value!r} is not a finite number")
        return
    if isinstance(value, str):
        if not IDENTIFIER.fullmatch(value):
            raise ValueError(
                f"field {name!r}: a logged string must be an identifier of at most 64 "
                "characters (letters, digits, _ . : -), never text"
            )
        return
    raise TypeError(
        f"field {name!r}: {type(value).__name__} cannot be logged; log ids, counts, sizes "
        "and flags only"
    )
