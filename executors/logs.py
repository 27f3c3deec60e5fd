"""The worker's logging: its own lines on stderr, and never a line of its HTTP traffic.

httpx logs each request line at INFO with the whole URL, httpcore its headers at DEBUG, and the
backend's URL (BATON_URL) may carry a secret in its user info, path or query, so neither may
reach the worker's log at any level (principle 7 of docs/architecture.md). As on the backend
(`backend.traffic_logs`, which the worker cannot import: it talks to Baton over HTTP only),
two things make that so: the HTTP libraries' loggers are capped at WARNING (or the log level,
when higher), so their request lines are never made into records, and the handler's filter
refuses a record of theirs below WARNING that got past the cap and keeps one at WARNING or
above with its logger and level only, its text withheld.

No other line may name a URL either — a model endpoint's may carry a gateway's credentials —
whichever logger writes it: the handler's last filter replaces anything that reads as a URL
(`scheme://…`) in a record's text and its exception's with URL_WITHHELD, keeping the rest of
the line (and a JSON line's quotes) as it was.
"""

from __future__ import annotations

import logging
import re
import sys

# What speaks HTTP for the worker: the backend client (httpx over httpcore; h2 and hpack for
# HTTP/2).
TRAFFIC_LOGGERS = ("httpx", "httpcore", "h2", "hpack")
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
URL_WITHHELD = "<URL withheld>"
# A scheme and what follows it up to a space or a quote (so a JSON string stays closed).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]*")


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


class WithholdUrls(logging.Filter):
    """A handler's filter: any URL in a record's text or exception becomes URL_WITHHELD."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _URL.search(message) is not None:
            record.msg, record.args = _URL.sub(URL_WITHHELD, message), None
        if record.exc_info is not None and record.exc_info[0] is not None:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = _URL.sub(URL_WITHHELD, record.exc_text)
        if record.stack_info:
            record.stack_info = _URL.sub(URL_WITHHELD, record.stack_info)
        return True


def configure_logging(level: str) -> None:
    """Log lines at `level` and above to stderr, the HTTP libraries' never, and no URL."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LINE_FORMAT))
    handler.addFilter(WithholdTrafficText())
    handler.addFilter(WithholdUrls())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    cap = max(logging.WARNING, logging.getLevelNamesMapping().get(level.upper(), logging.NOTSET))
    for name in TRAFFIC_LOGGERS:
        logging.getLogger(name).setLevel(cap)
