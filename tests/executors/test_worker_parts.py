"""The worker's parts on their own: configuration, workspace safety, progress batching and the
HTTP client's retries (against a real loopback server)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from executors.client import (
    BackendClient,
    BackendError,
    BackendUnavailable,
    DispatchAbandoned,
    LeaseLost,
    PartialTextMismatch,
    TurnCancelled,
)
from executors.config import ConfigurationError, StandinMode, load_settings
from executors.events import MessageCompleted, MessageDelta, ToolStarted
from executors.payloads import ArtifactEntry, DispatchedTurn
from executors.progress import MAX_EVENTS_PER_POST, MAX_PARTIAL_TEXT_BYTES, ProgressBuffer
from executors.worker import Worker
from executors.workspace import (
    CACHE_GRACE_SECONDS,
    ArtifactRefused,
    artifact_destination,
    materialize_artifacts,
    task_workspace,
)
from tests.executors.runs import agno_turn_run

# --- configuration -------------------------------------------------------------------------

BASE_ENV = {"BATON_URL": "http://127.0.0.1:8000/", "BATON_WORKER_TOKEN": "tok"}


def test_flags_win_over_the_environment(tmp_path):
    env = {
        **BASE_ENV,
        "BATON_EXECUTOR_KINDS": "codex,agno",
        "BATON_WORKER_SLOTS": "3",
        "BATON_WORKSPACE_ROOT": str(tmp_path),
        "OPENAI_API_KEY": "sk-secret",
        "PATH": "/usr/bin",
        "AWS_SECRET_ACCESS_KEY": "not for executors",
    }
    settings = load_settings(["--slots", "5", "--worker-id", "w-9", "--once"], env)
    assert settings.backend_url == "http://127.0.0.1:8000"
    assert (settings.slots, settings.worker_id, settings.once) == (5, "w-9", True)
    assert settings.kinds == ("codex", "agno")
    assert settings.workspace_root == tmp_path
    assert settings.passthrough_env == {"PATH": "/usr/bin"}
    assert settings.standin is StandinMode.NEVER
    # Secrets never show in a repr (and so never in a log line that prints the settings).
    assert "sk-secret" not in repr(settings)
    assert "tok" not in repr(settings).replace("token", "")


def test_the_token_can_come_from_a_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"BATON_URL": "http://127.0.0.1:8000", "BATON_WORKER_TOKEN_FILE": str(token_file)}
    assert load_settings([], env).token == "from-file"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "missing --backend / BATON_URL and --token / BATON_WORKER_TOKEN"),
        (["--kinds", "codex,gpt"], BASE_ENV, "unknown executor kinds ['gpt']"),
        (["--slots", "0"], BASE_ENV, "slots"),
        (["--backend", "ftp://x"], BASE_ENV, "http:// or https://"),
        (
            [],
            {**BASE_ENV, "BATON_WORKER_TOKEN_FILE": "/nonexistent", "BATON_WORKER_TOKEN": ""},
            "token file",
        ),
    ],
)
def test_bad_configuration_is_one_clear_error(argv, env, message):
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_settings(argv, env)


def test_a_kind_without_a_provider_is_refused_unless_the_stand_in_answers():
    from executors.cli import model_endpoints

    settings = load_settings(["--kinds", "codex,claude_code"], {**BASE_ENV, "OPENAI_API_KEY": "k"})
    with pytest.raises(ConfigurationError, match="claude_code has no model provider"):
        model_endpoints(settings, standin_url=None)
    auto = load_settings(
        ["--kinds", "codex,claude_code", "--standin-model", "auto"],
        {**BASE_ENV, "OPENAI_API_KEY": "k"},
    )
    endpoints = model_endpoints(auto, standin_url="http://127.0.0.1:9")
    assert (endpoints["codex"].base_url, endpoints["codex"].api_key) == (None, "k")
    assert endpoints["claude_code"].base_url == "http://127.0.0.1:9"


# --- workspaces ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../outside.txt", ".baton/../../x", "a//b", "", "a\\b", "a\x00b", "./a/"],
)
def test_paths_that_would_leave_the_workspace_are_refused(tmp_path, path):
    workspace = task_workspace(root=tmp_path, task_id=1)
    with pytest.raises(ArtifactRefused):
        artifact_destination(workspace=workspace, relative_path=path)


def test_a_symlink_planted_in_the_workspace_cannot_redirect_a_write(tmp_path):
    workspace = task_workspace(root=tmp_path, task_id=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / ".baton").symlink_to(outside)
    with pytest.raises(ArtifactRefused, match="outside the workspace"):
        artifact_destination(workspace=workspace, relative_path=".baton/artifacts/a.txt")
    assert not any(outside.iterdir())


def test_a_bad_manifest_writes_nothing(tmp_path):
    workspace = task_workspace(root=tmp_path, task_id=1)
    entries = [_entry(b"good", ".baton/artifacts/good.txt"), _entry(b"bad", "../escape.txt")]
    with pytest.raises(ArtifactRefused):
        materialize_artifacts(client=None, workspace=workspace, manifest=entries)  # type: ignore[arg-type]
    assert not (workspace / ".baton" / "artifacts" / "good.txt").exists()


def _entry(content: bytes, path: str, url: str = "/api/artifacts/x/content/") -> ArtifactEntry:
    return ArtifactEntry(
        id="x",
        sha256=hashlib.sha256(content).hexdigest(),
        kind="text",
        size_bytes=len(content),
        size_chars=len(content),
        size_lines=1,
        path=path,
        download_url=url,
    )


# --- progress ------------------------------------------------------------------------------


def test_deltas_become_partial_text_and_posts_are_throttled():
    buffer = ProgressBuffer()
    buffer.add([MessageDelta("Hel"), MessageDelta("lo"), ToolStarted("c1", "shell", "ls")])
    batch = buffer.take(now=100.0)
    assert batch.partial_text == "Hello"
    assert batch.events == [
        {"type": "tool_started", "call_id": "c1", "tool": "shell", "command": "ls"}
    ]
    buffer.add([MessageDelta("!")])
    assert buffer.take(now=100.2) is None  # too soon
    assert buffer.take(now=100.6).partial_text == "Hello!"
    assert buffer.take(now=101.5) is None  # nothing new
    buffer.add([MessageCompleted("Final answer")])
    batch = buffer.take(now=102.0)
    assert (batch.partial_text, batch.events[0]["type"]) == ("Final answer", "message_completed")


def test_after_an_accepted_post_only_what_the_text_gained_is_sent():
    buffer = ProgressBuffer()
    buffer.add([MessageDelta("Hel")])
    first = buffer.take(now=1.0)
    # The worker does not know what Baton holds yet: the whole text.
    assert (first.partial_text, first.partial_text_append) == ("Hel", None)
    buffer.accepted(first, stored_chars=3)
    buffer.add([MessageDelta("lo"), MessageDelta(" wörld")])
    second = buffer.take(now=2.0)
    assert (second.partial_text, second.partial_text_append, second.partial_text_offset) == (
        None,
        "lo wörld",
        3,
    )
    buffer.accepted(second, stored_chars=11)
    # A completed message that repeats the deltas adds nothing; one that differs replaces.
    buffer.add([MessageCompleted("Hello wörld")])
    same = buffer.take(now=3.0)
    assert (same.partial_text, same.partial_text_append) == (None, None)
    buffer.add([MessageCompleted("Bye")])
    replaced = buffer.take(now=4.0)
    assert (replaced.partial_text, replaced.partial_text_append) == ("Bye", None)


def test_after_a_refused_post_the_whole_text_is_sent_even_with_nothing_new():
    buffer = ProgressBuffer()
    buffer.add([MessageDelta("abc")])
    buffer.accepted(buffer.take(now=1.0), stored_chars=3)
    buffer.add([MessageDelta("def")])
    lost = buffer.take(now=2.0)
    assert lost.partial_text_append == "def"
    buffer.refused(lost)
    again = buffer.take(now=3.0)
    assert (again.partial_text, again.partial_text_append) == ("abcdef", None)
    # A length Baton reads otherwise than the worker: the next post is whole again.
    buffer.accepted(again, stored_chars=5)
    buffer.add([MessageDelta("g")])
    assert buffer.take(now=4.0).partial_text == "abcdefg"


def test_a_mismatched_offset_is_sent_again_whole_with_its_events():
    buffer = ProgressBuffer()
    buffer.add([MessageDelta("abc")])
    buffer.accepted(buffer.take(now=1.0), stored_chars=3)
    buffer.add([MessageDelta("def"), ToolStarted("c1", "shell", "ls")])
    sent = []

    def send(batch):
        sent.append(batch)
        if batch.partial_text_append is not None:
            raise PartialTextMismatch("409", status=409, code="partial_text_mismatch")
        return len(batch.partial_text)

    buffer.deliver(buffer.take(now=2.0), send=send)
    assert [(batch.partial_text, batch.partial_text_append) for batch in sent] == [
        (None, "def"),
        ("abcdef", None),
    ]
    assert sent[1].events == sent[0].events != []
    buffer.add([MessageDelta("g")])
    assert buffer.take(now=3.0).partial_text_append == "g"


def test_a_failed_delivery_is_refused_and_raised():
    buffer = ProgressBuffer()
    buffer.add([MessageDelta("abc")])

    def send(batch):
        raise BackendError("down", status=503)

    with pytest.raises(BackendError):
        buffer.deliver(buffer.take(now=1.0), send=send)
    assert buffer.take(now=2.0).partial_text == "abc"


def test_over_the_limit_the_tail_is_sent_whole():
    buffer = ProgressBuffer()
    buffer.add([MessageDelta("a" * MAX_PARTIAL_TEXT_BYTES)])
    first = buffer.take(now=1.0)
    buffer.accepted(first, stored_chars=len(first.partial_text))
    buffer.add([MessageDelta("bc")])
    second = buffer.take(now=2.0)
    # The text's start moved: the tail replaces Baton's text, within the limit.
    assert second.partial_text_append is None
    assert len(second.partial_text.encode()) <= MAX_PARTIAL_TEXT_BYTES
    assert second.partial_text.endswith("abc")


def test_batches_respect_the_backends_limits():
    buffer = ProgressBuffer()
    buffer.add(
        [ToolStarted(f"c{n}", "shell", "x" * 10_000) for n in range(MAX_EVENTS_PER_POST + 5)]
    )
    buffer.add([MessageDelta("é" * MAX_PARTIAL_TEXT_BYTES)])
    first = buffer.take(now=10.0)
    assert len(first.events) == MAX_EVENTS_PER_POST
    assert all(len(event["command"]) < 4_100 for event in first.events)
    assert "chars truncated" in first.events[0]["command"]
    assert len(first.partial_text.encode()) <= MAX_PARTIAL_TEXT_BYTES
    assert first.partial_text.endswith("é")
    second = buffer.take(now=11.0)
    assert len(second.events) == 5
    assert second.partial_text is None


# --- the HTTP client -----------------------------------------------------------------------


# A script entry: hold the request unanswered until the client hangs up (at most 30 s), as a
# backend holds a waiting dispatch; the server's `hung_up` gets True if the client did.
HOLD = (0, {})


class _Backend(BaseHTTPRequestHandler):
    """A loopback stand-in for Baton's executor API that answers from a per-test script, and
    serves the bytes of `files` at their paths (GET)."""

    protocol_version = "HTTP/1.1"  # connections are kept alive, as Baton's servers keep them

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self._answer()

    def do_GET(self) -> None:  # noqa: N802
        self._answer()

    def do_PUT(self) -> None:  # noqa: N802
        self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization"), body))
        self.server.peers.append(self.client_address)
        if self.command == "GET" and self.path in self.server.files:
            status, payload = 200, self.server.files[self.path]
        else:
            status, payload = self.server.script.pop(0) if self.server.script else (200, {})
        if (status, payload) == HOLD:
            poller = select.poll()
            poller.register(self.connection, select.POLLRDHUP)
            self.server.hung_up.append(bool(poller.poll(30_000)))
            self.close_connection = True
            return
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def backend() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    server.script, server.seen, server.peers, server.hung_up = [], [], [], []
    server.files = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _client(server: ThreadingHTTPServer, **kwargs: object) -> BackendClient:
    host, port = server.server_address
    return BackendClient(base_url=f"http://{host}:{port}", token="t0k", worker_id="w", **kwargs)


def test_transient_answers_are_retried_and_final_ones_are_not(backend):
    backend.script = [(503, {}), (502, {}), (200, {"turns": [], "next_ready_in_seconds": None})]
    client = _client(backend)
    assert client.dispatch(kinds=["codex"], limit=2).turns == []
    assert len(backend.seen) == 3
    assert backend.seen[0][2] == "Token t0k"
    assert json.loads(backend.seen[0][3]) == {"kinds": ["codex"], "limit": 2, "worker_id": "w"}
    backend.script = [(400, {"detail": "bad", "code": "invalid"})]
    with pytest.raises(BackendError) as error:
        client.dispatch(kinds=["codex"], limit=1)
    assert (error.value.status, len(backend.seen)) == (400, 4)


def test_cancelled_and_lost_claims_are_told_apart(backend):
    client = _client(backend)
    backend.script = [(409, {"detail": "x", "code": "cancelled"})]
    with pytest.raises(TurnCancelled):
        client.progress(subtask_id=1, attempt=1, progress={"events": []})
    backend.script = [(409, {"detail": "x", "code": "lease_lost"})]
    with pytest.raises(LeaseLost):
        client.report(subtask_id=1, attempt=1, status="COMPLETED", result={"value": "x"})
    assert len(backend.seen) == 2  # a final answer: not retried


def test_progress_sends_an_append_and_reads_the_stored_length(backend):
    client = _client(backend)
    backend.script = [
        (200, {"subtask_id": 1, "status": "RUNNING", "attempt": 1, "partial_text_chars": 7}),
        (409, {"detail": "x", "code": "partial_text_mismatch", "partial_text_chars": 9}),
    ]
    stored = client.progress(
        subtask_id=1,
        attempt=1,
        progress={"events": [], "partial_text_append": "lo", "partial_text_offset": 5},
    )
    assert stored == 7
    assert json.loads(backend.seen[0][3]) == {
        "worker_id": "w",
        "attempt": 1,
        "events": [],
        "partial_text_append": "lo",
        "partial_text_offset": 5,
    }
    with pytest.raises(PartialTextMismatch):
        client.progress(
            subtask_id=1,
            attempt=1,
            progress={"events": [], "partial_text_append": "x", "partial_text_offset": 5},
        )


def test_a_report_refused_as_lease_lost_is_sent_once_and_logged_without_content(
    backend, tmp_path, caplog
):
    answer = "the answer nobody may log"
    detail = "Lease lost on turn 7 (attempt 1): the lease expired; Baton requeued the turn."
    backend.script = [(409, {"detail": detail, "code": "lease_lost"})]
    turn = DispatchedTurn.model_validate(
        {
            "task_id": 3,
            "subtask_id": 7,
            "message_id": 2,
            "attempt": 1,
            "task_type": "chat",
            "executor": "agno",
            "bot": "agno",
            "bot_config": {"bot": "agno", "executor": "agno"},
            "prompt": "the prompt nobody may log",
        }
    )
    run = agno_turn_run(turn=turn, client=_client(backend), root=tmp_path)
    with caplog.at_level(logging.INFO, logger="baton.worker"):
        run._report(status="COMPLETED", result={"value": answer})
    assert len(backend.seen) == 1
    assert run.reported is None
    [line] = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "baton.worker"
    ]
    assert (line["event"], line["code"], line["subtask"]) == (
        "turn_report_refused",
        "lease_lost",
        7,
    )
    assert "nobody may log" not in caplog.text


# Text an executor may emit that UTF-8 cannot carry (lone surrogates: JSON's "\\ud800" read
# by Python) beside a NUL and other controls, which JSON escapes.
UNENCODABLE = "low \udc80 high \ud83d pair-halves \ud83d\ude00 nul \x00 bell \x07 end"
SENT_AS = "low \ufffd high \ufffd pair-halves \ufffd\ufffd nul \x00 bell \x07 end"


def test_text_utf8_cannot_carry_is_sent_as_valid_json(backend):
    """Every post — heartbeat with progress, progress, report — goes out as UTF-8 JSON whatever
    an executor emitted: lone surrogates become U+FFFD, NUL stays (escaped)."""
    backend.script = [(200, {"turns": []}), (200, {"partial_text_chars": 3}), (200, {})]
    client = _client(backend)
    progress = {"partial_text": UNENCODABLE, "events": [{"type": "message", "text": UNENCODABLE}]}
    client.heartbeat([(7, 1)], progress={(7, 1): progress})
    client.progress(subtask_id=7, attempt=1, progress=progress)
    client.report(subtask_id=7, attempt=1, status="COMPLETED", result={"value": UNENCODABLE})
    heartbeat, posted, report = (json.loads(body) for _, _, _, body in backend.seen)
    assert heartbeat["turns"][0]["progress"] == {
        "partial_text": SENT_AS,
        "events": [{"type": "message", "text": SENT_AS}],
    }
    assert (posted["partial_text"], report["result"]["value"]) == (SENT_AS, SENT_AS)
    assert all(b"\\u0000" in body for _, _, _, body in backend.seen)


def test_the_supervisor_outlives_a_heartbeat_that_raises(backend, tmp_path, caplog):
    """A heartbeat that fails with anything (a bug, text that cannot be sent) is one failed
    round: the supervisor goes on heartbeating, so leases, cancels and timeouts still work."""
    worker = _idle_worker(backend, tmp_path, BATON_WORKER_CLAIM_CHECK_SECONDS="0.05")
    run = agno_turn_run(turn=_turn(backend), client=worker.client, root=tmp_path)
    worker._runs[run.turn.subtask_id] = (run, threading.Thread(target=lambda: None))
    calls = []

    def heartbeat(claims, **kwargs):
        calls.append(claims)
        if len(calls) == 1:
            raise UnicodeEncodeError("utf-8", "\ud800 the answer nobody may log", 0, 1, "x")
        return []

    worker.client.heartbeat = heartbeat
    supervisor = threading.Thread(target=worker._supervise, daemon=True)
    with caplog.at_level(logging.INFO, logger="baton.worker"):
        supervisor.start()
        _wait_until(lambda: len(calls) >= 3, timeout=10)
        worker._finished.set()
        supervisor.join(timeout=10)
    assert calls[:3] == [[(7, 1)]] * 3
    failed = [
        json.loads(record.getMessage())
        for record in caplog.records
        if "heartbeat_failed" in record.getMessage()
    ]
    assert failed == [
        {"event": "heartbeat_failed", "status": None, "error_type": "UnicodeEncodeError"}
    ]
    assert "nobody may log" not in caplog.text


def test_a_value_baton_no_longer_holds_is_uploaded_once_more(backend):
    value = "a long answer ✓\n" * 80_000
    sha = hashlib.sha256(value.encode()).hexdigest()
    missing = {"detail": "upload it again", "code": "upload_missing"}
    backend.script = [
        (200, {"value_upload": sha}),
        (409, missing),
        (200, {"value_upload": sha}),
        (200, {}),
    ]
    client = _client(backend)
    client.report(subtask_id=7, attempt=2, status="COMPLETED", result={"value": value, "n": 1})
    assert [(method, path.split("?")[0]) for method, path, _, _ in backend.seen] == [
        ("PUT", "/api/executor/subtasks/7/result/value/"),
        ("POST", "/api/executor/subtasks/7/result/"),
        ("PUT", "/api/executor/subtasks/7/result/value/"),
        ("POST", "/api/executor/subtasks/7/result/"),
    ]
    assert backend.seen[0][1].endswith("?worker_id=w&attempt=2")
    assert backend.seen[0][3] == backend.seen[2][3] == value.encode()
    assert json.loads(backend.seen[3][3]) == {
        "worker_id": "w",
        "attempt": 2,
        "status": "COMPLETED",
        "result": {"value": None, "n": 1},
        "value_upload": sha,
    }
    # Missing twice is an error the worker reports, like any final answer.
    backend.seen.clear()
    backend.script = [(200, {"value_upload": sha}), (409, missing)] * 2
    with pytest.raises(BackendError) as refused:
        client.report(subtask_id=7, attempt=2, status="COMPLETED", result={"value": value})
    assert (refused.value.code, len(backend.seen)) == ("upload_missing", 4)


def test_an_unreachable_backend_gives_up_after_the_budget():
    client = BackendClient(
        base_url="http://127.0.0.1:9", token="t", worker_id="w", retry_budget_seconds=0.5
    )
    with pytest.raises(BackendUnavailable):
        client.dispatch(kinds=["codex"], limit=1)


def test_once_the_worker_stops_dispatching_no_dispatch_is_sent_but_reports_are(backend):
    client = _client(backend)
    client.stop_dispatching()
    for wait_seconds in (0, 20):
        with pytest.raises(DispatchAbandoned):
            client.dispatch(kinds=["codex"], limit=1, wait_seconds=wait_seconds)
    assert backend.seen == []
    # Turns that arrived as the worker stopped are still given back.
    client.report(subtask_id=3, attempt=1, status="RELEASE", error_code="shutdown")
    assert [path for _, path, _, _ in backend.seen] == ["/api/executor/subtasks/3/result/"]


def _dispatch_in_thread(client: BackendClient, **kwargs: object) -> tuple[threading.Thread, list]:
    """A dispatch in a thread of its own; the list gets what it raised, or its answer."""
    outcome: list = []

    def dispatch() -> None:
        try:
            outcome.append(client.dispatch(kinds=["codex"], limit=1, **kwargs))
        except Exception as error:  # noqa: BLE001 - the test looks at it
            outcome.append(error)

    thread = threading.Thread(target=dispatch, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("connection", ["new", "kept alive"])
def test_a_stop_hangs_up_on_a_waiting_dispatch_at_once(backend, connection):
    backend.script = [HOLD]
    client = _client(backend)
    if connection == "kept alive":
        backend.script.insert(0, (200, NOTHING))
        assert client.dispatch(kinds=["codex"], limit=1).turns == []
    thread, outcome = _dispatch_in_thread(client, wait_seconds=30)
    _wait_until(lambda: len(backend.seen) == len(backend.peers) == 1 + (connection != "new"))
    assert len(set(backend.peers)) == 1  # one connection throughout
    time.sleep(0.2)  # the request is sent and waits for its answer
    stopping = time.monotonic()
    client.stop_dispatching()
    thread.join(timeout=10)
    assert time.monotonic() - stopping < 2
    assert [type(error) for error in outcome] == [DispatchAbandoned]
    # The backend saw its client go: the connection was closed, not left to the process's exit.
    _wait_until(lambda: backend.hung_up)
    assert backend.hung_up == [True]
    assert len(backend.seen) == 1 + (connection != "new")  # it was not sent again


def test_a_stop_ends_the_retries_of_a_dispatch_the_backend_does_not_answer():
    client = BackendClient(base_url="http://127.0.0.1:9", token="t", worker_id="w")
    thread, outcome = _dispatch_in_thread(client)  # retried for up to a minute
    time.sleep(0.5)
    stopping = time.monotonic()
    client.stop_dispatching()
    thread.join(timeout=10)
    assert time.monotonic() - stopping < 1
    assert [type(error) for error in outcome] == [DispatchAbandoned]


def _wait_until(condition: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_downloads_are_checked_before_they_appear(backend, tmp_path):
    content = b"the whole text\n" * 1000
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=7)
    entry = _entry(content, ".baton/artifacts/x.txt")
    backend.script = [(200, b"tampered" + content)]
    with pytest.raises(BackendError, match="checksum mismatch"):
        materialize_artifacts(client=client, workspace=workspace, manifest=[entry])
    target = workspace / ".baton" / "artifacts" / "x.txt"
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no partial file left behind
    backend.script = [(200, content)]
    assert materialize_artifacts(client=client, workspace=workspace, manifest=[entry]) == 1
    assert target.read_bytes() == content
    # The next turn names the same artifact: it is already there and is not fetched again.
    assert materialize_artifacts(client=client, workspace=workspace, manifest=[entry]) == 0
    # Another origin never gets the token.
    elsewhere = _entry(content, ".baton/artifacts/y.txt", url="http://example.com/a")
    with pytest.raises(BackendError, match="not on this backend"):
        materialize_artifacts(client=client, workspace=workspace, manifest=[elsewhere])


def test_one_artifact_at_several_paths_is_downloaded_once(backend, tmp_path):
    content = b"a spilled answer, also the turn's file\n" * 100
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=7)
    paths = [".baton/artifacts/x.txt", ".baton/history/turns/4.md", ".baton/history/turns/6.md"]
    entries = [_entry(content, path) for path in paths]
    backend.script = [(200, content)]
    assert materialize_artifacts(client=client, workspace=workspace, manifest=entries) == 1
    assert all((workspace / path).read_bytes() == content for path in paths)
    assert len(backend.seen) == 1
    # A copy that went missing is made again from the one already there, not downloaded.
    (workspace / paths[2]).unlink()
    assert materialize_artifacts(client=client, workspace=workspace, manifest=entries) == 0
    assert (workspace / paths[2]).read_bytes() == content and len(backend.seen) == 1


def test_workspaces_are_per_task_and_reused(tmp_path):
    first = task_workspace(root=tmp_path, task_id=3)
    (first / "notes.txt").write_text("kept")
    assert task_workspace(root=tmp_path, task_id=3) == first
    assert (first / "notes.txt").read_text() == "kept"
    assert task_workspace(root=tmp_path, task_id=4) != first
    assert isinstance(first, Path)


# --- long histories: composite files and artifact lists (manifest version 2) ---------------

CACHE = (".baton", "cache")


def _served(backend: ThreadingHTTPServer, artifact_id: str, content: bytes) -> dict:
    """An artifact the stand-in serves by its id, as a dispatch names a part or a list."""
    url = f"/api/artifacts/{artifact_id}/content/"
    backend.files[url] = content
    sha256 = hashlib.sha256(content).hexdigest()
    return {"id": artifact_id, "sha256": sha256, "size_bytes": len(content), "download_url": url}


def _composite(path: str, parts: list[dict]) -> dict:
    """A manifest entry whose file is `parts` in order; its sha256 names the composite."""
    name = hashlib.sha256("".join(part["sha256"] for part in parts).encode()).hexdigest()
    return {
        "id": name[:16],
        "sha256": name,
        "kind": "transcript",
        "size_bytes": sum(part["size_bytes"] for part in parts),
        "size_chars": 0,
        "size_lines": 0,
        "path": path,
        "download_url": f"/api/artifacts/{name[:16]}/content/",
        "parts": parts,
    }


def _listed(backend: ThreadingHTTPServer, artifact_id: str, content: bytes, path: str) -> dict:
    """A file of an artifact list: served by its id, with no download URL of its own."""
    served = _served(backend, artifact_id, content)
    return {
        "id": artifact_id,
        "sha256": served["sha256"],
        "kind": "turn",
        "size_bytes": len(content),
        "size_chars": len(content.decode()),
        "size_lines": content.count(b"\n"),
        "path": path,
    }


def _turn(backend: ThreadingHTTPServer, **fields: object) -> DispatchedTurn:
    """A dispatched turn as the client reads it from the backend's JSON."""
    host, port = backend.server_address
    payload = {
        "task_id": 3,
        "subtask_id": 7,
        "message_id": 2,
        "attempt": 1,
        "task_type": "chat",
        "executor": "agno",
        "bot": "agno",
        "bot_config": {"bot": "agno", "executor": "agno"},
        "prompt": "p",
        "manifest_version": 2,
        "artifact_url_template": f"http://{host}:{port}/api/artifacts/{{id}}/content/",
        **fields,
    }
    return DispatchedTurn.model_validate_json(json.dumps(payload))


def _materialize(client: BackendClient, workspace: Path, turn: DispatchedTurn) -> int:
    return materialize_artifacts(
        client=client,
        workspace=workspace,
        manifest=turn.artifacts,
        artifact_lists=turn.artifact_lists,
        artifact_url_template=turn.artifact_url_template,
        manifest_version=turn.manifest_version,
    )


def _workspace_files(workspace: Path) -> list[str]:
    """The files at workspace paths: what the agent sees, the worker's cache left out."""
    return sorted(
        str(path.relative_to(workspace))
        for path in workspace.rglob("*")
        if path.is_file() and path.relative_to(workspace).parts[:2] != CACHE
    )


TRANSCRIPT, INDEX = ".baton/history/task-3.md", ".baton/history/turns/index.md"
PART_TEXTS = [
    "User: first ✓\n".encode() * 500,
    b"Assistant: second\n" * 300,
    "User: third, ünïcödé\n".encode() * 200,
    b"| 1 | turns/1.md |\n" * 50,
]


def _history_turn(backend: ThreadingHTTPServer) -> DispatchedTurn:
    """A transcript of three parts and a turn index whose parts share the second one."""
    one, two, three, four = (
        _served(backend, f"p{n}", text) for n, text in enumerate(PART_TEXTS, 1)
    )
    return _turn(
        backend,
        artifacts=[_composite(TRANSCRIPT, [one, two, three]), _composite(INDEX, [four, two])],
    )


def test_a_composite_file_is_its_parts_in_order_and_is_assembled_once(backend, tmp_path):
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=3)
    turn = _history_turn(backend)
    one, two, three, four = PART_TEXTS

    assert _materialize(client, workspace, turn) == 4  # the shared part is fetched once
    assert (workspace / TRANSCRIPT).read_bytes() == one + two + three
    assert (workspace / INDEX).read_bytes() == four + two
    assert len(backend.seen) == 4
    assert _workspace_files(workspace) == [TRANSCRIPT, INDEX]
    # The next turn names the same composites: nothing is fetched or written again.
    modified = (workspace / TRANSCRIPT).stat().st_mtime_ns
    assert _materialize(client, workspace, turn) == 0
    assert len(backend.seen) == 4
    assert (workspace / TRANSCRIPT).stat().st_mtime_ns == modified
    # A file the agent changed (same size) is assembled again, from the parts kept.
    with (workspace / TRANSCRIPT).open("r+b") as file:
        file.write(b"Robot")
    assert _materialize(client, workspace, turn) == 0
    assert (workspace / TRANSCRIPT).read_bytes() == one + two + three
    assert len(backend.seen) == 4


def test_cached_parts_no_turn_uses_go_after_the_grace_period(backend, tmp_path):
    """A long task's newest part is new on every turn: old ones must not pile up."""
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=3)
    one, two, three = (_served(backend, f"p{n}", PART_TEXTS[n - 1]) for n in (1, 2, 3))
    newest = _served(backend, "p5", b"Assistant: fifth\n" * 10)
    first = _turn(backend, artifacts=[_composite(TRANSCRIPT, [one, two, three])])
    assert _materialize(client, workspace, first) == 3
    cache = workspace.joinpath(*CACHE)
    old = time.time() - CACHE_GRACE_SECONDS - 60
    for path in cache.rglob("*"):
        os.utime(path, (old, old))
    # The next turn's transcript has another newest part in place of the third.
    later = _turn(backend, artifacts=[_composite(TRANSCRIPT, [one, two, newest])])
    assert _materialize(client, workspace, later) == 1
    kept = sorted(path.name for path in (cache / "parts").iterdir())
    assert kept == sorted(part["sha256"] for part in (one, two, newest))
    assert len(list((cache / "composites").iterdir())) == 1  # the first assembly's record went
    assert (workspace / TRANSCRIPT).read_bytes() == PART_TEXTS[0] + PART_TEXTS[1] + (
        b"Assistant: fifth\n" * 10
    )
    # Within the grace period nothing goes, used or not: another run may be using it.
    assert _materialize(client, workspace, first) == 1
    assert len(list((cache / "parts").iterdir())) == 4


def test_a_damaged_cached_part_is_fetched_again(backend, tmp_path):
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=3)
    turn = _history_turn(backend)
    assert _materialize(client, workspace, turn) == 4
    second = turn.artifacts[0].parts[1]
    cached = workspace.joinpath(*CACHE, "parts", second.sha256)
    cached.write_bytes(b"damaged" + cached.read_bytes()[7:])
    (workspace / TRANSCRIPT).unlink()

    assert _materialize(client, workspace, turn) == 1
    assert [path for _, path, _, _ in backend.seen[4:]] == [second.download_url]
    assert (workspace / TRANSCRIPT).read_bytes() == b"".join(PART_TEXTS[:3])
    assert (workspace / INDEX).read_bytes() == PART_TEXTS[3] + PART_TEXTS[1]
    assert cached.read_bytes() == PART_TEXTS[1]


def test_a_part_that_does_not_match_its_sha256_writes_nothing_at_the_path(backend, tmp_path):
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=3)
    turn = _history_turn(backend)
    backend.files[turn.artifacts[0].parts[2].download_url] = b"tampered" + PART_TEXTS[2]

    with pytest.raises(BackendError, match="checksum mismatch"):
        _materialize(client, workspace, turn)
    assert _workspace_files(workspace) == []  # no partial file left either
    assert list(workspace.rglob("*.partial")) == []


def test_a_composite_whose_parts_do_not_add_up_is_refused(backend, tmp_path):
    workspace = task_workspace(root=tmp_path, task_id=3)
    entry = _composite(TRANSCRIPT, [_served(backend, "p1", PART_TEXTS[0])])
    turn = _turn(backend, artifacts=[{**entry, "size_bytes": entry["size_bytes"] + 1}])
    with pytest.raises(ArtifactRefused, match="parts add up to"):
        _materialize(_client(backend), workspace, turn)
    assert backend.seen == []


def test_artifact_lists_expand_into_files_at_their_paths(backend, tmp_path):
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=3)
    texts = {n: f"Turn {n}: ✓\n".encode() * n for n in range(1, 5)}
    texts[4] = texts[2]  # equal turns share one artifact
    files = [
        _listed(backend, f"t{n}" if n != 4 else "t2", text, f".baton/history/turns/{n}.md")
        for n, text in texts.items()
    ]
    lists = [
        _served(backend, "list-a", json.dumps({"files": files[:2]}).encode()),
        _served(backend, "list-b", json.dumps({"files": files[2:]}).encode()),
    ]
    tail = _entry(b"Turn 5\n", ".baton/history/turns/5.md", url="/api/artifacts/t5/content/")
    backend.files[tail.download_url] = b"Turn 5\n"
    turn = _turn(backend, artifacts=[tail.model_dump()], artifact_lists=lists)

    assert _materialize(client, workspace, turn) == 2 + 4  # two lists, four distinct turns
    assert _workspace_files(workspace) == [f".baton/history/turns/{n}.md" for n in range(1, 6)]
    for n, text in texts.items():
        assert (workspace / f".baton/history/turns/{n}.md").read_bytes() == text
    assert workspace.joinpath(*CACHE, "lists", f"{lists[0]['sha256']}.json").is_file()
    # The next turn names the same lists: the cached ones are read, nothing is fetched.
    seen = len(backend.seen)
    assert _materialize(client, workspace, turn) == 0
    assert len(backend.seen) == seen


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"files": [{"path": ".baton/history/turns/1.md"}, {"path": "../escape.md"}]},
            "not a path inside the workspace",
        ),
        ({"files": [{"path": ".baton/history/turns/2.md", "drop": "sha256"}]}, "files.0.sha256"),
        ({"entries": []}, "files: Field required"),
        (b'{"files": [', "not a list of files"),
        (b'{"files": [], "note": "\xff"}', "not a list of files"),
    ],
    ids=["path outside", "missing field", "no files", "not JSON", "not UTF-8"],
)
def test_a_bad_artifact_list_refuses_the_whole_manifest(backend, tmp_path, document, message):
    client = _client(backend)
    workspace = task_workspace(root=tmp_path, task_id=3)
    if isinstance(document, dict) and "files" in document:
        files = []
        for number, file in enumerate(document["files"]):
            listed = _listed(backend, f"t{number}", b"text\n", file["path"])
            files.append({key: value for key, value in listed.items() if key != file.get("drop")})
        document = {"files": files}
    content = document if isinstance(document, bytes) else json.dumps(document).encode()
    plain = _entry(b"good", ".baton/artifacts/good.txt", url="/api/artifacts/good/content/")
    backend.files[plain.download_url] = b"good"
    turn = _turn(
        backend,
        artifacts=[plain.model_dump(), _composite(TRANSCRIPT, [_served(backend, "p1", b"x")])],
        artifact_lists=[_served(backend, "list", content)],
    )

    with pytest.raises(ArtifactRefused, match=message):
        _materialize(client, workspace, turn)
    assert _workspace_files(workspace) == []
    assert [path for _, path, _, _ in backend.seen] == ["/api/artifacts/list/content/"]


def test_artifact_lists_without_a_url_template_are_refused(backend, tmp_path):
    listed = _served(backend, "list", b'{"files": []}')
    turn = _turn(backend, artifact_lists=[listed], artifact_url_template="")
    with pytest.raises(ArtifactRefused, match="no artifact URL template"):
        _materialize(_client(backend), task_workspace(root=tmp_path, task_id=3), turn)
    assert backend.seen == []


def test_a_manifest_newer_than_the_worker_fails_the_turn_with_a_clear_message(backend, tmp_path):
    backend.script = [(200, {})]
    turn = _turn(backend, manifest_version=3, artifact_lists=[_served(backend, "l", b"{}")])
    run = agno_turn_run(turn=turn, client=_client(backend), root=tmp_path)
    run.run()
    assert run.reported == "FAILED"
    [(method, path, _, body)] = backend.seen  # nothing fetched, the executor never started
    assert (method, path) == ("POST", "/api/executor/subtasks/7/result/")
    report = json.loads(body)
    assert (report["status"], report["error_code"]) == ("FAILED", "artifact_error")
    assert report["error"] == (
        "Baton could not put the turn's artifacts in the workspace: this worker lays out "
        "manifest version 2 at most; the backend sent 3: upgrade the worker"
    )


# --- long polling ----------------------------------------------------------------------------

NOTHING = {"turns": [], "next_ready_in_seconds": None}


def _idle_worker(backend: ThreadingHTTPServer, tmp_path: Path, **env: str) -> Worker:
    host, port = backend.server_address
    settings = load_settings(
        ["--kinds", "codex", "--workspace-root", str(tmp_path)],
        {**BASE_ENV, "BATON_URL": f"http://{host}:{port}", **env},
    )
    client = BackendClient(base_url=settings.backend_url, token="t0k", worker_id="w")
    return Worker(settings=settings, client=client, adapters={}, endpoints={})


def _dispatches_until(backend: ThreadingHTTPServer, worker: Worker, count: int) -> list[dict]:
    """Run the worker until it has sent `count` requests; their bodies."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(backend.seen) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    thread.join(timeout=30)
    return [json.loads(body) for _, _, _, body in backend.seen[:count]]


def test_an_idle_worker_waits_at_the_backend_instead_of_polling(backend, tmp_path):
    backend.script = [(200, NOTHING)] * 1000  # the worker goes on until it sees the stop
    worker = _idle_worker(backend, tmp_path, BATON_WORKER_WAIT_SECONDS="7")
    bodies = _dispatches_until(backend, worker, 3)
    # The first asks at once; once it found nothing, each dispatch waits at the backend.
    assert [body.get("wait_seconds") for body in bodies] == [None, 7.0, 7.0]


def test_a_worker_polls_when_the_backend_refuses_its_wait(backend, tmp_path):
    refused = (400, {"code": "invalid", "detail": "wait_seconds: at most 5 seconds"})
    backend.script = [(200, NOTHING), refused, *[(200, NOTHING)] * 1000]
    worker = _idle_worker(backend, tmp_path, BATON_WORKER_POLL_SECONDS="0.01")
    bodies = _dispatches_until(backend, worker, 4)
    # 20 s, the default wait; refused, the worker polls.
    assert [body.get("wait_seconds") for body in bodies] == [None, 20.0, None, None]


def test_a_waiting_worker_stops_at_once(backend, tmp_path):
    """A stop hangs up on the dispatch that waits at the backend (for 30 s here): the worker
    neither waits for its answer nor asks again."""
    backend.script = [(200, NOTHING), HOLD]
    worker = _idle_worker(backend, tmp_path, BATON_WORKER_WAIT_SECONDS="30")
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    _wait_until(lambda: len(backend.seen) == 2)
    time.sleep(0.2)  # the waiting dispatch is sent and waits for its answer
    stopping = time.monotonic()
    worker.stop()
    thread.join(timeout=30)
    assert time.monotonic() - stopping < 2
    _wait_until(lambda: backend.hung_up)
    assert backend.hung_up == [True]
    assert [json.loads(body).get("wait_seconds") for _, _, _, body in backend.seen] == [None, 30]


def test_a_worker_that_must_end_when_idle_never_waits(backend, tmp_path):
    backend.script = [(200, NOTHING)]
    host, port = backend.server_address
    settings = load_settings(
        ["--kinds", "codex", "--workspace-root", str(tmp_path), "--once"],
        {**BASE_ENV, "BATON_URL": f"http://{host}:{port}"},
    )
    client = BackendClient(base_url=settings.backend_url, token="t0k", worker_id="w")
    assert Worker(settings=settings, client=client, adapters={}, endpoints={}).run() == 0
    assert [json.loads(body) for _, _, _, body in backend.seen] == [
        {"kinds": ["codex"], "limit": 2, "worker_id": "w"}
    ]


def test_a_steer_is_handed_over_once_and_its_result_rides_heartbeats_and_the_report(
    backend, tmp_path
):
    # Agno takes no input while it runs: each steer is refused at once, as `not_steerable`.
    run = agno_turn_run(turn=_turn(backend), client=_client(backend), root=tmp_path)
    claim = {"subtask_id": 7, "attempt": 1, "state": "running", "lease_expires_at": None}
    offers = [{"steer_id": 4, "message": "also Windows"}, {"steer_id": 5, "message": "and docs"}]
    backend.script = [(200, {"turns": [{**claim, "steers": offers}]})]
    [state] = run.client.heartbeat([run.claim])
    assert state.steers == ((4, "also Windows"), (5, "and docs"))
    run.take_steers(state.steers)
    run.take_steers(state.steers)  # offered again before Baton heard: handed over once
    refused = [
        {"steer_id": 4, "delivered": False, "refusal": "not_steerable"},
        {"steer_id": 5, "delivered": False, "refusal": "not_steerable"},
    ]
    assert run.steer_results(unsent_only=True) == refused
    # Sent with the next heartbeat; once one is answered, no more.
    backend.script = [(200, {"turns": [claim]})]
    run.client.heartbeat([run.claim], steers={run.claim: refused})
    sent = json.loads(backend.seen[-1][3])
    assert sent["turns"] == [{"subtask_id": 7, "attempt": 1, "steers": refused}]
    run.steer_results_sent(refused)
    assert run.steer_results(unsent_only=True) == []
    # The report names them all again: it settles whatever a lost heartbeat did not.
    backend.script = [(200, {})]
    run._report(status="COMPLETED", result={"value": "done"})
    assert json.loads(backend.seen[-1][3])["steers"] == refused
