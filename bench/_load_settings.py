"""Baton's settings for the load profile (`load_profile.py`): the bare view of
`_ceiling_settings`, and each request's CPU written down by route.

`RequestCpu` runs first, around every other middleware and the view: the CPU time of the
request's thread from the first middleware in to the response out (a streamed body's later
chunks are not in it), appended as one line to `$BENCH_CPU_DIR/<pid>.log`:
`<unix time> <method> <route> <seconds>`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.http import HttpRequest, HttpResponseBase

from bench._ceiling_settings import *  # noqa: F403
from bench._ceiling_settings import MIDDLEWARE


class RequestCpu:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        path = Path(os.environ["BENCH_CPU_DIR"]) / f"{os.getpid()}.log"
        self.lines = path.open("a", buffering=1, encoding="utf-8")
        self.lock = threading.Lock()

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        start = time.thread_time()
        response = self.get_response(request)
        spent = time.thread_time() - start
        match = request.resolver_match
        route = match.route if match else "unrouted"
        with self.lock:
            self.lines.write(f"{time.time():.3f} {request.method} {route} {spent:.6f}\n")
        return response


MIDDLEWARE = ["bench._load_settings.RequestCpu", *MIDDLEWARE]
