"""Log lines as JSON: one object per line, for a collector to parse (production's format).

`JsonLineFormatter` turns every record into an object with `time` (UTC, ISO 8601), `level` and
`logger`, and then:

- a Baton event (`backend.events.log_event`): `event`, its name, and `fields`, its fields;
- a gunicorn access line: `request`, with `method`, `path` (no query string), `status`,
  `bytes`, `duration_ms` and `remote_addr`;
- any other record: `message`, its text.

A record with an exception adds `exception`: its type and its frames (file, line, function),
never its text, which may quote a message or a result (docs/architecture.md, principle 7).
The module imports nothing from Django: gunicorn's master loads it before the app.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

EVENTS_LOGGER = "baton.events"
ACCESS_LOGGER = "gunicorn.access"


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
