"""Whether the client of a request in progress is still connected (for a long-polling dispatch).

A dispatch that waits for a turn must not claim one for a worker that hung up: the answer could
never be delivered (`backend.dispatch.waiting.claim_or_wait`). The WSGI servers Baton runs
under keep the client's socket where a view can reach it:

- gunicorn (production, any worker class): `environ["gunicorn.socket"]`;
- Django's own server (`runserver`, pytest-django's live server): `wsgi.input` is a
  `LimitedStream` over the connection's reader, which Django keeps only as a bound method
  (`_read`); that reader's `fileno()` is the socket's.

The socket is polled, never read: POLLRDHUP says the client closed its side (or shut down its
writing, which an HTTP client waiting for its answer does not do), POLLHUP and POLLERR that the
connection is gone. Bytes of a next request sent ahead stay where the server reads them. Behind
a reverse proxy, the proxy's connection is the one seen: nginx closes it when its client goes
(`proxy_ignore_client_abort off`, its default). Where no socket is found (another server, the
test client) or the platform lacks POLLRDHUP (Linux has it), the client is assumed connected,
and a wait ends with its time, as before.
"""

from __future__ import annotations

import os
import select
import stat
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from django.http import HttpRequest

_HUNG_UP = getattr(select, "POLLRDHUP", None)


def client_still_connected(request: HttpRequest) -> Callable[[], bool]:
    """A check, cheap enough to call every few milliseconds while the view runs, that is
    False once the request's client has hung up."""
    fd = _client_socket_fd(request.META)
    if fd is None or _HUNG_UP is None:
        return _assume_connected
    return partial(_connected, fd, _HUNG_UP)


def _client_socket_fd(environ: Mapping[str, Any]) -> int | None:
    sock = environ.get("gunicorn.socket")
    if sock is not None:
        reader: Any = sock
    else:
        stream = environ.get("wsgi.input")
        reader = getattr(getattr(stream, "_read", None), "__self__", None)
    try:
        fd = reader.fileno()
        is_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError):  # no file behind it, or not a socket
        return None
    return fd if is_socket else None


def _connected(fd: int, hung_up: int) -> bool:
    poller = select.poll()
    poller.register(fd, hung_up)  # POLLHUP, POLLERR and POLLNVAL are always reported
    return not poller.poll(0)


def _assume_connected() -> bool:
    return True
