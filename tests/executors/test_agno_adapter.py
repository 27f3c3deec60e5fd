"""The Agno adapter: its parser on recorded runner output, and real runs of the runner child.

No database. The parser tests read `recordings/agno/<case>.jsonl`, the stdout of real runner runs
against the stand-in model server; the ids and texts in their tables are the recorded ones. To
re-record (after an Agno upgrade, say), run this module as a script
(``.venv/bin/python -m tests.executors.test_agno_adapter``) and update the tables.

The real-run tests start ``python -P -m executors.agno_runner`` through `ExecutorProcess` against
the `model_server` fixture, each in fresh directories. Each run costs about 1.5 s, about 1 s of it
importing Agno and openai in the child.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from executors import agno_protocol
from executors.adapters.agno import AgnoAdapter, AgnoStreamParser, classify_failure
from executors.adapters.base import (
    BotConfig,
    ExecutorUnavailable,
    Launch,
    ModelEndpoint,
    RunRequest,
)
from executors.events import (
    ErrorCode,
    Event,
    FileChanged,
    MessageCompleted,
    MessageDelta,
    Outcome,
    OutcomeStatus,
    SessionStarted,
    ToolFinished,
    ToolStarted,
    Usage,
    UsageReported,
)
from executors.standin import ModelServer, RecordedRequest
from executors.standin.errors import ANTHROPIC_CONTEXT_MESSAGE, CHAT_CONTEXT_MESSAGE
from tests.executors.runs import FinishedRun, run_as_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = Path(__file__).resolve().parent / "recordings" / "agno"
# Amazon Bedrock's words for a prompt over the model's window, as its gateways pass them on.
BEDROCK_MESSAGE = "Input is too long for requested model."
WATCHDOG_SECONDS = 30.0
API_KEY = "sk-baton-agno-test-key"
PROTOCOL_TYPES = {
    agno_protocol.RUN_STARTED,
    agno_protocol.CONTENT_DELTA,
    agno_protocol.TOOL_STARTED,
    agno_protocol.TOOL_COMPLETED,
    agno_protocol.RUN_COMPLETED,
    agno_protocol.RUN_ERROR,
}
ARTIFACT = ".baton/artifacts/x.txt"


# -- running the runner ---------------------------------------------------------------------


def _request(
    root: Path,
    base_url: str | None,
    *,
    prompt: str = "Say hello.",
    bot: BotConfig | None = None,
    resume_session_id: str | None = None,
    max_retries: int = 0,
) -> RunRequest:
    """A run in `root`'s own workspace/state/tmp directories (state is shared by resumes)."""
    workspace = root / "workspace"
    tmp_dir = root / f"tmp-{uuid.uuid4().hex[:8]}"
    for directory in (workspace, root / "state", tmp_dir):
        directory.mkdir(parents=True, exist_ok=True)
    return RunRequest(
        prompt=prompt,
        bot=bot or BotConfig(name="agno-test"),
        workspace=workspace,
        state_dir=root / "state",
        tmp_dir=tmp_dir,
        endpoint=ModelEndpoint(base_url=base_url, api_key=API_KEY, max_retries=max_retries),
        resume_session_id=resume_session_id,
        passthrough_env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"},
    )


def _run(request: RunRequest, launch: Launch | None = None) -> FinishedRun:
    """Start the runner as the worker does, read it to the end, parse what it printed."""
    finished = run_as_worker(AgnoAdapter(), request, launch=launch, timeout=WATCHDOG_SECONDS)
    # Nothing but protocol lines on stdout, whatever Agno logged or tools printed.
    for line in finished.lines:
        assert json.loads(line)["type"] in PROTOCOL_TYPES, line[:200]
    return finished


def _dead_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _messages(request: RecordedRequest) -> list[dict[str, Any]]:
    return request.body["messages"]


def _last_user_text(request: RecordedRequest) -> str:
    return [m for m in _messages(request) if m["role"] == "user"][-1]["content"]


def _tool_names(request: RecordedRequest) -> set[str]:
    return {tool["function"]["name"] for tool in request.body.get("tools", [])}


# -- recordings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedCase:
    """A scripted run whose runner stdout is kept under recordings/agno/<name>.jsonl."""

    turns: Sequence[Mapping[str, Any]]
    prompt: str = "Do the thing."
    permission_mode: str = "full_access"
    max_turns: int | None = None
    files: Mapping[str, str] | None = None  # workspace files to create first
    unreachable: bool = False  # point the runner at a dead port instead of the server


RECORDED_CASES = {
    "text": RecordedCase(
        [
            {
                "text": "Hello from Agno — ünïcödé ✓",
                "usage": {"input_tokens": 120, "output_tokens": 30, "cached_input_tokens": 100},
            }
        ]
    ),
    "read_file": RecordedCase(
        [
            {"tool": {"name": "read_file", "arguments": {"file_name": ARTIFACT}}},
            {"text": "The artifact says hello."},
        ],
        files={ARTIFACT: "artifact line 1\nartifact line 2\n"},
    ),
    "shell": RecordedCase(
        [
            {
                "tool": {
                    "name": "run_shell_command",
                    "arguments": {"args": ["sh", "-c", "echo made > made.txt && echo ran"]},
                }
            },
            {"tool": {"name": "run_shell_command", "arguments": {"args": ["false"]}}},
            {"text": "Ran it."},
        ]
    ),
    "save_file": RecordedCase(
        [
            {
                "tool": {
                    "name": "save_file",
                    "arguments": {"file_name": "notes/new.txt", "contents": "a"},
                }
            },
            {"tool": {"name": "save_file", "arguments": {"file_name": "old.txt", "contents": "b"}}},
            {"text": "Saved."},
        ],
        files={"old.txt": "before"},
    ),
    "upstream_500": RecordedCase([{"http_status": 500}]),
    "rate_limited_429": RecordedCase([{"http_status": 429}]),
    "context_overflow": RecordedCase([{"context_overflow": True}]),
    # Context errors with no code for Agno to type (a proxy in front of Anthropic, a Bedrock
    # gateway): a plain 400 whose words say what it is.
    "prompt_too_long_untyped": RecordedCase(
        [{"http_status": 400, "message": ANTHROPIC_CONTEXT_MESSAGE}]
    ),
    "input_too_long_untyped": RecordedCase([{"http_status": 400, "message": BEDROCK_MESSAGE}]),
    "auth_401": RecordedCase([{"http_status": 401}]),
    "unreachable": RecordedCase([{"text": "never sent"}], unreachable=True),
    "max_turns": RecordedCase([{"tool": {"name": "list_files", "arguments": {}}}], max_turns=1),
}


def _record(name: str, case: RecordedCase, server: ModelServer, root: Path) -> FinishedRun:
    server.set_turns(case.turns)
    server.clear()
    request = _request(
        root,
        _dead_url() if case.unreachable else f"{server.url}/v1",
        prompt=case.prompt,
        bot=BotConfig(
            name="agno-test", permission_mode=case.permission_mode, max_turns=case.max_turns
        ),
    )
    for relative, text in (case.files or {}).items():
        path = request.workspace / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    finished = _run(request)
    RECORDINGS.mkdir(parents=True, exist_ok=True)
    (RECORDINGS / f"{name}.jsonl").write_text(
        "".join(f"{line}\n" for line in finished.lines), encoding="utf-8"
    )
    return finished


def record_all(names: Sequence[str] = ()) -> None:
    """Re-record every case in RECORDED_CASES (or only those `names`) from real runner runs."""
    with ModelServer() as server, tempfile.TemporaryDirectory() as scratch:
        for name, case in RECORDED_CASES.items():
            if names and name not in names:
                continue
            finished = _record(name, case, server, Path(scratch) / name)
            print(f"{name}: exit {finished.exit_code}, {finished.seconds:.2f} s")


def _recorded(name: str) -> list[str]:
    return (RECORDINGS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()


def _parse(lines: Sequence[str], exit_code: int, stderr: str = "") -> tuple[list[Event], Outcome]:
    parser = AgnoStreamParser()
    events = [event for line in lines for event in parser.feed(line)]
    return events, parser.finish(exit_code=exit_code, stderr_tail=stderr)


# -- the parser on recorded runner output (no subprocess) -----------------------------------

# The ids each recording holds (its session, and the stand-in's call ids).
TEXT_SESSION = "a2fd79d9-14b4-4ccf-b635-aaf2de454dee"
READ_SESSION = "66c439b5-eaaa-415f-9d20-18dae523a790"
SHELL_SESSION = "2d90d923-7275-4ea2-91eb-9d10b3f73ee0"
SAVE_SESSION = "25c6fc5c-4353-4cca-b860-b4294cb5b68e"
MAX_TURNS_SESSION = "2c1e9260-281a-4d8f-bc8c-813a0acace48"
NO_USAGE = None
ZERO_TOKENS_CALL = Usage(input_tokens=11, output_tokens=7)  # the stand-in's default per call


def test_parser_text_run() -> None:
    events, outcome = _parse(_recorded("text"), exit_code=0)
    usage = Usage(input_tokens=120, cached_input_tokens=100, output_tokens=30)
    answer = "Hello from Agno — ünïcödé ✓"
    assert events == [
        SessionStarted(TEXT_SESSION),
        MessageDelta("Hello"),
        MessageDelta(" from"),
        MessageDelta(" Agno"),
        MessageDelta(" —"),
        MessageDelta(" ünïcödé"),
        MessageDelta(" ✓"),
        MessageCompleted(answer),
        UsageReported(usage),
    ]
    assert outcome == Outcome(
        status=OutcomeStatus.COMPLETED, final_text=answer, usage=usage, session_id=TEXT_SESSION
    )


def test_parser_file_read_tool() -> None:
    events, outcome = _parse(_recorded("read_file"), exit_code=0)
    usage = Usage(input_tokens=22, output_tokens=14)
    call = "call_standin_3fd26951_0005"
    assert events == [
        SessionStarted(READ_SESSION),
        ToolStarted(call, "read_file"),
        ToolFinished(call, "read_file"),
        MessageDelta("The"),
        MessageDelta(" artifact"),
        MessageDelta(" says"),
        MessageDelta(" hello."),
        MessageCompleted("The artifact says hello."),
        UsageReported(usage),
    ]
    assert outcome == Outcome(
        status=OutcomeStatus.COMPLETED,
        final_text="The artifact says hello.",
        usage=usage,
        session_id=READ_SESSION,
    )


def test_parser_shell_tool() -> None:
    events, outcome = _parse(_recorded("shell"), exit_code=0)
    usage = Usage(input_tokens=33, output_tokens=21)
    first, second = "call_standin_3fd26951_0011", "call_standin_3fd26951_0014"
    command = "sh -c 'echo made > made.txt && echo ran'"
    tool = "run_shell_command"
    assert events == [
        SessionStarted(SHELL_SESSION),
        ToolStarted(first, tool, command),
        ToolFinished(first, tool, command, exit_code=0),
        ToolStarted(second, tool, "false"),
        ToolFinished(second, tool, "false", exit_code=None, is_error=True),
        MessageDelta("Ran"),
        MessageDelta(" it."),
        MessageCompleted("Ran it."),
        UsageReported(usage),
    ]
    assert outcome == Outcome(
        status=OutcomeStatus.COMPLETED,
        final_text="Ran it.",
        usage=usage,
        session_id=SHELL_SESSION,
        commands=({"command": command, "exit_code": 0}, {"command": "false", "exit_code": None}),
    )


def test_parser_file_writes() -> None:
    events, outcome = _parse(_recorded("save_file"), exit_code=0)
    usage = Usage(input_tokens=33, output_tokens=21)
    first, second = "call_standin_3fd26951_0020", "call_standin_3fd26951_0023"
    assert events == [
        SessionStarted(SAVE_SESSION),
        ToolStarted(first, "save_file"),
        ToolFinished(first, "save_file"),
        FileChanged("notes/new.txt", "add"),
        ToolStarted(second, "save_file"),
        ToolFinished(second, "save_file"),
        FileChanged("old.txt", "update"),
        MessageDelta("Saved."),
        MessageCompleted("Saved."),
        UsageReported(usage),
    ]
    assert outcome == Outcome(
        status=OutcomeStatus.COMPLETED,
        final_text="Saved.",
        usage=usage,
        session_id=SAVE_SESSION,
        files_changed=("notes/new.txt", "old.txt"),
    )


@pytest.mark.parametrize(
    ("case", "session_id", "status", "code", "error"),
    [
        (
            "upstream_500",
            "0c681f1a-8a05-4fa7-a7e7-7aacc50c6f0d",
            OutcomeStatus.RETRYABLE,
            ErrorCode.UPSTREAM_ERROR,
            "The server had an error while processing your request.",
        ),
        (
            "rate_limited_429",
            "89f01101-5339-4254-8673-6717f9a7100c",
            OutcomeStatus.RETRYABLE,
            ErrorCode.RATE_LIMITED,
            "Rate limit reached. Please try again in 1s.",
        ),
        (
            "context_overflow",
            "e310a3fd-b2ed-42ad-8a52-d0dcd2687972",
            OutcomeStatus.FAILED,
            ErrorCode.CONTEXT_OVERFLOW,
            CHAT_CONTEXT_MESSAGE,
        ),
        (
            "prompt_too_long_untyped",
            "c59683fe-bc6c-4003-8ced-a026ce9146ef",
            OutcomeStatus.FAILED,
            ErrorCode.CONTEXT_OVERFLOW,
            ANTHROPIC_CONTEXT_MESSAGE,
        ),
        (
            "input_too_long_untyped",
            "9219eb4f-d744-4e77-897c-34463d406339",
            OutcomeStatus.FAILED,
            ErrorCode.CONTEXT_OVERFLOW,
            BEDROCK_MESSAGE,
        ),
        (
            "auth_401",
            "2ea5df48-8b2a-402c-a8da-1b4c583e74fc",
            OutcomeStatus.FAILED,
            ErrorCode.AUTH_ERROR,
            "Incorrect API key provided.",
        ),
        (
            "unreachable",
            "49da366c-8baf-4e64-9b21-f47dfdf0bdd9",
            OutcomeStatus.RETRYABLE,
            ErrorCode.NETWORK_ERROR,
            "Connection error.",
        ),
    ],
)
def test_parser_provider_failures(
    case: str, session_id: str, status: OutcomeStatus, code: ErrorCode, error: str
) -> None:
    events, outcome = _parse(_recorded(case), exit_code=1)
    assert events == [SessionStarted(session_id)]  # no tokens spent: no usage event
    assert outcome == Outcome(status=status, error=error, error_code=code, session_id=session_id)


def test_parser_max_turns() -> None:
    events, outcome = _parse(_recorded("max_turns"), exit_code=1)
    call = "call_standin_3fd26951_0033"
    usage = Usage(input_tokens=22, output_tokens=14)  # the two model requests that were answered
    assert events == [
        SessionStarted(MAX_TURNS_SESSION),
        ToolStarted(call, "list_files"),
        ToolFinished(call, "list_files"),
        UsageReported(usage),
    ]
    assert outcome == Outcome(
        status=OutcomeStatus.FAILED,
        error="max_turns (1) ran out: the model kept calling tools after 2 model requests",
        error_code=ErrorCode.MAX_TURNS,
        usage=usage,
        session_id=MAX_TURNS_SESSION,
    )


def test_parser_provider_failure_without_the_status_uses_the_wording() -> None:
    # The same failures with only Agno's text, as a runner that cannot see the exception prints.
    texts = {
        "The server had an error while processing your request.": ErrorCode.UPSTREAM_ERROR,
        "Rate limit reached. Please try again in 1s.": ErrorCode.RATE_LIMITED,
        CHAT_CONTEXT_MESSAGE: ErrorCode.CONTEXT_OVERFLOW,
        "Incorrect API key provided.": ErrorCode.AUTH_ERROR,
        "Connection error.": ErrorCode.NETWORK_ERROR,
        "Request timed out.": ErrorCode.NETWORK_ERROR,
        "OPENAI_API_KEY not set. Please set the OPENAI_API_KEY environment variable.": (
            ErrorCode.AUTH_ERROR
        ),
        "Something unexpected.": ErrorCode.EXECUTOR_ERROR,
    }
    for text, code in texts.items():
        assert classify_failure({"error": text, "http_status": None}) == code, text


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ({"http_status": 503, "error": "Service Unavailable"}, ErrorCode.UPSTREAM_ERROR),
        ({"http_status": 429, "error": "Slow down"}, ErrorCode.RATE_LIMITED),
        ({"http_status": 403, "error": "You are not allowed."}, ErrorCode.AUTH_ERROR),
        ({"http_status": 404, "error": "The model does not exist."}, ErrorCode.EXECUTOR_ERROR),
        ({"http_status": 400, "error": "Bad request."}, ErrorCode.EXECUTOR_ERROR),
        # A provider whose 400 for a long prompt is worded in its own way: Agno's class says it.
        (
            {"http_status": 400, "error": "Too long.", "exception": "ContextWindowExceededError"},
            ErrorCode.CONTEXT_OVERFLOW,
        ),
        # The status beats the wording: a 500 whose message mentions a rate limit is a 500.
        ({"http_status": 500, "error": "rate limit backend down"}, ErrorCode.UPSTREAM_ERROR),
        ({"network_error": True, "error": "Something broke."}, ErrorCode.NETWORK_ERROR),
        ({"error_type": "session_not_found", "error": "no session"}, ErrorCode.EXECUTOR_ERROR),
        ({"error_type": "max_turns", "error": "ran out"}, ErrorCode.MAX_TURNS),
    ],
)
def test_classify_failure_status_first(line: dict[str, Any], code: ErrorCode) -> None:
    assert classify_failure(line) == code


def test_parser_runner_crash_reports_the_stderr_tail() -> None:
    traceback_text = "Traceback (most recent call last):\n  ...\nMemoryError\n"
    lines = _recorded("text")[:3]  # it died while streaming the answer
    events, outcome = _parse(lines, exit_code=1, stderr="x" * 5000 + traceback_text)
    assert events[0] == SessionStarted(TEXT_SESSION)
    assert outcome.status == OutcomeStatus.FAILED
    assert outcome.error_code == ErrorCode.EXECUTOR_ERROR
    assert outcome.error.startswith(
        "the Agno runner exited with code 1 without reporting a result: "
    )
    assert outcome.error.endswith("MemoryError")
    assert len(outcome.error) < 2100  # the tail is bounded
    assert outcome.final_text is None
    assert outcome.session_id == TEXT_SESSION


def test_parser_completion_then_bad_exit_is_not_a_completion() -> None:
    _, outcome = _parse(_recorded("text"), exit_code=-9)
    assert outcome.status == OutcomeStatus.FAILED
    assert outcome.error_code == ErrorCode.EXECUTOR_ERROR
    assert outcome.error == "the Agno runner exited with code -9 after reporting completion"


def test_parser_empty_completed_content_is_an_empty_answer() -> None:
    line = json.dumps({"type": "run_completed", "content": "", "metrics": {}})
    events, outcome = _parse([line], exit_code=0)
    assert events == [MessageCompleted(""), UsageReported(Usage())]
    assert outcome.status == OutcomeStatus.COMPLETED
    assert outcome.final_text == ""


def test_parser_ignores_lines_it_does_not_know() -> None:
    lines = ["", "not json", "[1, 2]", json.dumps({"type": "something_new", "x": 1})]
    events, outcome = _parse([*lines, *_recorded("text")], exit_code=0)
    assert events[0] == SessionStarted(TEXT_SESSION)
    assert outcome.final_text == "Hello from Agno — ünïcödé ✓"


# -- the adapter without a run --------------------------------------------------------------


def test_launch_keeps_prompt_and_key_out_of_argv(tmp_path: Path) -> None:
    bot = BotConfig(name="b", model="gpt-5.5-mini", instructions="Be terse.", max_turns=7)
    request = _request(tmp_path, "http://127.0.0.1:9/v1", prompt="Secret prompt ✓", bot=bot)
    launch = AgnoAdapter().launch(request)

    assert launch.argv == [sys.executable, "-P", "-m", "executors.agno_runner"]
    assert launch.cwd == request.workspace
    assert json.loads(launch.stdin.decode("utf-8")) == {
        "prompt": "Secret prompt ✓",
        "model": "gpt-5.5-mini",
        "instructions": "Be terse.",
        "permission_mode": "full_access",
        "max_turns": 7,
        "workspace": str(request.workspace),
        "state_dir": str(request.state_dir),
        "resume_session_id": None,
        "base_url": "http://127.0.0.1:9/v1",
        "max_retries": 0,
    }
    assert API_KEY.encode() not in launch.stdin
    assert launch.env == {
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",
        "HOME": str(request.state_dir / "home"),
        "TMPDIR": str(request.tmp_dir),
        "AGNO_TELEMETRY": "false",
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        "OPENAI_API_KEY": API_KEY,
    }


def test_launch_defaults_the_model_and_keeps_a_passthrough_pythonpath(tmp_path: Path) -> None:
    request = replace(
        _request(tmp_path, None), passthrough_env={"PATH": "/bin", "PYTHONPATH": "/opt/extra"}
    )
    launch = AgnoAdapter().launch(request)
    assert json.loads(launch.stdin)["model"] == "gpt-5.5"
    assert json.loads(launch.stdin)["base_url"] is None
    assert launch.env["PYTHONPATH"] == f"{REPO_ROOT}:/opt/extra"


def test_locate_does_not_import_agno() -> None:
    check = (
        "import sys\n"
        "from executors.adapters.agno import AgnoAdapter\n"
        "assert AgnoAdapter().locate() == sys.executable\n"
        "assert 'agno' not in sys.modules and 'openai' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", check], cwd=REPO_ROOT, check=True, timeout=30)


def test_locate_without_agno_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "agno" else real_find_spec(name, *args),
    )
    with pytest.raises(ExecutorUnavailable, match=r"pip install 'baton\[executors\]'"):
        AgnoAdapter().locate()


@pytest.mark.parametrize(
    "change",
    [
        {"permission_mode": "sudo"},
        {"model": ""},
        {"max_turns": -1},
        {"max_retries": True},
        {"prompt": None},
        {"resume_session_id": "../elsewhere"},
        {"workspace": "/nonexistent/workspace"},
        {"unexpected": 1},
    ],
)
def test_job_decode_rejects_bad_jobs(tmp_path: Path, change: dict[str, Any]) -> None:
    job = json.loads(AgnoAdapter().launch(_request(tmp_path, None)).stdin)
    with pytest.raises(agno_protocol.BadJob):
        agno_protocol.Job.decode(json.dumps({**job, **change}).encode())


# -- real runs of the runner child ----------------------------------------------------------


def test_text_run_end_to_end(model_server: ModelServer, tmp_path: Path) -> None:
    answer = "Hello — ünïcödé ✓\n\n  indented\ttab  "
    model_server.set_turns(
        [
            {
                "text": answer,
                "usage": {
                    "input_tokens": 120,
                    "output_tokens": 30,
                    "cached_input_tokens": 100,
                    "reasoning_tokens": 12,
                },
            }
        ]
    )
    instructions = "You are Baton's test bot.\nAnswer briefly."
    bot = BotConfig(name="b", model="gpt-5.5-baton-test", instructions=instructions)
    prompt = "What is in the box? «quoted» 🎁"
    request = _request(tmp_path, f"{model_server.url}/v1", prompt=prompt, bot=bot)
    # The workspace is the runner's cwd: its files must not shadow what the runner imports.
    for module in ("agno.py", "openai.py", "executors.py"):
        (request.workspace / module).write_text("raise SystemExit('shadowed by the workspace')")
    finished = _run(request)

    usage = Usage(input_tokens=120, cached_input_tokens=100, output_tokens=30, reasoning_tokens=12)
    assert finished.exit_code == 0
    assert finished.outcome.status == OutcomeStatus.COMPLETED
    assert finished.outcome.final_text == answer  # byte for byte
    assert finished.outcome.usage == usage
    session = finished.events[0]
    assert isinstance(session, SessionStarted)
    assert uuid.UUID(session.session_id)
    assert finished.outcome.session_id == session.session_id
    deltas = [event.text for event in finished.events if isinstance(event, MessageDelta)]
    assert "".join(deltas) == answer
    assert finished.events[-2:] == [MessageCompleted(answer), UsageReported(usage)]

    # Only model calls reached the server: no telemetry, no model listing, nothing else.
    assert [(r.method, r.path) for r in model_server.requests] == [("POST", "/v1/chat/completions")]
    (request,) = model_server.model_requests()
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.body["model"] == "gpt-5.5-baton-test"
    assert request.body["stream"] is True
    assert _messages(request) == [
        {"role": "developer", "content": instructions},
        {"role": "user", "content": prompt},
    ]
    # Logs carry no prompt, answer or key.
    for secret in (prompt, answer.strip(), API_KEY):
        assert secret not in finished.stderr


def test_prompt_over_200_kib_reaches_the_model_intact(
    model_server: ModelServer, tmp_path: Path
) -> None:
    prompt = "".join(chr(0x4E00 + (index * 7) % 20000) for index in range(70_000))
    assert len(prompt.encode("utf-8")) > 200 * 1024
    model_server.set_turns([{"text": "Long prompt received."}])
    finished = _run(_request(tmp_path, f"{model_server.url}/v1", prompt=prompt))
    assert finished.outcome.final_text == "Long prompt received."
    assert _last_user_text(model_server.model_requests()[0]) == prompt


def test_reads_a_2_mb_artifact_with_a_real_tool_call(
    model_server: ModelServer, tmp_path: Path
) -> None:
    request = _request(tmp_path, f"{model_server.url}/v1", prompt=f"See {ARTIFACT}.")
    artifact = request.workspace / ARTIFACT
    artifact.parent.mkdir(parents=True)
    content = "".join(f"line {index:06d} {'x' * 88}\n" for index in range(21_000))
    assert len(content) > 2_000_000
    artifact.write_text(content, encoding="utf-8")
    model_server.set_turns(
        [
            {"tool": {"name": "read_file", "arguments": {"file_name": ARTIFACT}}},
            {"text": "It is a list of lines."},
        ]
    )
    finished = _run(request)

    assert finished.outcome.status == OutcomeStatus.COMPLETED
    assert finished.outcome.final_text == "It is a list of lines."
    tool_events = [e for e in finished.events if isinstance(e, ToolStarted | ToolFinished)]
    assert [(type(e), e.tool) for e in tool_events] == [
        (ToolStarted, "read_file"),
        (ToolFinished, "read_file"),
    ]
    assert not tool_events[1].is_error
    first, second = model_server.model_requests()
    assert "read_file" in _tool_names(first)
    tool_message = _messages(second)[-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"].startswith(content[:1000])
    assert tool_message["content"] == content


SHELL_SCRIPT = 'pwd > where.txt && echo "key: ${OPENAI_API_KEY:-none}" && echo ran'


def test_shell_command_runs_in_the_workspace(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns(
        [
            {
                "tool": {
                    "name": "run_shell_command",
                    "arguments": {"args": ["sh", "-c", SHELL_SCRIPT]},
                }
            },
            {"text": "Done."},
        ]
    )
    request = _request(tmp_path, f"{model_server.url}/v1")
    finished = _run(request)

    command = f"sh -c '{SHELL_SCRIPT}'"
    assert finished.outcome.status == OutcomeStatus.COMPLETED
    assert (request.workspace / "where.txt").read_text().strip() == str(request.workspace)
    tool_events = [e for e in finished.events if isinstance(e, ToolStarted | ToolFinished)]
    call_id = tool_events[0].call_id
    assert tool_events == [
        ToolStarted(call_id, "run_shell_command", command),
        ToolFinished(call_id, "run_shell_command", command, exit_code=0),
    ]
    assert finished.outcome.commands == ({"command": command, "exit_code": 0},)
    first, second = model_server.model_requests()
    assert {"run_shell_command", "save_file", "read_file"} <= _tool_names(first)
    # The API key stays with the model client: tool commands do not inherit it.
    output = "key: none\nran\n"
    assert _messages(second)[-1] == {"role": "tool", "content": output, "tool_call_id": call_id}
    assert command not in finished.stderr and "where.txt" not in finished.stderr


def test_read_only_offers_no_shell_and_no_writing(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns(
        [
            {"tool": {"name": "run_shell_command", "arguments": {"args": ["touch", "bad.txt"]}}},
            {"tool": {"name": "save_file", "arguments": {"file_name": "bad.txt", "contents": "x"}}},
            {"text": "Could not."},
        ]
    )
    bot = BotConfig(name="reader", permission_mode="read_only")
    request = _request(tmp_path, f"{model_server.url}/v1", bot=bot)
    finished = _run(request)

    assert finished.outcome.status == OutcomeStatus.COMPLETED
    assert not (request.workspace / "bad.txt").exists()
    requests = model_server.model_requests()
    assert _tool_names(requests[0]) == {
        "list_files",
        "read_file",
        "read_file_chunk",
        "search_content",
        "search_files",
    }
    # Agno answers a call to a tool it does not have without running anything.
    refusal = "Error: The requested tool does not exist or is not available."
    assert _messages(requests[1])[-1]["content"] == refusal
    assert _messages(requests[2])[-1]["content"] == refusal
    assert not [e for e in finished.events if isinstance(e, ToolStarted | FileChanged)]
    assert finished.outcome.commands == ()


@pytest.mark.parametrize(
    ("turn", "status", "code", "error", "http_status", "exception"),
    [
        (
            {"http_status": 500},
            OutcomeStatus.RETRYABLE,
            ErrorCode.UPSTREAM_ERROR,
            "The server had an error while processing your request.",
            500,
            "ModelProviderError",
        ),
        (
            {"http_status": 429},
            OutcomeStatus.RETRYABLE,
            ErrorCode.RATE_LIMITED,
            "Rate limit reached. Please try again in 1s.",
            429,
            "ModelProviderError",
        ),
        (
            {"context_overflow": True},
            OutcomeStatus.FAILED,
            ErrorCode.CONTEXT_OVERFLOW,
            CHAT_CONTEXT_MESSAGE,
            400,
            "ContextWindowExceededError",
        ),
        (
            {"http_status": 401},
            OutcomeStatus.FAILED,
            ErrorCode.AUTH_ERROR,
            "Incorrect API key provided.",
            401,
            "ModelProviderError",
        ),
    ],
    ids=["500", "429", "context_overflow", "401"],
)
def test_provider_errors(
    model_server: ModelServer,
    tmp_path: Path,
    turn: dict[str, Any],
    status: OutcomeStatus,
    code: ErrorCode,
    error: str,
    http_status: int,
    exception: str,
) -> None:
    model_server.set_turns([turn])
    finished = _run(_request(tmp_path, f"{model_server.url}/v1"))
    assert finished.exit_code == 1
    assert (finished.outcome.status, finished.outcome.error_code) == (status, code)
    assert finished.outcome.error == error
    assert finished.outcome.final_text is None
    assert len(model_server.model_requests()) == 1  # max_retries=0 reached the openai client
    # The runner saw the provider's status on the exception, which Agno's RunError lacks.
    error_line = json.loads(finished.lines[-1])
    assert (error_line["http_status"], error_line["exception"]) == (http_status, exception)
    # Agno logs to sys.stdout when it is not a terminal: the runner sends that to stderr.
    assert f"ERROR   Error in Agent run: {error}" in finished.stderr


def test_unreachable_provider_is_a_network_error(tmp_path: Path) -> None:
    finished = _run(_request(tmp_path, _dead_url()))
    assert finished.exit_code == 1
    assert finished.outcome.status == OutcomeStatus.RETRYABLE
    assert finished.outcome.error_code == ErrorCode.NETWORK_ERROR
    assert finished.outcome.error == "Connection error."
    assert json.loads(finished.lines[-1])["network_error"] is True


class _BrokenStreamServer:
    """Answers every request with the start of a chat stream, then hangs up mid-answer."""

    CHUNK = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":"Half"},"finish_reason":null}]}\n\n'
    )

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self._socket.accept()
                with connection:
                    self._answer(connection)

    def _answer(self, connection: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += connection.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += connection.recv(65536)
        connection.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(self.CHUNK)
            + self.CHUNK
            + b"\r\n"
        )

    def close(self) -> None:
        self._socket.close()


def test_a_stream_cut_mid_answer_is_a_network_error(tmp_path: Path) -> None:
    server = _BrokenStreamServer()
    try:
        finished = _run(_request(tmp_path, server.url))
    finally:
        server.close()
    assert MessageDelta("Half") in finished.events
    assert finished.outcome.status == OutcomeStatus.RETRYABLE
    assert finished.outcome.error_code == ErrorCode.NETWORK_ERROR
    assert finished.outcome.final_text is None


def test_max_retries_reaches_the_openai_client(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns([{"http_status": 500}, {"text": "Second try worked."}])
    finished = _run(_request(tmp_path, f"{model_server.url}/v1", max_retries=1))
    assert finished.outcome.final_text == "Second try worked."
    assert len(model_server.model_requests()) == 2


def test_resumed_session_sends_the_earlier_turn_again(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"text": "First answer."}])
    first = _run(_request(tmp_path, f"{model_server.url}/v1", prompt="First question?"))
    session_id = first.outcome.session_id
    assert first.outcome.final_text == "First answer."

    model_server.clear()
    model_server.set_turns([{"text": "Second answer."}])
    second = _run(
        _request(
            tmp_path,
            f"{model_server.url}/v1",
            prompt="Second question?",
            resume_session_id=session_id,
        )
    )
    assert second.outcome.final_text == "Second answer."
    assert second.events[0] == SessionStarted(session_id)
    assert second.outcome.session_id == session_id
    (request,) = model_server.model_requests()
    assert _messages(request) == [
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "Second question?"},
    ]


def test_resuming_an_unknown_session_fails_without_a_model_call(
    model_server: ModelServer, tmp_path: Path
) -> None:
    unknown = str(uuid.uuid4())
    finished = _run(_request(tmp_path, f"{model_server.url}/v1", resume_session_id=unknown))
    assert finished.outcome.status == OutcomeStatus.FAILED
    assert finished.outcome.error_code == ErrorCode.EXECUTOR_ERROR
    assert finished.outcome.error == f"no Agno session {unknown} in this worker's state directory"
    assert model_server.model_requests() == []
    assert not (tmp_path / "state" / "sessions" / unknown).exists()


def test_max_turns_stops_a_model_that_keeps_calling_tools(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"tool": {"name": "list_files", "arguments": {}}}])  # repeats
    bot = BotConfig(name="b", max_turns=1)
    finished = _run(_request(tmp_path, f"{model_server.url}/v1", bot=bot))
    assert finished.outcome.status == OutcomeStatus.FAILED
    assert finished.outcome.error_code == ErrorCode.MAX_TURNS
    # One tool round, then one request told the limit was reached; no third request.
    assert len(model_server.model_requests()) == 2
    assert len([e for e in finished.events if isinstance(e, ToolFinished)]) == 1


def test_max_turns_lets_the_model_answer_after_its_last_tool(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns(
        [{"tool": {"name": "list_files", "arguments": {}}}, {"text": "Answer after one tool."}]
    )
    bot = BotConfig(name="b", max_turns=1)
    finished = _run(_request(tmp_path, f"{model_server.url}/v1", bot=bot))
    assert finished.outcome.final_text == "Answer after one tool."


def test_a_bad_job_is_a_failed_run_with_the_reason(tmp_path: Path) -> None:
    request = _request(tmp_path, None)
    launch = replace(AgnoAdapter().launch(request), stdin=b"{not json")
    finished = _run(request, launch)
    assert finished.exit_code == agno_protocol.EXIT_BAD_JOB
    assert finished.lines == []
    assert finished.outcome.status == OutcomeStatus.FAILED
    assert finished.outcome.error_code == ErrorCode.EXECUTOR_ERROR
    assert finished.outcome.error.startswith(
        "the Agno runner rejected its job: agno_runner: bad job: stdin is not one UTF-8 JSON"
    )


if __name__ == "__main__":
    record_all(sys.argv[1:])
