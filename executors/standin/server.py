"""ModelServer: a loopback HTTP model server that records every request and answers from a script.

Baton's tests run the real executors (Codex CLI, Claude Code, Agno) against it, and demos without
a model provider use its stand-in answers. One `ThreadingHTTPServer` serves all three wire
protocols; the route is chosen by the path's suffix so any prefix (``/v1``) works. Every request
is recorded — unknown routes too, so a new executor version's extra calls show up in tests.

Each model call (Responses, Chat Completions, Messages) consumes one scripted turn under one lock,
so turn order equals arrival order even with concurrent clients; the last turn repeats. With no
script, every model call gets the stand-in answer. A request is recorded when it arrives, before
any scripted delay, so a test can wait for it while the "model" is still thinking.

A context limit (`set_context_limit`) makes the server refuse, like a model with a small window,
every model call whose prompt — the last user text, the part Baton builds — counts more tokens
than the limit: it answers with the API's real context-length error, consumes no turn, and
records the call as `over_context_limit`. The executor's own instructions and tools are not
counted: they weigh the same on every attempt, so the limit stands for a real window less them.

Standalone (``python -m executors.standin``), the control routes ``POST /_script``,
``GET /_requests`` and ``POST /_reset`` do what `set_turns`, `requests` and `clear` do.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from executors.standin import anthropic_messages, openai_chat, openai_responses
from executors.standin.answer import earlier_answers, extract_prompt, standin_answer
from executors.standin.errors import anthropic_error, openai_error
from executors.standin.script import ScriptError, Turn, parse_turns
from executors.standin.wire import IdSource, JsonReply, Reply, StreamReply, json_bytes

_Render = Callable[[Turn, dict[str, Any], IdSource], Reply]
_RENDERERS: dict[str, _Render] = {
    openai_responses.API: openai_responses.reply,
    openai_chat.API: openai_chat.reply,
    anthropic_messages.API: anthropic_messages.reply,
}
# Models listed by `GET …/models`: the slugs Baton's tests give Codex/Agno and Claude Code.
LISTED_MODELS = ("gpt-5.5", "claude-sonnet-4-5")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it.

    ``api`` is the wire of a model call ("responses", "chat" or "messages") and None for every
    other request; ``turn_index`` is the scripted turn that answered it (None in stand-in mode).
    """

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    api: str | None = None
    turn_index: int | None = None
    over_context_limit: bool = False  # refused for a prompt over the context limit
    # When it arrived, by the wall clock (`time.time()`): benchmarks compare it with their own.
    received_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _route(method: str, path: str) -> str | None:
    """The model API or other known route for a request, None for a 404."""
    path = path.rstrip("/")
    if method == "POST":
        if path.endswith("/messages/count_tokens"):
            return "count_tokens"
        if path.endswith("/responses"):
            return openai_responses.API
        if path.endswith("/chat/completions"):
            return openai_chat.API
        if path.endswith("/messages"):
            return anthropic_messages.API
    if method == "GET" and path.endswith("/models"):
        return "models"
    return None


def approx_tokens(text: str) -> int:
    """About four UTF-8 bytes a token: what the server counts when told no tokenizer."""
    return (len(text.encode("utf-8")) + 3) // 4


class ModelServer:
    """The model server; see the module docstring. Thread-safe; a context manager."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        turns: Sequence[Mapping[str, Any]] | None = None,
        record_path: str | Path | None = None,
        keep_requests: bool = True,
    ) -> None:
        # A long-running demo worker passes keep_requests=False: requests are then not kept
        # in memory (nor written to record_path), so memory stays flat however long it runs.
        self._keep_requests = keep_requests
        self._address = (host, port)
        self._record_path = Path(record_path) if record_path is not None else None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._turns: tuple[Turn, ...] = parse_turns(turns)
        self._next_turn = 0
        self._context_limit: int | None = None
        self._count_tokens: Callable[[str], int] = approx_tokens
        self._requests: list[RecordedRequest] = []
        self._ids = IdSource()
        self._stopping = threading.Event()
        self._httpd: _ModelHttpServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ModelServer:
        if self._httpd is not None:
            raise RuntimeError("the model server is already started")
        httpd = _ModelHttpServer(self._address, model_server=self)
        self._httpd = httpd
        self._stopping.clear()
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="standin"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; scripted delays still running are cut short."""
        self._stopping.set()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ModelServer:
        if self._httpd is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` — no trailing slash and no ``/v1``."""
        if self._httpd is None:
            raise RuntimeError("the model server is not started")
        return f"http://{self._httpd.host}:{self._httpd.port}"

    # -- script and records ----------------------------------------------------------------

    def set_turns(self, turns: Sequence[Mapping[str, Any]] | None) -> None:
        """Replace the script and rewind it; None or [] switches to stand-in answers."""
        parsed = parse_turns(turns)
        with self._lock:
            self._turns = parsed
            self._next_turn = 0

    def set_context_limit(
        self, max_prompt_tokens: int | None, count_tokens: Callable[[str], int] = approx_tokens
    ) -> None:
        """Refuse every model call whose prompt counts more than `max_prompt_tokens` (by
        `count_tokens`, about four bytes a token unless given) with the API's context-length
        error; None lifts the limit."""
        with self._lock:
            self._context_limit = max_prompt_tokens
            self._count_tokens = count_tokens

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received since the last `clear`."""
        with self._lock:
            return list(self._requests)

    def model_requests(self) -> list[RecordedRequest]:
        """Only the model calls (each consumed a turn, or got a stand-in answer)."""
        with self._lock:
            return [request for request in self._requests if request.api is not None]

    def clear(self) -> None:
        """Forget the recorded requests and rewind the script to its first turn."""
        with self._lock:
            self._requests.clear()
            self._next_turn = 0

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until ``n`` model calls were received; their records, or TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                received = [request for request in self._requests if request.api is not None]
                if len(received) >= n:
                    return received
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"expected {n} model requests within {timeout} s, got {len(received)}"
                    )
                self._changed.wait(remaining)

    # -- used by the handler ---------------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        """Append ``request``; the caller holds the lock."""
        if not self._keep_requests:
            return
        self._requests.append(request)
        if self._record_path is not None:
            with self._record_path.open("a", encoding="utf-8") as file:
                file.write(json.dumps(request.to_json(), ensure_ascii=False) + "\n")
        self._changed.notify_all()

    def _record_other(self, request: RecordedRequest) -> None:
        with self._lock:
            self._record(request)

    def _take_turn(self, request: RecordedRequest) -> Turn:
        """Consume the next turn for a model call and record the call with its index."""
        assert request.api is not None
        with self._lock:
            if self._context_limit is not None:
                prompt = extract_prompt(request.api, request.body) or ""
                if self._count_tokens(prompt) > self._context_limit:
                    self._record(replace(request, over_context_limit=True))
                    return Turn(context_overflow=True)
            if not self._turns:
                self._record(request)
                prompt = extract_prompt(request.api, request.body) or ""
                answers = earlier_answers(request.api, request.body or {})
                return Turn(text=standin_answer(prompt, earlier_answers=answers))
            index = min(self._next_turn, len(self._turns) - 1)
            self._next_turn += 1
            self._record(replace(request, turn_index=index))
            return self._turns[index]

    def _answer(self, api: str, turn: Turn, body: dict[str, Any]) -> Reply:
        if turn.delay_seconds:
            self._stopping.wait(turn.delay_seconds)
        return _RENDERERS[api](turn, body, self._ids)


def _error_body(api: str | None, status: int, message: str) -> dict[str, Any]:
    if api == anthropic_messages.API:
        return anthropic_error(status, message)
    return openai_error(status, message)


class _ModelHttpServer(ThreadingHTTPServer):
    """The HTTP server that hands each request to its ModelServer."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, model_server: ModelServer) -> None:
        super().__init__(address, _Handler)
        self.model_server = model_server
        # The bound address (the port when 0 was asked for); an AF_INET socket names it (str, int).
        self.host: str
        self.port: int
        self.host, self.port = self.socket.getsockname()[:2]


class _Handler(BaseHTTPRequestHandler):
    """Reads one request, hands it to the ModelServer, writes its Reply."""

    # HTTP/1.1 keeps connections alive as clients expect; SSE bodies are sent chunked.
    protocol_version = "HTTP/1.1"
    server_version = "BatonStandin/1"

    @property
    def _model_server(self) -> ModelServer:
        assert isinstance(self.server, _ModelHttpServer)  # the only server _Handler serves
        return self.server.model_server

    def log_message(self, format: str, *args: Any) -> None:
        # Requests are recorded; a line per request on stderr would only be noise in test output.
        return

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_OPTIONS(self) -> None:
        self._handle()

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            raw = b"".join(chunks)
        else:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        encoding = self.headers.get("content-encoding", "").lower()
        if encoding == "gzip":
            return gzip.decompress(raw)
        if encoding == "deflate":
            return zlib.decompress(raw)
        return raw

    def _handle(self) -> None:
        try:
            self._dispatch()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away (an executor killed mid-answer); nothing left to tell it.
            self.close_connection = True

    def _dispatch(self) -> None:
        server = self._model_server
        parts = urlsplit(self.path)
        raw = self._read_body()
        try:
            body: Any = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if parts.path in ("/_script", "/_requests", "/_reset"):
            self._control(parts.path, body)
            return

        route = _route(self.command, parts.path)
        request = RecordedRequest(
            method=self.command,
            path=parts.path,
            query=dict(parse_qsl(parts.query, keep_blank_values=True)),
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
            received_at=time.time(),
        )
        if route in _RENDERERS and isinstance(body, dict):
            assert route is not None
            turn = server._take_turn(replace(request, api=route))
            self._send(server._answer(route, turn, body))
            return
        server._record_other(request)
        if route in _RENDERERS:
            message = "The request body is not a JSON object."
            self._send(JsonReply(400, _error_body(route, 400, message)))
        elif route == "count_tokens":
            # Roughly four characters per token: enough for a client that only displays it.
            self._send(JsonReply(200, {"input_tokens": max(len(raw) // 4, 1)}))
        elif route == "models":
            models = [
                {"id": model, "object": "model", "created": 0, "owned_by": "baton-standin"}
                for model in LISTED_MODELS
            ]
            self._send(JsonReply(200, {"object": "list", "data": models}))
        else:
            message = f"No route for {self.command} {parts.path} on the Baton stand-in model."
            self._send(JsonReply(404, _error_body(None, 404, message)))

    def _control(self, path: str, body: Any) -> None:
        server = self._model_server
        if path == "/_requests" and self.command == "GET":
            self._send(JsonReply(200, {"requests": [r.to_json() for r in server.requests]}))
        elif path == "/_reset" and self.command == "POST":
            server.clear()
            self._send(JsonReply(200, {"ok": True}))
        elif path == "/_script" and self.command == "POST":
            turns = body.get("turns") if isinstance(body, dict) else None
            try:
                server.set_turns(turns)
            except ScriptError as error:
                self._send(JsonReply(400, {"error": {"message": str(error)}}))
                return
            self._send(JsonReply(200, {"ok": True, "turns": len(turns or [])}))
        else:
            self._send(JsonReply(405, {"error": {"message": f"{self.command} {path} not allowed"}}))

    def _send(self, reply: Reply) -> None:
        if isinstance(reply, JsonReply):
            payload = json_bytes(json.dumps(reply.body, ensure_ascii=False))
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.send_header("x-request-id", self._model_server._ids.next("req"))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        assert isinstance(reply, StreamReply)
        self.send_response(reply.status)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("x-request-id", self._model_server._ids.next("req"))
        self.end_headers()
        for event in reply.events:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
