"""Log lines: JSON objects for a collector to parse (production), or short lines for a person.

**JSON** (`BATON_LOG_FORMAT=json`, production's default): one object per line.

`JsonLineFormatter` turns every record into an object with `time` (UTC, ISO 8601), `level` and
`logger`, and then:

- a Baton event (`backend.events.log_event`): `event`, its name, and `fields`, its fields;
- a gunicorn access line: `request`, with `method`, `path` (no query string), `status`,
  `bytes`, `duration_ms` and `remote_addr`;
- any other record: `message`, its text.

A record with an exception adds `exception`: its type and its frames (file, line, function),
never its text, which may quote a message or a result (docs/architecture.md, principle 7).

**Plain** (`BATON_LOG_FORMAT=plain`, development's default): `time level logger message`, with
a Baton event as one short line a person reads at a glance — the busiest ones in words
(`dispatch task 3 message 4 codex · 1,234 tokens · full prompt`, `result task 3 message 4
COMPLETED`), any other as its name and `field=value` pairs — and the long-polling plumbing
left out at INFO (`QuietPlumbingEvents`). JSON keeps every field of every event; the plain
line is for the console beside `make run`, whose readers want to see turns go by.

The module imports nothing from Django: gunicorn's master loads it before the app.
"""

from __future__ import annotations

import copy
import json
import logging
import traceback
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

EVENTS_LOGGER = "baton.events"
ACCESS_LOGGER = "gunicorn.access"
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Events of the dispatch's own plumbing, logged as a worker's long poll ends or a server
# process starts listening: at INFO they are no news to a person watching the console.
PLUMBING_EVENTS = frozenset({"dispatch_client_gone", "dispatch_listener_connected"})


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
        }
        line.update(_body(record))
        if record.exc_info is not None and record.exc_info[0] is not None:
            line["exception"] = {
                "type": record.exc_info[0].__name__,
                "frames": [
                    f"{frame.filename}:{frame.lineno} in {frame.name}"
                    for frame in traceback.extract_tb(record.exc_info[2])
                ],
            }
        return json.dumps(line, ensure_ascii=False)


def _body(record: logging.LogRecord) -> dict[str, Any]:
    if record.name == EVENTS_LOGGER:
        fields = json.loads(record.getMessage())
        return {"event": fields.pop("event"), "fields": fields}
    if record.name == ACCESS_LOGGER and isinstance(record.args, Mapping):
        return {"request": _access(record.args)}
    return {"message": record.getMessage()}


def _access(atoms: Mapping[str, Any]) -> dict[str, Any]:
    """gunicorn's access log atoms (`m`, `U`, `s`, ...) as named fields."""
    return {
        "method": atoms.get("m"),
        "path": atoms.get("U"),
        "status": _integer(atoms.get("s")),
        "bytes": _integer(atoms.get("B")),
        "duration_ms": round(int(atoms.get("D", 0)) / 1000, 3),
        "remote_addr": atoms.get("h"),
    }


def _integer(value: object) -> int | None:
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else None


class PlainLineFormatter(logging.Formatter):
    """`time level logger message`, a Baton event's message in words (`plain_event`)."""

    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        if record.name != EVENTS_LOGGER:
            return super().format(record)
        shown = copy.copy(record)  # other handlers format the record as it was logged
        shown.msg, shown.args = plain_event(json.loads(record.getMessage())), None
        return super().format(shown)


class QuietPlumbingEvents(logging.Filter):
    """Leaves out PLUMBING_EVENTS below WARNING (the plain console's filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != EVENTS_LOGGER or record.levelno >= logging.WARNING:
            return True
        return json.loads(record.getMessage()).get("event") not in PLUMBING_EVENTS


def plain_event(line: Mapping[str, Any]) -> str:
    """One event's plain message: in words for the events `_IN_WORDS` knows, else its name and
    its fields as `name=value`, sorted. `line` is what `log_event` wrote (`event` among the
    fields); an event without a field its words need, as they need it, falls back to the pairs."""
    fields = dict(line)
    event = str(fields.pop("event", ""))
    in_words = _IN_WORDS.get(event)
    if in_words is not None:
        try:
            return in_words(fields)
        except (KeyError, TypeError, ValueError):
            pass  # a field missing or of another type: every field, as pairs
    pairs = " ".join(f"{name}={_plain(value)}" for name, value in sorted(fields.items()))
    return f"{event} {pairs}" if pairs else event


def _dispatch(fields: Mapping[str, Any]) -> str:
    """A prompt a dispatch built (one line for the full prompt, one for a resume prompt)."""
    words = (
        f"dispatch task {fields['task']} message {fields['message_id']} {fields['executor']}"
        f" · {fields['tokens']:,} tokens · {fields['kind']} prompt"
    )
    return words + _attempt(fields)


def _result(fields: Mapping[str, Any]) -> str:
    """A worker's report and the turn's status after it (RETRY → PENDING, and the like)."""
    reported, status = fields["reported"], fields["status"]
    outcome = status if reported == status else f"{reported} → {status}"
    words = f"result task {fields['task']} message {fields['message_id']} {outcome}"
    if fields.get("error_code"):
        words += f" · {fields['error_code']}"
    return words + _attempt(fields)


def _attempt(fields: Mapping[str, Any]) -> str:
    attempt = fields.get("attempt")
    return f" · attempt {attempt}" if isinstance(attempt, int) and attempt > 1 else ""


def _plain(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_IN_WORDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "dispatch": _dispatch,
    "result": _result,
}
