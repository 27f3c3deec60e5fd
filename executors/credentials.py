"""Provider keys stay in the worker: executors get a per-run token for a loopback proxy instead.

An agent runs commands, and a command can read the environment of every process it descends
from (`/proc/<pid>/environ`, which shows a process's environment as it started). So no process
an agent can run or read holds a provider key:

- The worker takes the keys out of its own environment at start (`hand_off_keys`): started with
  a key in its environment, it re-executes itself — same process id, same arguments — without
  the keys, which reach the new image through an inherited pipe (BATON_PROVIDER_KEYS_FD) that
  it reads and closes first thing (`take_handed_keys`). `/proc/<worker>/environ` then holds no
  key, and neither does any process the worker starts.
- Each executor kind's model calls go to the worker's `CredentialProxy`, on 127.0.0.1: the
  executor is given the proxy's address (`http://127.0.0.1:<port>/<kind>`) as its base URL
  and, as its API key, a token minted for its run (`ProxiedEndpoint.for_run`). The proxy
  accepts a request only with the token of a running run of that kind (compared in constant
  time), drops it, adds the real key the way the provider expects it (`Authorization: Bearer`
  for OpenAI, `x-api-key` for Anthropic) and forwards the request to the configured endpoint
  (the provider's, a gateway's — credentials in its URL included — or the stand-in model's).
  The answer streams back as it arrives: executors stream server-sent events. When the run
  ends its token is revoked, and the proxy refuses it from then on (403).

The proxy logs nothing: no path, no header, no body (principle 7 of docs/architecture.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import secrets
import sys
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from executors.adapters.base import ModelEndpoint
from executors.kinds import PROVIDERS, Provider

KEYS_FD_VARIABLE = "BATON_PROVIDER_KEYS_FD"
# How long the proxy waits for the next bytes of a model's answer (a model may think a while).
UPSTREAM_TIMEOUT_SECONDS = 900.0
_CHUNK_BYTES = 64 * 1024
# Hop-by-hop headers (RFC 9110 §7.6.1) and what the proxy sets itself.
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
        "x-api-key",
    }
)
_NOT_RETURNED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
    }
)


# -- keys out of the worker's environment ------------------------------------------------------


def hand_off_keys(argv: list[str], environ: Mapping[str, str]) -> None:
    """When `environ` holds a provider key: re-execute this program (`argv`: how it was
    started, `sys.orig_argv`) without any, handing the keys over an inherited pipe. Does not
    return then; returns at once when there is no key to hide."""
    names = [provider.api_key_variable for provider in PROVIDERS]
    keys = {name: environ[name] for name in names if environ.get(name)}
    if not keys:
        return
    reading, writing = os.pipe()
    data = json.dumps(keys).encode("utf-8")
    if len(data) > 60_000:  # the pipe's buffer takes it whole, with no reader yet
        raise ValueError("provider keys of more than 60 kB")
    os.write(writing, data)
    os.close(writing)
    os.set_inheritable(reading, True)
    env = {name: value for name, value in environ.items() if name not in names}
    env[KEYS_FD_VARIABLE] = str(reading)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)  # noqa: S606 - itself, again


def take_handed_keys(environ: MutableMapping[str, str]) -> dict[str, str]:
    """The keys `hand_off_keys` passed to this process (none when it passed nothing); the
    pipe is closed and its variable removed from `environ`."""
    fd = environ.pop(KEYS_FD_VARIABLE, None)
    if fd is None:
        return {}
    descriptor = int(fd)
    chunks = []
    try:
        while chunk := os.read(descriptor, _CHUNK_BYTES):
            chunks.append(chunk)
    finally:
        os.close(descriptor)
    keys = json.loads(b"".join(chunks).decode("utf-8"))
    return {str(name): str(value) for name, value in keys.items()}


# -- the proxy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Upstream:
    """Where one route's requests go, and the key the proxy adds to them."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    key_header: str = "authorization"  # "authorization" (a Bearer token) or "x-api-key"


@dataclass(frozen=True)
class _Grant:
    route: str
    digest: bytes


class CredentialProxy:
    """The worker's loopback proxy to the model providers (see the module doc). Thread-safe."""

    def __init__(self, routes: Mapping[str, Upstream]) -> None:
        self._routes = dict(routes)
        self._grants: dict[bytes, _Grant] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the proxy is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def route_url(self, route: str) -> str:
        """The base URL an executor of `route` is given."""
        return f"{self.url}/{route}"

    def start(self) -> CredentialProxy:
        server = _QuietServer(("127.0.0.1", 0), _ProxyHandler)
        server.proxy = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="baton-credential-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def grant(self, route: str) -> str:
        """A new token for one run of `route`, valid until `revoke`."""
        if route not in self._routes:
            raise KeyError(f"no upstream for {route!r}")
        token = f"baton-run-{secrets.token_urlsafe(32)}"
        digest = _digest(token)
        with self._lock:
            self._grants[digest] = _Grant(route=route, digest=digest)
        return token

    def revoke(self, token: str) -> None:
        with self._lock:
            self._grants.pop(_digest(token), None)

    @contextmanager
    def run_token(self, route: str) -> Iterator[str]:
        token = self.grant(route)
        try:
            yield token
        finally:
            self.revoke(token)

    def upstream_for(self, route: str, presented: str | None) -> Upstream | None:
        """`route`'s upstream when `presented` is the token of a running run of it, else None."""
        if presented is None:
            return None
        digest = _digest(presented)
        with self._lock:
            grant = self._grants.get(digest)
        if grant is None or not hmac.compare_digest(grant.digest, digest):
            return None
        if not hmac.compare_digest(grant.route.encode(), route.encode()):
            return None
        return self._routes.get(route)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Nothing: socketserver would print a traceback, which may quote a request."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class ProxiedEndpoint(ModelEndpoint):
    """A kind's endpoint through the proxy: each run gets its own token (`for_run`)."""

    proxy: CredentialProxy | None = field(default=None, repr=False, compare=False)
    route: str = ""

    def for_run(self) -> AbstractContextManager[ModelEndpoint]:
        return self._for_run()

    @contextmanager
    def _for_run(self) -> Iterator[ModelEndpoint]:
        assert self.proxy is not None
        with self.proxy.run_token(self.route) as token:
            yield ModelEndpoint(
                base_url=self.proxy.route_url(self.route),
                api_key=token,
                max_retries=self.max_retries,
            )


def upstream_for_provider(
    provider: Provider, *, base_url: str | None, api_key: str | None
) -> Upstream:
    """What the proxy forwards a kind's calls to: its endpoint (the provider's own API when
    none is configured) without the `/v1` its clients append themselves, and its key."""
    base = (base_url or provider.default_base_url).rstrip("/")
    if provider.clients_append_v1 and base.endswith("/v1"):
        base = base[: -len("/v1")]
    return Upstream(base_url=base, api_key=api_key, key_header=provider.key_header)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "baton-proxy"
    sys_version = ""
    _ERROR: ClassVar[bytes] = json.dumps(
        {
            "error": {
                "type": "permission_error",
                "message": "Baton's credential proxy refused the key: it is no running turn's.",
            }
        }
    ).encode()

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: a request line names a path, and errors may quote a header."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._forward()

    def do_POST(self) -> None:  # noqa: N802
        self._forward()

    def do_PUT(self) -> None:  # noqa: N802
        self._forward()

    def do_PATCH(self) -> None:  # noqa: N802
        self._forward()

    def do_DELETE(self) -> None:  # noqa: N802
        self._forward()

    def do_HEAD(self) -> None:  # noqa: N802
        self._forward()

    def _forward(self) -> None:
        proxy: CredentialProxy = self.server.proxy  # type: ignore[attr-defined]
        route, _, rest = self.path.lstrip("/").partition("/")
        upstream = proxy.upstream_for(route, self._presented_token())
        if upstream is None:
            self._refuse(403, self._ERROR)
            return
        body = self._read_body()
        target = urlsplit(upstream.base_url)
        path = f"{target.path.rstrip('/')}/{rest}"
        if target.query:
            path += ("&" if "?" in path else "?") + target.query
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in _NOT_FORWARDED
        }
        if upstream.api_key is not None:
            if upstream.key_header == "authorization":
                headers["Authorization"] = f"Bearer {upstream.api_key}"
            else:
                headers[upstream.key_header] = upstream.api_key
        if target.username is not None and "Authorization" not in headers:
            user = f"{unquote(target.username)}:{unquote(target.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
        connection_class = (
            http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
        )
        host = target.hostname or "127.0.0.1"
        connection = connection_class(host, target.port, timeout=UPSTREAM_TIMEOUT_SECONDS)
        try:
            try:
                connection.request(self.command, path, body=body, headers=headers)
                response = connection.getresponse()
            except (OSError, http.client.HTTPException, ValueError):
                # Unreachable, or a path or header http.client refuses to send.
                self._refuse(502, b'{"error":{"message":"the model endpoint did not answer"}}')
                return
            self._relay(response)
        finally:
            connection.close()

    def _presented_token(self) -> str | None:
        key = self.headers.get("x-api-key")
        if key:
            return key
        authorization = self.headers.get("authorization") or ""
        scheme, _, token = authorization.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(parts)
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else None

    def _refuse(self, status: int, payload: bytes) -> None:
        self.close_connection = True  # its body, if any, is left unread
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def _relay(self, response: http.client.HTTPResponse) -> None:
        """Status, headers, then the body as it arrives: chunk by chunk, never held whole."""
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _NOT_RETURNED:
                self.send_header(name, value)
        no_body = self.command == "HEAD" or response.status in (204, 304) or response.status < 200
        length = response.getheader("content-length")
        chunked = not no_body and (length is None or response.chunked)
        if no_body:
            self.send_header("Content-Length", length or "0")
        elif chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        if no_body:
            return
        try:
            while chunk := response.read1(_CHUNK_BYTES):
                if chunked:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                else:
                    self.wfile.write(chunk)
                self.wfile.flush()
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:
            self.close_connection = True  # cut off halfway: the client sees the stream end
