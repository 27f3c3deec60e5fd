"""Log filters for the development server.

`runserver` logs every request, and a worker beside it (`make run`) asks for work about once a
second and checks its claims twice a second while it runs a turn: the useful lines would drown.
Successful executor-API requests are left out of that access log; failures and every other
request still show.
"""

from __future__ import annotations

import logging


class QuietWorkerPolling(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        # runserver logs `"%s" %s %s` with the request line first: "POST /api/... HTTP/1.1".
        request_line = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        parts = str(request_line).split(" ")
        path = parts[1] if len(parts) > 1 else ""
        return not (path.startswith("/api/executor/") and status is not None and status < 400)
