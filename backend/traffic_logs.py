"""The HTTP libraries' own log records never print Baton's traffic.

httpx logs each request line at INFO with the whole URL (`POST http://user:password@host/…
?token=…`), httpcore its headers at DEBUG, urllib3 request paths and query strings (at DEBUG,
and in its WARNING about a retried request), botocore signed headers and bodies. The webhook
sender's receivers carry secrets in their URLs and the artifact store's requests carry
credentials, so none of it may reach a log line (docs/architecture.md, principle 7), at any
level an operator picks. Two things make that so, whatever a library or a later change does
to a logger's level:

- `traffic_loggers` caps these loggers at WARNING (or the log level, when higher) in the
  logging configuration: their request lines are never even made into records;
- `WithholdTrafficText`, on every handler Baton configures, refuses a record of theirs below
  WARNING that got past the cap (a logger lowered by hand), and keeps one at WARNING or above
  with its logger and level only: its text, arguments and exception are replaced by one
  fixed sentence naming the exception's type.

The module imports nothing from Django: gunicorn's master loads it before the app.
"""

from __future__ import annotations

import logging
from typing import Any

# Every library that speaks HTTP for the backend: the webhook sender (httpx over httpcore,
# h2 and hpack for HTTP/2) and the S3 artifact store (boto3, botocore, s3transfer, urllib3).
TRAFFIC_LOGGERS = ("httpx", "httpcore", "h2", "hpack", "urllib3", "boto3", "botocore", "s3transfer")


def is_traffic_logger(name: str) -> bool:
    return any(name == root or name.startswith(f"{root}.") for root in TRAFFIC_LOGGERS)


def traffic_loggers(level: str) -> dict[str, dict[str, Any]]:
    """The `loggers` entries that cap each traffic logger at WARNING, or at `level` when it is
    higher; records still propagate to the root's handlers and their filter."""
    cap = max(logging.WARNING, logging.getLevelNamesMapping().get(level.upper(), logging.NOTSET))
    return {name: {"level": logging.getLevelName(cap)} for name in TRAFFIC_LOGGERS}


class WithholdTrafficText(logging.Filter):
    """A handler's filter: a traffic logger's record below WARNING is refused, one at WARNING or
    above keeps its logger and level, and its text is withheld."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not is_traffic_logger(record.name):
            return True
        if record.levelno < logging.WARNING:
            return False
        withheld = f"{record.name} logged a {record.levelname} record; its text is withheld"
        if record.exc_info is not None and record.exc_info[0] is not None:
            withheld += f" (exception {record.exc_info[0].__name__})"
        # In place (Python 3.11 filters return a flag): every later handler sees the same.
        record.msg, record.args = f"{withheld}: it may name a URL, a header or a body.", None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True
