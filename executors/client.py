"""The worker's only way to the backend: Baton's executor API over HTTP.

One keep-alive connection pool, shared by the worker's threads. Transient failures — the backend
restarting, a proxy's 502/503/504, a 429, a dropped connection — are retried with exponential
backoff; answers that are final (4xx) are not. The backend makes every report idempotent for
the claim that sends it, so a retried report whose first attempt did arrive changes nothing.
Two answers are told apart because the worker acts differently on them: 409 `cancelled` (stop
the executor) and 409 `lease_lost` (stop and forget the turn). Nothing here logs a request or
response body, and the token is never logged.

At start the worker waits for the backend to answer `GET /api/health/` (`wait_until_up`): a
worker started beside the server (`make run`), or before the web tier in a deploy, is not an
error. The wait is quiet for its first HEALTH_QUIET_SECONDS, then says once that it waits.

Dispatches go over a connection of their own, which a worker that stops hangs up on
(`stop_dispatching`): a dispatch waiting at the backend for a turn (long polling) then ends at
once instead of when its wait does, and the backend, seeing its client gone, claims nothing
for it (`backend.dispatch.waiting`).

A result value of more than VALUE_UPLOAD_MIN_BYTES of UTF-8 does not travel inside the JSON
report, which the backend would have to hold whole, with copies, to parse: it is uploaded first
as a stream of UTF-8 (`upload_value`) and the report names it by its sha256 (`report`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import httpx

from executors.payloads import ClaimState, Dispatch, ProgressOutcome

logger = logging.getLogger("baton.worker")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A waiting dispatch's read timeout: the wait plus this, for the answer to come back.
DISPATCH_WAIT_MARGIN_SECONDS = 15.0
# A result value longer than this, in UTF-8, is uploaded on its own before the report.
VALUE_UPLOAD_MIN_BYTES = 1 << 20
_ENCODE_CHUNK_CHARS = 1 << 18
# What an uploaded value cannot hold: NUL (Baton refuses it there) and lone surrogates (not UTF-8).
_NOT_UPLOADABLE = re.compile("[\x00\ud800-\udfff]")
# A surrogate code point in a str is one that no UTF-8 can carry (a pair stands for one
# character only in UTF-16): what an executor's JSON may hand the worker (`"\ud800"`).
_SURROGATE = re.compile("[\ud800-\udfff]")
_T = TypeVar("_T")
# Waiting for the backend at start: silent this long (a server beside the worker is starting),
# then one line; the pause between tries grows to HEALTH_MAX_PAUSE_SECONDS.
HEALTH_QUIET_SECONDS = 10.0
HEALTH_MAX_PAUSE_SECONDS = 1.0
HEALTH_TIMEOUT = httpx.Timeout(5.0, connect=2.0)


class BackendError(RuntimeError):
    """A final answer from the backend that the worker cannot act on (a bug or bad setup)."""

    def __init__(self, message: str, *, status: int | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class TurnCancelled(BackendError):
    """The product cancelled the turn: stop the executor; there is nothing to report."""


class LeaseLost(BackendError):
    """The claim is gone (expired and reclaimed, or already finished): stop and forget."""


class PartialTextMismatch(BackendError):
    """Baton's partial text is not the length a progress post's append assumed: send the whole
    text."""


class BackendUnavailable(BackendError):
    """The backend could not be reached or kept failing for the whole retry budget."""


class DispatchAbandoned(Exception):
    """The worker stopped dispatching (`BackendClient.stop_dispatching`) before this dispatch
    had its answer: no turn came with it, and the backend claims none for a client gone."""


class BackendClient:
    """Baton's executor API. Thread-safe."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        worker_id: str,
        retry_budget_seconds: float = 60.0,
        timeout_seconds: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.worker_id = worker_id
        self._retry_budget = retry_budget_seconds
        headers = {"Authorization": f"Token {token}", "User-Agent": "baton-executor"}
        timeout = httpx.Timeout(timeout_seconds, connect=5.0)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
            transport=transport,
        )
        # Only the claim loop dispatches, one request at a time, on this one connection.
        self._dispatch_http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            transport=transport,
        )
        self._dispatch_line = _DispatchLine()
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        self._dispatch_http.close()
        self._http.close()

    def stop_dispatching(self) -> None:
        """Dispatch no more: a dispatch waiting at the backend is broken off at once, and any
        later one raises DispatchAbandoned without being sent. Safe from any thread and from
        signal handlers. A dispatch without a wait in flight is let finish: its answer comes
        at once, and the turns it carries must be run or given back."""
        self._dispatch_line.hang_up()

    def wait_until_up(
        self, *, stop: threading.Event, quiet_seconds: float = HEALTH_QUIET_SECONDS
    ) -> bool:
        """Wait until the backend answers `GET /api/health/`; False if `stop` was set first.

        Any answer but a transient one (RETRY_STATUSES: a proxy with no server behind it, a
        server whose database is down) means the backend is there: a wrong URL or token is
        then told by the first dispatch, which says what to check. Nothing is logged for
        `quiet_seconds`, then one line, without the URL (it may carry a secret) or a trace.
        """
        started = time.monotonic()
        delay = 0.1
        said = False
        while not stop.is_set():
            failure = self._health_failure()
            if failure is None:
                if said:
                    logger.info(
                        "the backend answers its health check after %.0f s",
                        time.monotonic() - started,
                    )
                return True
            if not said and time.monotonic() - started >= quiet_seconds:
                logger.warning(
                    "waiting for the backend (BATON_URL) to answer GET /api/health/: no answer "
                    "for %.0f s (%s); the worker starts once it answers",
                    time.monotonic() - started,
                    failure,
                )
                said = True
            # Jitter so workers do not stampede a backend coming up; not a secret.
            stop.wait(delay * (0.5 + random.random()))  # noqa: S311
            delay = min(delay * 2, HEALTH_MAX_PAUSE_SECONDS)
        return False

    def _health_failure(self) -> str | None:
        """Why the backend does not answer its health check yet (an error's type or an HTTP
        status, never its text), or None when it answers."""
        try:
            response = self._http.get("/api/health/", timeout=HEALTH_TIMEOUT)
        except httpx.TransportError as error:
            return type(error).__name__
        if response.status_code in RETRY_STATUSES:
            return f"HTTP {response.status_code}"
        return None

    # -- the executor API -------------------------------------------------------------------

    def dispatch(self, *, kinds: Sequence[str], limit: int, wait_seconds: float = 0) -> Dispatch:
        """Claim up to `limit` turns; with `wait_seconds`, the backend holds the request that
        long for a turn when none is pending (the read timeout allows for it).

        Raises DispatchAbandoned once the worker stops dispatching (`stop_dispatching`): at
        once for a waiting dispatch in flight, and between the retries of any dispatch.
        """
        body: dict[str, Any] = {"kinds": list(kinds), "limit": limit, "worker_id": self.worker_id}
        timeout = None
        if wait_seconds > 0:
            body["wait_seconds"] = wait_seconds
            timeout = httpx.Timeout(wait_seconds + DISPATCH_WAIT_MARGIN_SECONDS, connect=5.0)
        line = self._dispatch_line
        with line.in_flight(waiting=wait_seconds > 0):
            answer = self._post(
                "/api/executor/dispatch/",
                body,
                http=self._dispatch_http,
                timeout=timeout,
                extensions={"trace": line.trace},
                give_up=line.hung_up,
            )
        return Dispatch.model_validate(answer)

    def heartbeat(
        self,
        claims: Sequence[tuple[int, int]],
        *,
        progress: Mapping[tuple[int, int], dict[str, Any]] | None = None,
        steers: Mapping[tuple[int, int], list[dict[str, Any]]] | None = None,
    ) -> list[ClaimState]:
        """The state of each (subtask_id, attempt) claim; renews the running ones when due.
        `progress` carries, by claim, what a progress post's body would (events and the
        partial text, `ProgressBatch.to_json`); each claim's `ClaimState.progress` says what
        Baton did with it. `steers` says, by claim, what became of the steers it was handed
        (`TurnRun.steer_results`); `ClaimState.steers` are the ones to hand over now."""
        progress = progress or {}
        steers = steers or {}
        turns = []
        for subtask_id, attempt in claims:
            turn: dict[str, Any] = {"subtask_id": subtask_id, "attempt": attempt}
            if (report := progress.get((subtask_id, attempt))) is not None:
                turn["progress"] = report
            if results := steers.get((subtask_id, attempt)):
                turn["steers"] = results
            turns.append(turn)
        body = {"worker_id": self.worker_id, "turns": turns}
        answer = self._post("/api/executor/heartbeat/", body, budget=5.0)
        return [
            ClaimState(
                item["subtask_id"],
                item["attempt"],
                item["state"],
                _progress_outcome(item),
                tuple((offer["steer_id"], offer["message"]) for offer in item.get("steers", ())),
            )
            for item in answer["turns"]
        ]

    def progress(self, *, subtask_id: int, attempt: int, progress: dict[str, Any]) -> int | None:
        """Post a turn's progress on its own: events and the whole partial text
        (`partial_text`), or what it gained (`partial_text_append`) at the length Baton's text
        has (`partial_text_offset`; else PartialTextMismatch) — `ProgressBatch.to_json`.
        Returns the length of the text Baton holds then."""
        body: dict[str, Any] = {"worker_id": self.worker_id, "attempt": attempt, **progress}
        answer = self._post(f"/api/executor/subtasks/{subtask_id}/progress/", body, budget=10.0)
        stored = answer.get("partial_text_chars") if isinstance(answer, dict) else None
        return stored if isinstance(stored, int) else None

    def confirm_stopped(self, *, subtask_id: int, attempt: int) -> None:
        """Tell Baton that the executor of a turn it cancelled is gone with all its processes
        (a product's cancel may be waiting for this)."""
        body = {"worker_id": self.worker_id, "attempt": attempt}
        self._post(f"/api/executor/subtasks/{subtask_id}/stopped/", body, budget=10.0)

    def report(self, *, subtask_id: int, attempt: int, **report: Any) -> None:
        """Report the claim's outcome (status COMPLETED, FAILED, RETRY or RELEASE).

        A result whose value should be uploaded (`uploads_value`) is: the value goes first,
        then the report names it, and should Baton no longer hold it when the report arrives
        (409 `upload_missing`), it is uploaded once more. The answer (the claim's state after
        the report) is not read: a report the backend accepted leaves nothing for the worker to
        do, and a refused one raises.
        """
        body = {"worker_id": self.worker_id, "attempt": attempt, **report}
        path = f"/api/executor/subtasks/{subtask_id}/result/"
        result = report.get("result")
        value = result.get("value") if isinstance(result, dict) else None
        if not uploads_value(value):
            self._post(path, body)
            return
        assert isinstance(value, str) and isinstance(result, dict)  # uploads_value says so
        for last_try in (False, True):
            sha256 = self.upload_value(subtask_id=subtask_id, attempt=attempt, value=value)
            named = {**body, "result": {**result, "value": None}, "value_upload": sha256}
            try:
                self._post(path, named)
                return
            except BackendError as refused:
                if last_try or refused.code != "upload_missing":
                    raise

    def upload_value(self, *, subtask_id: int, attempt: int, value: str) -> str:
        """Upload a result's value as a stream of UTF-8 and return its sha256, which the
        report names as `value_upload`. Encoded in slices as it is sent: the worker holds no
        encoded copy of the whole value either."""
        size = sum(len(chunk) for chunk in _utf8_chunks(value))

        def attempt_upload() -> str:
            response = self._http.put(
                f"/api/executor/subtasks/{subtask_id}/result/value/",
                params={"worker_id": self.worker_id, "attempt": attempt},
                content=_utf8_chunks(value),
                headers={
                    "Content-Type": "text/plain; charset=utf-8",
                    "Content-Length": str(size),
                },
            )
            _raise_for(response)
            return str(response.json()["value_upload"])

        return self._with_retries(attempt_upload, self._retry_budget)

    def download(self, *, url: str, destination: Path, sha256: str) -> None:
        """Stream an artifact to `destination`, checking its sha256 before it appears there.

        The bytes go to a temporary file beside the destination and are renamed into place
        only when the hash matches, so a partial or damaged download is never seen as the
        artifact. The temporary file is this download's own: two runs in one task's workspace
        (a turn and a summary job) may fetch the same artifact at once. Only URLs of this
        backend are fetched: the token must not go elsewhere.
        """
        target = urljoin(self.base_url + "/", url)
        if _origin(target) != _origin(self.base_url):
            raise BackendError(f"artifact URL is not on this backend ({_origin(target)})")
        partial = partial_beside(destination)

        def attempt() -> None:
            digest = hashlib.sha256()
            with self._http.stream("GET", target) as response:
                _raise_for(response, read=True)
                partial.unlink(missing_ok=True)  # an earlier attempt's
                # "x": a new file of this writer's own, never one planted at its name.
                with partial.open("xb") as file:
                    for chunk in response.iter_bytes(1 << 20):
                        digest.update(chunk)
                        file.write(chunk)
            if digest.hexdigest() != sha256:
                partial.unlink(missing_ok=True)
                raise BackendError(
                    f"artifact checksum mismatch: expected sha256 {sha256[:16]}…, "
                    f"received {digest.hexdigest()[:16]}…"
                )
            partial.replace(destination)

        try:
            self._with_retries(attempt, self._retry_budget)
        finally:
            partial.unlink(missing_ok=True)

    # -- plumbing ---------------------------------------------------------------------------

    def _post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        budget: float | None = None,
        http: httpx.Client | None = None,
        timeout: httpx.Timeout | None = None,
        extensions: dict[str, Any] | None = None,
        give_up: threading.Event | None = None,
    ) -> Any:
        """POST with retries, on `http` (the shared pool by default); `timeout` replaces the
        client's own for this call; see `_with_retries` for `give_up`."""
        client = http or self._http

        content = json_body(body)

        def attempt() -> Any:
            response = client.post(
                path,
                content=content,
                headers={"Content-Type": "application/json"},
                timeout=timeout or client.timeout,
                extensions=extensions,
            )
            _raise_for(response)
            return response.json()

        budget = self._retry_budget if budget is None else budget
        return self._with_retries(attempt, budget, give_up=give_up)

    def _with_retries(
        self, call: Callable[[], _T], budget: float, *, give_up: threading.Event | None = None
    ) -> _T:
        """`call` until it answers, retrying transient failures within `budget` seconds; once
        `give_up` is set, no (further) attempt is made: DispatchAbandoned."""
        deadline = time.monotonic() + budget
        delay = 0.1
        while True:
            if give_up is not None and give_up.is_set():
                raise DispatchAbandoned("the worker stopped dispatching")
            try:
                return call()
            except (httpx.TransportError, _Transient) as error:
                if give_up is not None and give_up.is_set():
                    raise DispatchAbandoned("the worker stopped dispatching") from None
                if self._closed.is_set() or time.monotonic() + delay > deadline:
                    raise BackendUnavailable(
                        f"the backend is unavailable ({_describe(error)})"
                    ) from None
                logger.warning(
                    "backend call failed (%s); retrying in %.1f s", _describe(error), delay
                )
                # Jitter so workers do not stampede; not a secret.
                pause = delay * (0.5 + random.random())  # noqa: S311
                if give_up is None:
                    time.sleep(pause)
                else:
                    give_up.wait(pause)
                delay = min(delay * 2, 5.0)


class _DispatchLine:
    """The dispatch connection, and hanging up on it when the worker stops.

    Dispatches have a pool of their own with one connection, used by the claim loop alone, so
    the socket of the connection it opened last — noted through httpx's `trace` extension —
    is the one a dispatch in flight is on. Hanging up shuts that socket down, which wakes its
    blocked read at once, whether the read is in another thread or in the main thread that a
    signal handler interrupted (closing it would do neither, nor tell the backend). The
    backend then sees its client gone and claims nothing for it. Should the answer have
    arrived already, it is still read whole (a shutdown keeps what was received), and the
    worker gives back the turns it carries; one cut off halfway is lost, and its turns wait
    for their leases to expire, as for any worker that goes at that instant.

    No lock: `hang_up` may run in a signal handler on the very thread that is in the middle of
    `trace` or `in_flight`. Each side sets its flag before it looks at the other's, so
    whatever the interleaving, one of them shuts the connection down.
    """

    def __init__(self) -> None:
        self.hung_up = threading.Event()
        self._socket: socket.socket | None = None
        self._waiting = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's `trace` callback: note each new connection's socket (with TLS, the wrapped
        one; through a proxy, the one to the proxy, which then hangs up on the backend)."""
        if not event.endswith((".connect_tcp.complete", ".start_tls.complete")):
            return
        stream = info.get("return_value")
        self._socket = stream.get_extra_info("socket") if stream is not None else None
        if self._waiting and self.hung_up.is_set():
            self._shut_down()

    @contextmanager
    def in_flight(self, *, waiting: bool) -> Iterator[None]:
        """Around one dispatch; a waiting one is hung up on when the worker stops (one that
        has not been sent yet is not sent: `_with_retries` looks at `hung_up` first)."""
        self._waiting = waiting
        try:
            yield
        finally:
            self._waiting = False

    def hang_up(self) -> None:
        self.hung_up.set()
        if self._waiting:
            self._shut_down()

    def _shut_down(self) -> None:
        sock = self._socket
        if sock is None:
            return
        with suppress(OSError):  # closed already: nothing is in flight on it
            sock.shutdown(socket.SHUT_RDWR)


def partial_beside(destination: Path) -> Path:
    """A temporary file beside `destination`, this writer's own, to be renamed into place once
    whole: two runs in one task's workspace may write the same file at once."""
    return destination.with_name(f".{destination.name}.{uuid.uuid4().hex[:12]}.partial")


def uploads_value(value: object) -> bool:
    """Whether a result's value is uploaded before the report rather than sent inside it: a
    string of more than VALUE_UPLOAD_MIN_BYTES of UTF-8 that an upload can hold (no NUL, no
    lone surrogate; such a rare value goes inline, where Baton keeps it as it is)."""
    if not isinstance(value, str) or 4 * len(value) <= VALUE_UPLOAD_MIN_BYTES:
        return False  # at most 4 bytes a character: too short to need it
    if _NOT_UPLOADABLE.search(value) is not None:
        return False
    return (
        len(value) > VALUE_UPLOAD_MIN_BYTES
        or sum(len(chunk) for chunk in _utf8_chunks(value)) > VALUE_UPLOAD_MIN_BYTES
    )


def json_body(body: Any) -> bytes:
    """`body` as the UTF-8 JSON of a request: the one place the worker serializes what it sends.

    Whatever text an executor emitted can be sent: a lone surrogate, which UTF-8 cannot encode
    (it made the encoder raise, and killed the thread that sent it), becomes U+FFFD; NUL and
    other control characters are escaped by JSON itself (`\\u0000`), so they arrive as sent.
    """
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def _utf8_chunks(value: str) -> Iterator[bytes]:
    for start in range(0, len(value), _ENCODE_CHUNK_CHARS):
        yield value[start : start + _ENCODE_CHUNK_CHARS].encode("utf-8")


class _Transient(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _raise_for(response: httpx.Response, *, read: bool = False) -> None:
    if response.status_code < 400:
        return
    if response.status_code in RETRY_STATUSES:
        raise _Transient(response.status_code)
    if read:
        response.read()
    try:
        body = response.json()
    except ValueError:
        body = {}
    code = body.get("code", "") if isinstance(body, dict) else ""
    detail = body.get("detail", "") if isinstance(body, dict) else ""
    message = f"HTTP {response.status_code} from {response.request.url.path}: {detail or code}"
    if response.status_code == 409 and code == "cancelled":
        raise TurnCancelled(message, status=409, code=code)
    if response.status_code == 409 and code == "lease_lost":
        raise LeaseLost(message, status=409, code=code)
    if response.status_code == 409 and code == "partial_text_mismatch":
        raise PartialTextMismatch(message, status=409, code=code)
    raise BackendError(message, status=response.status_code, code=code)


def _describe(error: Exception) -> str:
    return type(error).__name__ if not str(error) else f"{type(error).__name__}: {error}"


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _progress_outcome(turn: dict[str, Any]) -> ProgressOutcome | None:
    outcome = turn.get("progress")
    if not isinstance(outcome, dict):
        return None
    chars = outcome.get("partial_text_chars")
    return ProgressOutcome(
        stored=outcome.get("stored") is True,
        partial_text_chars=chars if isinstance(chars, int) else None,
        code=outcome.get("code"),
    )
