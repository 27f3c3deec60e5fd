"""The worker's credential proxy and key hand-off (`executors.credentials`), against a real
loopback upstream: tokens, keys, streaming, and nothing logged."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from executors.credentials import (
    KEYS_FD_VARIABLE,
    CredentialProxy,
    ProxiedEndpoint,
    Upstream,
    upstream_for_provider,
)
from executors.kinds import ANTHROPIC, OPENAI

REPO_ROOT = Path(__file__).resolve().parents[2]
OPENAI_KEY, ANTHROPIC_KEY = "sk-real-openai-key", "sk-ant-real-key"


class _Upstream(BaseHTTPRequestHandler):
    """A model API: records each request; `/stream` sends two server-sent events, the second
    only once the test saw the first arrive through the proxy."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.path, dict(self.headers.items()), body))  # type: ignore[attr-defined]
        if self.path.endswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for number, event in enumerate((b"data: one\n\n", b"data: two\n\n")):
                if number:
                    assert self.server.first_seen.wait(10)  # type: ignore[attr-defined]
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        data = json.dumps({"ok": True, "length": len(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def upstream() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.seen, server.first_seen = [], threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(upstream: ThreadingHTTPServer) -> Iterator[CredentialProxy]:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    running = CredentialProxy(
        {
            "codex": upstream_for_provider(OPENAI, base_url=f"{url}/v1", api_key=OPENAI_KEY),
            "claude_code": upstream_for_provider(
                ANTHROPIC, base_url=f"{url}/v1", api_key=ANTHROPIC_KEY
            ),
        }
    ).start()
    yield running
    running.stop()


def test_a_runs_token_is_swapped_for_the_real_key_and_refused_once_the_run_ended(proxy, upstream):
    endpoint = ProxiedEndpoint(max_retries=1, proxy=proxy, route="codex")
    with endpoint.for_run() as run:
        assert run.base_url == f"{proxy.url}/codex" and run.max_retries == 1
        assert run.api_key is not None and OPENAI_KEY not in run.api_key
        answer = httpx.post(
            f"{run.base_url}/responses?x=1",
            headers={"Authorization": f"Bearer {run.api_key}"},
            content=b'{"input": "hi"}',
        )
        assert answer.json() == {"ok": True, "length": 15}
        with proxy.run_token("claude_code") as other:
            # Claude Code's way: x-api-key, and it appends /v1 itself (not twice upstream).
            answer = httpx.post(
                f"{proxy.url}/claude_code/v1/messages?beta=true",
                headers={"x-api-key": other},
                json={},
            )
            assert answer.status_code == 200
            # A token is its route's only.
            crossed = httpx.post(
                f"{proxy.url}/claude_code/v1/messages", headers={"x-api-key": run.api_key}
            )
            assert crossed.status_code == 403
    [(path, headers, body), (claude_path, claude_headers, _)] = upstream.seen
    assert (path, body) == ("/v1/responses?x=1", b'{"input": "hi"}')
    assert headers["Authorization"] == f"Bearer {OPENAI_KEY}"
    assert claude_path == "/v1/messages?beta=true"
    assert claude_headers["x-api-key"] == ANTHROPIC_KEY and "Authorization" not in claude_headers
    # The run is over: its token is refused, as are made-up ones and none; nothing goes on.
    for headers in (
        {"Authorization": f"Bearer {run.api_key}"},
        {"x-api-key": run.api_key},
        {"Authorization": "Bearer baton-run-guessed"},
        {},
    ):
        refused = httpx.post(f"{proxy.url}/codex/responses", headers=headers, json={})
        assert refused.status_code == 403
    assert len(upstream.seen) == 2


def test_an_answer_streams_through_as_it_arrives(proxy, upstream):
    """The upstream sends its second event only once the first came out of the proxy: a
    proxy that held the answer whole would never deliver."""
    with (
        proxy.run_token("codex") as token,
        httpx.stream(
            "POST",
            f"{proxy.url}/codex/stream",
            headers={"Authorization": f"Bearer {token}"},
            json={},
            timeout=20,
        ) as response,
    ):
        received = b""
        for chunk in response.iter_raw():
            received += chunk
            if b"data: one" in received:
                upstream.first_seen.set()
    assert received == b"data: one\n\ndata: two\n\n"
    assert response.headers["content-type"] == "text/event-stream"


def test_a_gateway_url_keeps_its_credentials_and_query(upstream):
    port = upstream.server_address[1]
    gateway = Upstream(base_url=f"http://team:pa%3Ass@127.0.0.1:{port}/gw/v1?tenant=7")
    running = CredentialProxy({"agno": gateway}).start()
    try:
        with running.run_token("agno") as token:
            httpx.post(
                f"{running.url}/agno/chat/completions",
                headers={"Authorization": f"Bearer {token}"},
                json={},
            )
    finally:
        running.stop()
    [(path, headers, _)] = upstream.seen
    assert path == "/gw/v1/chat/completions?tenant=7"
    assert headers["Authorization"] == "Basic dGVhbTpwYTpzcw=="  # team:pa:ss


def test_the_proxy_logs_nothing(proxy, upstream, caplog, capfd):
    with caplog.at_level(logging.DEBUG), proxy.run_token("codex") as token:
        httpx.post(f"{proxy.url}/codex/x", headers={"Authorization": f"Bearer {token}"}, json={})
        httpx.post(f"{proxy.url}/codex/x", headers={"Authorization": "Bearer wrong"}, json={})
    assert not [record for record in caplog.records if not record.name.startswith("httpx")]
    assert capfd.readouterr().err == ""


def test_a_worker_started_with_keys_runs_without_them_in_its_environment():
    """The keys go over a pipe to the re-executed worker, whose /proc environ holds none."""
    program = (
        "import json, os, sys\n"
        "from executors.credentials import hand_off_keys, take_handed_keys\n"
        "hand_off_keys(sys.orig_argv, os.environ)\n"
        "keys = take_handed_keys(os.environ)\n"
        "with open(f'/proc/{os.getpid()}/environ', 'rb') as file:\n"
        "    environ = file.read().decode()\n"
        "print(json.dumps({'keys': keys, 'environ': environ, 'pid': os.getpid(),\n"
        "                  'fds': sorted(os.listdir('/proc/self/fd'))}))\n"
    )
    started = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", program],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "OPENAI_API_KEY": OPENAI_KEY,
            "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        },
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = started.communicate(timeout=60)
    report = json.loads(out)
    assert report["keys"] == {"OPENAI_API_KEY": OPENAI_KEY, "ANTHROPIC_API_KEY": ANTHROPIC_KEY}
    assert report["pid"] == started.pid  # the same process, re-executed
    assert OPENAI_KEY not in report["environ"] and ANTHROPIC_KEY not in report["environ"]
    assert KEYS_FD_VARIABLE in report["environ"]  # the pipe's number only; the pipe is closed
    assert len(report["fds"]) <= 4  # stdin, stdout, stderr and the listing's own


def test_an_upstream_that_does_not_answer_is_a_502_said_nowhere_else(capfd):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    running = CredentialProxy({"codex": Upstream(base_url=f"http://127.0.0.1:{dead}/v1")}).start()
    try:
        with running.run_token("codex") as token:
            headers = {"Authorization": f"Bearer {token}"}
            answer = httpx.post(f"{running.url}/codex/responses", headers=headers, json={})
            # A path http.client will not send on (a control character) is refused the same way.
            with socket.create_connection(("127.0.0.1", int(running.url.rsplit(":", 1)[1]))) as raw:
                raw.sendall(
                    b"POST /codex/a\x01b HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                    + f"Authorization: Bearer {token}\r\n\r\n".encode()
                )
                odd = raw.recv(100).split(b"\r\n", 1)[0]
    finally:
        running.stop()
    assert (answer.status_code, odd) == (502, b"HTTP/1.1 502 Bad Gateway")
    assert capfd.readouterr().err == ""
