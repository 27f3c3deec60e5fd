"""The worker's logging: its own lines on stderr, and never a line of its HTTP traffic.

httpx logs each request line at INFO with the whole URL, httpcore its headers at DEBUG, and the
backend's URL (BATON_URL) may carry a secret in its user info, path or query, so neither may
reach the worker's log at any level (principle 7 of docs/architecture.md). As on the backend
(`backend.traffic_logs`, which the worker cannot import: it talks to Baton over HTTP only),
two things make that so: the HTTP libraries' loggers are capped at WARNING (or the log level,
when higher), so their request lines are never made into records, and the handler's filter
refuses a record of theirs below WARNING that got past the cap and keeps one at WARNING or
above with its logger and level only, its text withheld.
"""

from __future__ import annotations

import logging
import sys

# What speaks HTTP for the worker: the backend client (httpx over httpcore; h2 and hpack for
# HTTP/2).
TRAFFIC_LOGGERS = ("httpx", "httpcore", "h2", "hpack")
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def is_traffic_logger(name: str) -> bool:
    return any(name == root or name.startswith(f"{root}.") for root in TRAFFIC_LOGGERS)


class WithholdTrafficText(logging.Filter):
    """A handler's filter: an HTTP library's record below WARNING is refused, one at WARNING or
    above keeps its logger and level, and its text is withheld."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not is_traffic_logger(record.name):
            return True
        if record.levelno < logging.WARNING:
            return False
        withheld = f"{record.name} logged a {record.levelname} record; its text is withheld"
        if record.exc_info is not None and record.exc_info[0] is not None:
            withheld += f" (exception {record.exc_info[0].__name__})"
        record.msg, record.args = f"{withheld}: it may name a URL, a header or a body.", None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def configure_logging(level: str) -> None:
    """Log lines at `level` and above to stderr, the HTTP libraries' never."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LINE_FORMAT))
    handler.addFilter(WithholdTrafficText())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    cap = max(logging.WARNING, logging.getLevelNamesMapping().get(level.upper(), logging.NOTSET))
    for name in TRAFFIC_LOGGERS:
        logging.getLogger(name).setLevel(cap)
