"""The Codex CLI adapter: its parser on recorded streams, and the real binary against the stand-in.

Two layers, as EXECUTORS.md §4 asks. The parser tests replay streams the real `codex` 0.163
printed (tests/executors/recordings/codex/*.jsonl: `codex app-server`'s stdout, the responses
to the run's requests and its notifications) and need no binary. The real-binary tests run
`codex app-server` through ExecutorProcess, attached as the worker attaches it
(tests/executors/steering.py), against the `model_server` fixture and assert what the model
received and what the run produced; each would fail if the feature it names broke.

The recordings are re-made with `python -m tests.executors.test_codex_adapter` (it runs the same
scenarios through the adapter). The workspace's temporary path is written as
`/baton/workspace` and its state dir as `/baton/state` so the paths in them are stable; nothing
else is edited.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import tomllib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executors.adapters.base import (
    MAX_ERROR_CHARS,
    BotConfig,
    ExecutorUnavailable,
    Launch,
    ModelEndpoint,
    RunRequest,
    SteerRefusal,
    SteerResult,
)
from executors.adapters.codex import API_KEY_VARIABLE, CodexAdapter, toml_string
from executors.adapters.codex_stream import (
    CodexStreamParser,
    classify_error,
    is_missing_session,
)
from executors.events import (
    ErrorCode,
    Event,
    FileChanged,
    MessageCompleted,
    Outcome,
    OutcomeStatus,
    SessionStarted,
    ToolFinished,
    ToolStarted,
    Usage,
    UsageReported,
    Warning,
)
from executors.standin import ModelServer
from executors.standin.errors import ANTHROPIC_CONTEXT_MESSAGE, openai_error
from tests.executors.runs import FinishedRun, of_type, run_as_worker
from tests.executors.steering import LiveRun, SteerAnswers

RECORDINGS = Path(__file__).resolve().parent / "recordings" / "codex"
# vLLM's words (and other OpenAI-compatible servers') for a prompt over the window: no code.
UNTYPED_CONTEXT_MESSAGE = (
    "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
    "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages "
    "or completion."
)
WORKSPACE_PLACEHOLDER = "/baton/workspace"
STATE_PLACEHOLDER = "/baton/state"
MODEL = "gpt-5.5"  # a slug Codex 0.163 knows: an unknown one adds a warning and changes tools
API_KEY = "sk-baton-test-key"
RUN_TIMEOUT_SECONDS = 30.0
# The stand-in's usage per model call when a test does not script one.
CALL_USAGE = Usage(input_tokens=11, output_tokens=7)
PER_CALL = {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 20}
PER_CALL_USAGE = Usage(
    input_tokens=100, cached_input_tokens=40, output_tokens=20, reasoning_tokens=5
)
SCRIPTED_USAGE = {**PER_CALL, "reasoning_tokens": 5}

# Byte-exact answer: non-ASCII, typographic quotes, a backslash, blank lines, a tab, a trailing
# newline — everything a careless strip or re-encode would change.
FINAL_TEXT = "Résultat — “fertig” ✓ 完成\n\n\tC:\\path \\n not a newline\n  trailing  \n"
INSTRUCTIONS = 'Be "terse" — très \\ bref.\nSecond line\twith tab; 日本語; \'single\' """triple"""'
PATCH_ADD = "*** Begin Patch\n*** Add File: notes/hello.txt\n+hello from the patch\n*** End Patch\n"
PATCH_MIXED = (
    "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+two\n*** Delete File: b.txt\n"
    "*** Add File: c.txt\n+c\n*** End Patch\n"
)


# -- running the real binary -------------------------------------------------------------------


def _request(
    base: Path,
    server: ModelServer | None,
    *,
    prompt: str = "Say hello.",
    base_url: str | None = None,
    max_retries: int = 0,
    api_key: str | None = API_KEY,
    resume: str | None = None,
    **bot: Any,
) -> RunRequest:
    """A request with its own state, workspace and tmp dirs under `base` (created here)."""
    for name in ("state", "workspace", "tmp"):
        (base / name).mkdir(parents=True, exist_ok=True)
    if base_url is None and server is not None:
        base_url = f"{server.url}/v1"
    return RunRequest(
        prompt=prompt,
        bot=BotConfig(name="test-bot", **{"model": MODEL, **bot}),
        workspace=base / "workspace",
        state_dir=base / "state",
        tmp_dir=base / "tmp",
        endpoint=ModelEndpoint(base_url=base_url, api_key=api_key, max_retries=max_retries),
        resume_session_id=resume,
        passthrough_env={"PATH": os.environ["PATH"]},
    )


def _run(request: RunRequest, *, wrap: Sequence[str] = ()) -> FinishedRun:
    """Run Codex for `request` as the worker will (optionally under a wrapper such as strace)."""
    adapter = CodexAdapter()
    launch = adapter.launch(request)
    if wrap:
        launch = replace(launch, argv=[*wrap, *launch.argv])
    return run_as_worker(adapter, request, launch=launch)


# -- recordings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    turns: list[dict[str, Any]]
    prompt: str = "Say hello."
    files: dict[str, str] | None = None  # workspace files to create first
    max_retries: int = 0
    model: str = MODEL
    resume_of: str | None = None  # record as a resume of this scenario's thread


SCENARIOS: dict[str, Scenario] = {
    "text": Scenario([{"text": FINAL_TEXT}]),
    "tool_exec": Scenario(
        [
            {"tool": {"name": "exec_command", "arguments": {"cmd": "printf 'hi\\n' > out.txt"}}},
            {"tool": {"name": "exec_command", "arguments": {"cmd": "exit 3"}}},
            {"text": "Wrote out.txt."},
        ]
    ),
    "apply_patch": Scenario(
        [{"custom_tool": {"name": "apply_patch", "input": PATCH_ADD}}, {"text": "Patched."}]
    ),
    "file_changes": Scenario(
        [{"custom_tool": {"name": "apply_patch", "input": PATCH_MIXED}}, {"text": "Done."}],
        files={"a.txt": "one\n", "b.txt": "bye\n"},
    ),
    "http_500": Scenario([{"http_status": 500}]),
    "context_overflow": Scenario([{"context_overflow": True}]),
    # Context-length errors without OpenAI's code (an OpenAI-compatible server; a proxy in front
    # of Anthropic): Codex prints the body it got, and only the provider's words say what it is.
    "context_length_http_400": Scenario([{"http_status": 400, "message": UNTYPED_CONTEXT_MESSAGE}]),
    "prompt_too_long_http_400": Scenario(
        [{"http_status": 400, "message": ANTHROPIC_CONTEXT_MESSAGE}]
    ),
    "rate_limited_after_retry": Scenario([{"http_status": 429}], max_retries=1),
    "unknown_model": Scenario(
        [{"reasoning": "Thinking it over.", "text": "Answer."}], model="fake-model"
    ),
    "resume_first": Scenario([{"text": "First.", "usage": SCRIPTED_USAGE}]),
    "resume_second": Scenario(
        [{"text": "Second.", "usage": SCRIPTED_USAGE}], prompt="Again.", resume_of="resume_first"
    ),
}


def record_all(directory: Path, scratch: Path, names: Sequence[str] = ()) -> None:
    """Re-record every scenario (or only those `names`) with the real binary into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    threads: dict[str, tuple[str, Path]] = {}
    with ModelServer() as server:
        for name, scenario in SCENARIOS.items():
            if names and name not in names:
                continue  # a resume scenario needs the one it resumes named too
            base = scratch / name
            resume = None
            if scenario.resume_of is not None:
                resume, base = threads[scenario.resume_of]
            request = _request(
                base,
                server,
                prompt=scenario.prompt,
                max_retries=scenario.max_retries,
                model=scenario.model,
                resume=resume,
            )
            for path, text in (scenario.files or {}).items():
                (request.workspace / path).write_text(text)
            server.set_turns(scenario.turns)
            run = _run(request)
            threads[name] = (run.outcome.session_id, base)
            workspace, state = str(request.workspace), str(request.state_dir)
            lines = [
                line.replace(workspace, WORKSPACE_PLACEHOLDER).replace(state, STATE_PLACEHOLDER)
                for line in run.lines
            ]
            (directory / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))


def _replay(name: str, state_dir: Path) -> tuple[list[Event], Outcome]:
    parser = CodexStreamParser(workspace=Path(WORKSPACE_PLACEHOLDER), state_dir=state_dir)
    text = (RECORDINGS / f"{name}.jsonl").read_text(encoding="utf-8")
    events: list[Event] = []
    for line in text.splitlines():
        events += parser.feed(line)
    return events, parser.finish(exit_code=0, stderr_tail="")  # app-server exits 0 on EOF


# -- parser on recorded streams (no binary) ----------------------------------------------------

T_TEXT = "01a24d9f-4507-70b1-a874-c7bf481ecb91"
T_TOOL = "01a24d9f-48a2-7e31-be3e-733fdc38abb7"
T_PATCH = "01a24d9f-4ba4-7553-8c39-2e1ee82f768a"
T_FILES = "01a24d9f-4e5e-7961-b362-1bfa56afaadf"
T_500 = "01a24d9f-5192-74f0-9c5c-9e22de1d8ca0"
T_OVERFLOW = "01a24d9f-5377-7b53-9988-088c5eaf37e2"
T_429 = "01a24d9f-5a4b-7cc1-9abc-e5d9a7e6494c"
T_UNTYPED_OVERFLOW = "01a24d9f-5575-7431-a292-bd252ca8bafd"
T_PROMPT_TOO_LONG = "01a24d9f-5783-7241-a75e-33d4873406cb"
T_UNKNOWN = "01a24d9f-6100-79f1-9fe3-fa5a14fd2c53"
T_RESUMED = "01a24d9f-6304-76c0-a948-b1ffea84f607"
HIGH_DEMAND = "We\u2019re currently experiencing high demand, which may cause temporary errors."
OVERFLOW = (
    "Codex ran out of room in the model's context window. Start a new thread or clear earlier "
    "history before retrying."
)
LAST_429 = "exceeded retry limit, last status: 429 Too Many Requests, request id: "
COMMAND_OK = "/bin/bash -lc \"printf 'hi\\\\n' > out.txt\""
COMMAND_EXIT_3 = "/bin/bash -lc 'exit 3'"
CALL_OK, CALL_EXIT_3 = "call_standin_25e9bf80_0006", "call_standin_25e9bf80_0010"
TWO_CALLS = Usage(input_tokens=22, output_tokens=14)
THREE_CALLS = Usage(input_tokens=33, output_tokens=21)

RECORDED: dict[str, tuple[list[Event], Outcome]] = {
    "text": (
        [SessionStarted(T_TEXT), MessageCompleted(FINAL_TEXT), UsageReported(CALL_USAGE)],
        Outcome(
            OutcomeStatus.COMPLETED, final_text=FINAL_TEXT, usage=CALL_USAGE, session_id=T_TEXT
        ),
    ),
    "tool_exec": (
        [
            SessionStarted(T_TOOL),
            ToolStarted(CALL_OK, "shell", COMMAND_OK),
            ToolFinished(CALL_OK, "shell", COMMAND_OK, exit_code=0),
            ToolStarted(CALL_EXIT_3, "shell", COMMAND_EXIT_3),
            ToolFinished(CALL_EXIT_3, "shell", COMMAND_EXIT_3, exit_code=3, is_error=True),
            MessageCompleted("Wrote out.txt."),
            UsageReported(THREE_CALLS),
        ],
        Outcome(
            OutcomeStatus.COMPLETED,
            final_text="Wrote out.txt.",
            usage=THREE_CALLS,
            session_id=T_TOOL,
            commands=(
                {"command": COMMAND_OK, "exit_code": 0},
                {"command": COMMAND_EXIT_3, "exit_code": 3},
            ),
        ),
    ),
    "apply_patch": (
        [
            SessionStarted(T_PATCH),
            FileChanged("notes/hello.txt", "add"),
            MessageCompleted("Patched."),
            UsageReported(TWO_CALLS),
        ],
        Outcome(
            OutcomeStatus.COMPLETED,
            final_text="Patched.",
            usage=TWO_CALLS,
            session_id=T_PATCH,
            files_changed=("notes/hello.txt",),
        ),
    ),
    "file_changes": (
        [
            SessionStarted(T_FILES),
            FileChanged("a.txt", "update"),
            FileChanged("b.txt", "delete"),
            FileChanged("c.txt", "add"),
            MessageCompleted("Done."),
            UsageReported(TWO_CALLS),
        ],
        Outcome(
            OutcomeStatus.COMPLETED,
            final_text="Done.",
            usage=TWO_CALLS,
            session_id=T_FILES,
            files_changed=("a.txt", "b.txt", "c.txt"),
        ),
    ),
    "http_500": (
        [SessionStarted(T_500)],  # the final error is the outcome's, not also a warning
        Outcome(
            OutcomeStatus.RETRYABLE,
            error=HIGH_DEMAND,
            error_code=ErrorCode.UPSTREAM_ERROR,
            session_id=T_500,
        ),
    ),
    "context_overflow": (
        [SessionStarted(T_OVERFLOW)],
        Outcome(
            OutcomeStatus.FAILED,
            error=OVERFLOW,
            error_code=ErrorCode.CONTEXT_OVERFLOW,
            session_id=T_OVERFLOW,
        ),
    ),
    "context_length_http_400": (
        [SessionStarted(T_UNTYPED_OVERFLOW)],
        Outcome(
            OutcomeStatus.FAILED,
            error=json.dumps({"error": openai_error(400, UNTYPED_CONTEXT_MESSAGE)["error"]}),
            error_code=ErrorCode.CONTEXT_OVERFLOW,
            session_id=T_UNTYPED_OVERFLOW,
        ),
    ),
    "prompt_too_long_http_400": (
        [SessionStarted(T_PROMPT_TOO_LONG)],
        Outcome(
            OutcomeStatus.FAILED,
            error=json.dumps({"error": openai_error(400, ANTHROPIC_CONTEXT_MESSAGE)["error"]}),
            error_code=ErrorCode.CONTEXT_OVERFLOW,
            session_id=T_PROMPT_TOO_LONG,
        ),
    ),
    "rate_limited_after_retry": (
        [
            SessionStarted(T_429),
            Warning(f"Reconnecting... 1/1 ({LAST_429}req_standin_25e9bf80_0034)"),
        ],
        Outcome(
            OutcomeStatus.RETRYABLE,
            error=f"{LAST_429}req_standin_25e9bf80_0035",
            error_code=ErrorCode.RATE_LIMITED,
            session_id=T_429,
        ),
    ),
    "unknown_model": (
        [
            SessionStarted(T_UNKNOWN),
            Warning(
                "Model metadata for `fake-model` not found. Defaulting to fallback metadata; "
                "this can degrade performance and cause issues."
            ),
            MessageCompleted("Answer."),  # the reasoning item gives no event
            UsageReported(CALL_USAGE),
        ],
        Outcome(
            OutcomeStatus.COMPLETED, final_text="Answer.", usage=CALL_USAGE, session_id=T_UNKNOWN
        ),
    ),
}


def test_every_recording_has_an_expected_result() -> None:
    recorded = {path.stem for path in RECORDINGS.glob("*.jsonl")}
    assert recorded == set(RECORDED) | {"resume_first", "resume_second"} == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_stream_gives_exact_events_and_outcome(name: str, tmp_path: Path) -> None:
    expected_events, expected_outcome = RECORDED[name]
    events, outcome = _replay(name, tmp_path)
    assert events == expected_events
    assert outcome == expected_outcome


def test_recorded_resume_reports_each_turns_usage_not_the_threads(tmp_path: Path) -> None:
    first_events, first = _replay("resume_first", tmp_path)
    second_events, second = _replay("resume_second", tmp_path)  # same state dir: same worker
    assert first_events[-1] == UsageReported(PER_CALL_USAGE)
    assert second_events[-1] == UsageReported(PER_CALL_USAGE)  # Codex printed 200/80/40/10
    assert (first.usage, second.usage) == (PER_CALL_USAGE, PER_CALL_USAGE)
    assert (second.session_id, second.final_text) == (T_RESUMED, "Second.")
    store = tmp_path / "baton-thread-usage"
    assert [path.name for path in store.iterdir()] == [f"{T_RESUMED}.json"]  # no temp file left
    assert json.loads((store / f"{T_RESUMED}.json").read_text()) == {
        "session_id": T_RESUMED,
        "usage": {
            "input_tokens": 200,
            "cached_input_tokens": 80,
            "cache_write_input_tokens": 0,
            "output_tokens": 40,
            "reasoning_output_tokens": 10,
        },
    }


def test_usage_without_a_record_of_the_thread_is_its_total(tmp_path: Path) -> None:
    """A resumed thread whose earlier usage this worker never saw: nothing to subtract."""
    _, outcome = _replay("resume_second", tmp_path)
    assert outcome.usage == Usage(
        input_tokens=200, cached_input_tokens=80, output_tokens=40, reasoning_tokens=10
    )


def test_a_lower_total_than_recorded_is_reported_whole(tmp_path: Path) -> None:
    _replay("resume_second", tmp_path)  # records the thread's total 200/80/40/10
    _, outcome = _replay("resume_first", tmp_path)  # then the same thread reports 100/40/20/5
    assert outcome.usage == PER_CALL_USAGE


# -- parser edge cases -------------------------------------------------------------------------

THREAD = "01a215b2-5d1e-7032-87ef-132e36caedca"
TURN = "01a215b2-5d2f-7c41-9a6e-6e1d1d0f1c2a"
STARTED = json.dumps({"id": 1, "result": {"thread": {"id": THREAD}}})
TURN_STARTED = json.dumps(
    {"method": "turn/started", "params": {"threadId": THREAD, "turn": {"id": TURN}}}
)


def _turn_completed(status: str = "completed", message: str | None = None) -> str:
    error = None if message is None else {"message": message, "codexErrorInfo": None}
    turn = {"id": TURN, "status": status, "error": error}
    return json.dumps({"method": "turn/completed", "params": {"threadId": THREAD, "turn": turn}})


COMPLETED = _turn_completed()


def _parser(tmp_path: Path, workspace: Path | None = None) -> CodexStreamParser:
    return CodexStreamParser(workspace=workspace or tmp_path / "ws", state_dir=tmp_path / "state")


def _turn_failed(message: str) -> str:
    return _turn_completed("failed", message)


def _error(message: str, *, will_retry: bool = False) -> str:
    params = {"error": {"message": message}, "willRetry": will_retry, "threadId": THREAD}
    return json.dumps({"method": "error", "params": params})


def _completed_item(item: dict[str, Any]) -> str:
    params = {"item": item, "threadId": THREAD, "turnId": TURN}
    return json.dumps({"method": "item/completed", "params": params})


def test_garbage_and_a_truncated_last_line_are_ignored(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    lines = [
        "",
        "WARNING: proceeding, even though we could not create PATH aliases",
        "[1, 2]",
        "null",
        '{"method": 7}',
        '{"id": 1}',
        '{"method":"item/completed","params":"not an object"}',
        '{"method":"item/completed","params":{"item":"not an object"}}',
        '{"method":"item/completed","params":{"item":{"type":"agentMessage","text":["no"]}}}',
        '{"method":"item/completed","params":{"item":{"type":"fileChange","changes":[1,{"path":3}]}}}',
        '{"method":"thread/tokenUsage/updated","params":{"tokenUsage":{"total":{"inputTokens":"11"}}}}',
        '{"method":"turn/completed","params":{"turn":{"status":"completed"}}}',  # whose turn?
        TURN_STARTED,
        json.dumps(
            {
                "method": "thread/tokenUsage/updated",
                "params": {"turnId": TURN, "tokenUsage": {"total": {"inputTokens": -3}}},
            }
        ),
        COMPLETED,
        "[" * 100_000,
        '{"method":"item/completed","params":{"item":{"id":"i","type":"agentMessage","text":"cut',
    ]
    events = [event for line in lines for event in parser.feed(line)]
    assert events == [UsageReported(Usage())]
    outcome = parser.finish(exit_code=0, stderr_tail="")
    assert outcome == Outcome(OutcomeStatus.COMPLETED, final_text="", usage=Usage())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["type", "item", "turn", "status", "text", "changes", "path", "kind", "error"]
                + ["message", "id", "tokenUsage", "total", "clientId"]
            )
            | st.text(max_size=5),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)
codex_lines = st.builds(
    lambda method, params, request_id: json.dumps(
        {"method": method, "params": params, **({} if request_id is None else {"id": request_id})}
    ),
    st.sampled_from(
        ["item/started", "item/completed", "turn/started", "turn/completed", "error", "warning"]
        + ["thread/tokenUsage/updated", "item/commandExecution/requestApproval"]
    ),
    st.dictionaries(
        st.sampled_from(["item", "turn", "error", "message", "threadId", "turnId", "willRetry"]),
        json_values,
    ),
    st.none() | st.integers(min_value=0, max_value=4),
)
codex_responses = st.builds(
    lambda request_id, key, value: json.dumps({"id": request_id, key: value}),
    st.integers(min_value=0, max_value=4),
    st.sampled_from(["result", "error"]),
    json_values,
)


@given(
    lines=st.lists(
        st.text() | json_values.map(json.dumps) | codex_lines | codex_responses, max_size=8
    ),
    exit_code=st.integers(min_value=-15, max_value=255),
)
def test_the_parser_never_raises(lines: list[str], exit_code: int) -> None:
    parser = CodexStreamParser(workspace=Path("/baton/workspace"), state_dir=Path("/nonexistent"))
    for line in lines:
        parser.feed(line)
    outcome = parser.finish(exit_code=exit_code, stderr_tail="\n".join(lines))
    assert len(outcome.error) <= MAX_ERROR_CHARS


def test_no_agent_message_completes_with_empty_text(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    assert parser.feed(STARTED) == [SessionStarted(THREAD)]
    parser.feed(TURN_STARTED)
    parser.feed(COMPLETED)
    outcome = parser.finish(exit_code=0, stderr_tail="")
    assert (outcome.status, outcome.final_text, outcome.session_id) == (
        OutcomeStatus.COMPLETED,
        "",
        THREAD,
    )


def test_the_last_agent_message_is_the_final_text(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    for text in ("I'll look.", "Found it:\n\n  the answer "):
        item = {"id": "msg_0", "type": "agentMessage", "text": text}
        assert parser.feed(_completed_item(item)) == [MessageCompleted(text)]
    parser.feed(COMPLETED)
    assert parser.finish(exit_code=0, stderr_tail="").final_text == "Found it:\n\n  the answer "


def test_an_error_that_codex_retries_is_a_warning_and_the_last_one_the_outcome(
    tmp_path: Path,
) -> None:
    parser = _parser(tmp_path)
    parser.feed(STARTED)
    assert parser.feed(_error("Reconnecting... 1/1", will_retry=True)) == [
        Warning("Reconnecting... 1/1")
    ]
    assert parser.feed(_error("stream disconnected before completion: boom")) == []
    assert parser.feed(json.dumps({"method": "warning", "params": {"message": "Heads up"}})) == [
        Warning("Heads up")
    ]
    assert parser.feed(_turn_failed("stream disconnected before completion: boom")) == []
    outcome = parser.finish(exit_code=0, stderr_tail="")
    assert (outcome.status, outcome.error, outcome.error_code) == (
        OutcomeStatus.RETRYABLE,
        "stream disconnected before completion: boom",
        ErrorCode.NETWORK_ERROR,
    )


def test_a_final_error_without_the_turns_end_is_the_outcomes_error(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    parser.feed(STARTED)
    parser.feed(_error("unexpected status 401 Unauthorized: Incorrect API key provided."))
    outcome = parser.finish(exit_code=-9, stderr_tail="WARNING: ignored\n")
    assert outcome == Outcome(
        OutcomeStatus.FAILED,
        error="unexpected status 401 Unauthorized: Incorrect API key provided.",
        error_code=ErrorCode.AUTH_ERROR,
        session_id=THREAD,
    )


def test_another_threads_messages_are_not_this_runs(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    parser.feed(STARTED)
    item = {"id": "msg_0", "type": "agentMessage", "text": "a sub-agent's"}
    params = {"item": item, "threadId": "another-thread", "turnId": "t"}
    assert parser.feed(json.dumps({"method": "item/completed", "params": params})) == []


# What Codex 0.163 answers to thread/resume for a thread it has no rollout for (`codex exec
# resume` printed the same words on stderr and exited 1).
MISSING_SESSION_ERROR = (
    "thread/resume failed: no rollout found for thread id 01a215b2-2186-7321-bff1-8c33f99b981e"
)
MISSING_SESSION_STDERR = (
    "WARNING: proceeding, even though we could not create PATH aliases: Refusing to create "
    'helper binaries under temporary dir "/tmp" (codex_home: AbsolutePathBuf("/tmp/cxhome"))\n'
    f"Error: thread/resume: {MISSING_SESSION_ERROR} (code -32600)\n"
)


def test_a_resume_of_an_unknown_thread_is_a_recognisable_failure(tmp_path: Path) -> None:
    parser = CodexStreamParser(
        workspace=tmp_path, state_dir=tmp_path, resume_session_id=str(uuid.uuid4())
    )
    refusal = {
        "id": 1,
        "error": {
            "code": -32600,
            "message": MISSING_SESSION_ERROR.removeprefix("thread/resume failed: "),
        },
    }
    assert parser.feed(json.dumps(refusal)) == []
    outcome = parser.finish(exit_code=0, stderr_tail="")
    assert outcome == Outcome(
        OutcomeStatus.FAILED, error=MISSING_SESSION_ERROR, error_code=ErrorCode.EXECUTOR_ERROR
    )
    assert is_missing_session(outcome)
    assert is_missing_session(MISSING_SESSION_STDERR)
    assert not is_missing_session(Outcome(OutcomeStatus.FAILED, error=HIGH_DEMAND))
    assert not is_missing_session("")


PANIC = "thread 'main' panicked at src/x.rs:1:1:\nboom\nnote: run with RUST_BACKTRACE=1"


@pytest.mark.parametrize(
    ("exit_code", "stderr", "error"),
    [
        (101, PANIC, PANIC),
        (1, "WARNING: proceeding, even though …\n", "codex exited with code 1"),
        (-9, "", "codex was killed by signal 9"),
        (0, "", "codex exited without completing the turn"),
    ],
)
def test_an_exit_without_a_turn_result_fails_with_the_executors_words(
    exit_code: int, stderr: str, error: str, tmp_path: Path
) -> None:
    outcome = _parser(tmp_path).finish(exit_code=exit_code, stderr_tail=stderr)
    assert (outcome.status, outcome.error, outcome.error_code) == (
        OutcomeStatus.FAILED,
        error,
        ErrorCode.EXECUTOR_ERROR,
    )


def test_a_long_error_is_bounded(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    parser.feed(_turn_failed("x" * 100_000))
    error = parser.finish(exit_code=0, stderr_tail="").error
    assert len(error) == MAX_ERROR_CHARS and error.endswith("…")


def test_file_paths_are_workspace_relative_only_inside_it(tmp_path: Path) -> None:
    workspace = tmp_path / "real"
    (workspace / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(workspace)
    parser = _parser(tmp_path, workspace=link)
    changes = [
        {"path": f"{link}/sub/a.txt", "kind": {"type": "add"}},
        # Codex printed the real path
        {"path": f"{workspace}/sub/b.txt", "kind": {"type": "update", "move_path": None}},
        {"path": f"{workspace}/../elsewhere.txt", "kind": {"type": "delete"}},
        {"path": "/etc/hosts", "kind": {"type": "update"}},
        {"path": f"{link}/sub/a.txt", "kind": {"type": "rename"}},
    ]
    item = {"id": "call_0", "type": "fileChange", "changes": changes, "status": "completed"}
    assert parser.feed(_completed_item(item)) == [
        FileChanged("sub/a.txt", "add"),
        FileChanged("sub/b.txt", "update"),
        FileChanged(f"{tmp_path}/elsewhere.txt", "delete"),
        FileChanged("/etc/hosts", "update"),
        FileChanged("sub/a.txt", "update"),  # an unknown kind is still a change
    ]
    assert parser.feed(_completed_item({**item, "id": "call_1", "status": "failed"})) == []
    assert parser.feed(_completed_item({**item, "id": "call_2", "status": "declined"})) == []
    parser.feed(COMPLETED)
    assert parser.finish(exit_code=0, stderr_tail="").files_changed == (
        "sub/a.txt",
        "sub/b.txt",
        f"{tmp_path}/elsewhere.txt",
        "/etc/hosts",
    )


URL = "url: http://127.0.0.1:46265/v1/responses, request id: req_1"
# Messages exactly as Codex 0.163 printed them in turn.failed against the stand-in.
CLASSIFIED = [
    ("stream disconnected before completion: boom", ErrorCode.NETWORK_ERROR),
    (OVERFLOW, ErrorCode.CONTEXT_OVERFLOW),
    (
        '{"error": {"message": "Your input exceeds the context window of this model.", '
        '"type": "invalid_request_error", "code": "context_length_exceeded", "param": null}}',
        ErrorCode.CONTEXT_OVERFLOW,
    ),
    ("rate limit exceeded: slow down", ErrorCode.RATE_LIMITED),
    (f"{LAST_429}req_standin_d64957d9_0001", ErrorCode.RATE_LIMITED),
    ("Quota exceeded. Check your plan and billing details.", ErrorCode.EXECUTOR_ERROR),
    ("Selected model is at capacity. Please try a different model.", ErrorCode.UPSTREAM_ERROR),
    (HIGH_DEMAND, ErrorCode.UPSTREAM_ERROR),
    (HIGH_DEMAND.replace("\u2019", "'"), ErrorCode.UPSTREAM_ERROR),
    (
        f"unexpected status 502 Bad Gateway: The server had an error., {URL}",
        ErrorCode.UPSTREAM_ERROR,
    ),
    (f"unexpected status 401 Unauthorized: Incorrect API key., {URL}", ErrorCode.AUTH_ERROR),
    (f"unexpected status 403 Forbidden: Not allowed., {URL}", ErrorCode.AUTH_ERROR),
    (f"unexpected status 429 Too Many Requests: Slow down., {URL}", ErrorCode.RATE_LIMITED),
    (f"unexpected status 404 Not Found: Not found., {URL}", ErrorCode.EXECUTOR_ERROR),
    ("Connection failed: error sending request", ErrorCode.NETWORK_ERROR),
    ("stream closed before response.completed", ErrorCode.NETWORK_ERROR),
    (MISSING_SESSION_ERROR, ErrorCode.EXECUTOR_ERROR),
    (
        '{"error": {"message": "Bad thing", "type": "invalid_request_error"}}',
        ErrorCode.EXECUTOR_ERROR,
    ),
    ("x", ErrorCode.EXECUTOR_ERROR),
]


@pytest.mark.parametrize(("message", "code"), CLASSIFIED)
def test_error_classification(message: str, code: ErrorCode) -> None:
    assert classify_error(message) == code


# -- launch ------------------------------------------------------------------------------------


def test_toml_string_escapes_exactly_what_toml_requires() -> None:
    assert toml_string('a "b" \\ c\nd\te\x7f — é 日') == (
        '"a \\"b\\" \\\\ c\\u000ad\\u0009e\\u007f — é 日"'
    )


@given(st.text())
def test_toml_string_parses_back_to_the_same_text(value: str) -> None:
    expected = "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in value)
    assert tomllib.loads(f"value = {toml_string(value)}")["value"] == expected


def _config(argv: list[str]) -> list[str]:
    return [argv[index + 1] for index, item in enumerate(argv) if item == "-c"]


def test_launch_builds_the_exact_command_and_environment(tmp_path: Path) -> None:
    adapter = CodexAdapter()
    request = _request(
        tmp_path,
        None,
        prompt="The prompt — 完成",
        base_url="http://127.0.0.1:9/v1",
        max_retries=2,
        instructions="Be brief.",
    )
    request = replace(
        request,
        passthrough_env={"PATH": "/usr/bin", "LANG": "C.UTF-8", API_KEY_VARIABLE: "inherited"},
    )
    launch = adapter.launch(request)
    workspace = tmp_path / "workspace"
    overrides = [
        'model_provider="baton"',
        'model_providers.baton.name="baton"',
        'model_providers.baton.base_url="http://127.0.0.1:9/v1"',
        'model_providers.baton.wire_api="responses"',
        "model_providers.baton.request_max_retries=2",
        "model_providers.baton.stream_max_retries=2",
        "features.plugins=false",
        "features.unbounded_connection_retries=false",
        "analytics.enabled=false",
        'shell_environment_policy.exclude=["OPENAI_API_KEY"]',
        f'projects={{"{workspace}"={{trust_level="untrusted"}}}}',
        'model_providers.baton.env_key="OPENAI_API_KEY"',
        'model="gpt-5.5"',
        'developer_instructions="Be brief."',
    ]
    assert launch == Launch(
        argv=[
            adapter.locate(),
            "app-server",
            *[part for override in overrides for part in ("-c", override)],
        ],
        env={
            "PATH": "/usr/bin",
            "LANG": "C.UTF-8",
            "CODEX_HOME": str(tmp_path / "state"),
            "HOME": str(tmp_path / "state" / "home"),
            "TMPDIR": str(tmp_path / "tmp"),
            API_KEY_VARIABLE: API_KEY,
        },
        cwd=tmp_path / "workspace",
        stdin=b"",  # the prompt goes in turn/start, written by the parser
        interactive=True,
    )
    assert CodexAdapter.steerable
    assert (tmp_path / "state" / "home").is_dir()
    assert not any(API_KEY in item or "The prompt" in item for item in launch.argv)


class RecordedStdin:
    """A `Stdin` that keeps what is written to it."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write_stdin(self, data: bytes) -> bool:
        if self.closed:
            return False
        self.written += data
        return True

    def close_stdin(self) -> None:
        self.closed = True

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.written.decode().splitlines()]


def test_a_run_starts_a_thread_then_a_turn_with_the_prompt(tmp_path: Path) -> None:
    request = _request(tmp_path, None, prompt="The prompt — 完成 \ud800")
    parser = CodexAdapter().parser(request)
    stdin = RecordedStdin()
    parser.attach(stdin)
    workspace = str(tmp_path / "workspace")
    assert stdin.messages() == [
        {
            "id": 0,
            "method": "initialize",
            "params": {
                "clientInfo": {"name": "baton", "title": None, "version": "1"},
                "capabilities": None,
            },
        },
        {"method": "initialized"},
        {
            "id": 1,
            "method": "thread/start",
            "params": {
                "cwd": workspace,
                "sandbox": "danger-full-access",
                "approvalPolicy": "never",
            },
        },
    ]
    stdin.written = b""
    assert parser.feed(json.dumps({"id": 1, "result": {"thread": {"id": THREAD}}})) == [
        SessionStarted(THREAD)
    ]
    # A lone surrogate cannot be sent as UTF-8 at all: it becomes "?" instead of no run.
    assert stdin.messages() == [
        {
            "id": 2,
            "method": "turn/start",
            "params": {
                "threadId": THREAD,
                "input": [{"type": "text", "text": "The prompt — 完成 ?", "text_elements": []}],
            },
        }
    ]
    assert not stdin.closed
    parser.feed(COMPLETED)
    assert stdin.closed  # the app-server exits on EOF


def test_a_resume_of_a_read_only_bot_without_a_key(tmp_path: Path) -> None:
    request = _request(
        tmp_path,
        None,
        api_key=None,
        model="",
        permission_mode="read_only",
        max_turns=3,  # Codex has no turn limit: ignored
        resume=THREAD.upper(),
    )
    request = replace(request, passthrough_env={"PATH": "/bin", API_KEY_VARIABLE: "inherited"})
    adapter = CodexAdapter()
    launch = adapter.launch(request)
    config = _config(launch.argv)
    assert 'model_providers.baton.base_url="https://api.openai.com/v1"' in config
    assert not [item for item in config if "env_key" in item or item.startswith("model=")]
    assert API_KEY_VARIABLE not in launch.env
    stdin = RecordedStdin()
    adapter.parser(request).attach(stdin)
    assert stdin.messages()[2] == {
        "id": 1,
        "method": "thread/resume",
        "params": {
            "threadId": THREAD,  # the UUID as Codex writes it
            "cwd": str(tmp_path / "workspace"),
            "sandbox": "read-only",
            "approvalPolicy": "never",
        },
    }


def test_a_server_request_is_declined(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    stdin = RecordedStdin()
    parser.attach(stdin)
    stdin.written = b""
    approval = {"id": 7, "method": "item/commandExecution/requestApproval", "params": {}}
    other = {"id": "x", "method": "item/tool/requestUserInput", "params": {}}
    assert parser.feed(json.dumps(approval)) == []
    assert parser.feed(json.dumps(other)) == []
    assert stdin.messages() == [
        {"id": 7, "result": {"decision": "decline"}},
        {
            "id": "x",
            "error": {
                "code": -32601,
                "message": "Baton does not answer item/tool/requestUserInput",
            },
        },
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"resume_session_id": "my-thread"}, "not a Codex thread id"),
        ({"bot": BotConfig(name="b", permission_mode="workspace")}, "unknown permission mode"),
        ({"bot": BotConfig(name="b", instructions="x" * 140_000)}, "exceeds 128 KiB"),
    ],
)
def test_launch_refuses_what_codex_would_get_wrong(
    change: dict[str, Any], message: str, tmp_path: Path
) -> None:
    request = replace(_request(tmp_path, None), **change)
    with pytest.raises(ValueError, match=message):
        CodexAdapter().launch(request)


def test_locate_explains_how_to_install_when_the_package_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "codex_cli_bin", None)  # import now raises ImportError
    with pytest.raises(ExecutorUnavailable, match=re.escape("openai-codex-cli-bin==0.163.0")):
        CodexAdapter().locate()


def test_locate_refuses_a_binary_that_cannot_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import codex_cli_bin

    not_executable = tmp_path / "codex"
    not_executable.write_text("")
    monkeypatch.setattr(codex_cli_bin, "bundled_codex_path", lambda: not_executable)
    with pytest.raises(ExecutorUnavailable, match=re.escape("pip install 'baton[executors]'")):
        CodexAdapter().locate()


def test_locate_finds_the_bundled_binary_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import codex_cli_bin

    adapter = CodexAdapter()
    path = adapter.locate()
    assert os.access(path, os.X_OK) and path == str(codex_cli_bin.bundled_codex_path())
    monkeypatch.setitem(sys.modules, "codex_cli_bin", None)
    assert adapter.locate() == path  # cached: no second lookup


# -- the real binary against the stand-in ------------------------------------------------------


def _only_model_calls(server: ModelServer, count: int) -> list[Any]:
    """Every request the server saw was one of `count` Responses calls; returns them."""
    requests = server.requests
    assert [(request.method, request.path) for request in requests] == [
        ("POST", "/v1/responses")
    ] * count
    return requests


def test_final_text_instructions_and_model_arrive_exactly(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"text": FINAL_TEXT}])
    run = _run(_request(tmp_path, model_server, instructions=INSTRUCTIONS, model="gpt-5.5"))
    thread = run.outcome.session_id
    assert run.outcome == Outcome(
        OutcomeStatus.COMPLETED, final_text=FINAL_TEXT, usage=CALL_USAGE, session_id=thread
    )
    assert run.events == [
        SessionStarted(thread),
        MessageCompleted(FINAL_TEXT),
        UsageReported(CALL_USAGE),
    ]
    (call,) = _only_model_calls(model_server, 1)
    assert call.body["model"] == "gpt-5.5"
    assert call.headers["authorization"] == f"Bearer {API_KEY}"
    assert call.headers["session-id"] == thread
    developer_parts = [
        part["text"]
        for item in call.body["input"]
        if item.get("role") == "developer"
        for part in item["content"]
    ]
    assert INSTRUCTIONS in developer_parts  # a part of its own, byte for byte
    assert call.body["input"][-1]["content"][0]["text"] == "Say hello."


def test_a_prompt_over_200_kib_reaches_the_model_intact(
    model_server: ModelServer, tmp_path: Path
) -> None:
    prompt = "".join(chr(0x4E00 + index % 20_000) for index in range(70_000)) + "\nend"
    assert len(prompt.encode()) > 200_000
    model_server.set_turns([{"text": "Read it."}])
    run = _run(_request(tmp_path, model_server, prompt=prompt))
    assert run.outcome.status == OutcomeStatus.COMPLETED
    (call,) = _only_model_calls(model_server, 1)
    assert call.body["input"][-1]["content"][0]["text"] == prompt


def test_a_tool_call_runs_in_the_workspace_without_the_key(
    model_server: ModelServer, tmp_path: Path
) -> None:
    command = 'printf %s "${OPENAI_API_KEY-no key}|$BATON_RUN_ID" > out.txt; exit 4'
    model_server.set_turns(
        [{"tool": {"name": "exec_command", "arguments": {"cmd": command}}}, {"text": "Ran it."}]
    )
    request = _request(tmp_path, model_server)
    run = _run(request)
    key, marker = (request.workspace / "out.txt").read_text().split("|")
    assert key == "no key"  # shell_environment_policy keeps the key from model-run commands
    assert marker.startswith("codex-test-")  # while the worker's run marker still reaches them
    wrapped = run.outcome.commands[0]["command"]
    assert command in wrapped  # Codex shows it wrapped: /bin/bash -lc '…'
    call_id = of_type(run.events, ToolStarted)[0].call_id  # type: ignore[attr-defined]
    assert call_id.startswith("call_")  # the model's call id
    assert of_type(run.events, ToolStarted) == [ToolStarted(call_id, "shell", wrapped)]
    assert of_type(run.events, ToolFinished) == [
        ToolFinished(call_id, "shell", wrapped, exit_code=4, is_error=True)
    ]
    assert run.outcome.commands == ({"command": wrapped, "exit_code": 4},)
    assert (run.outcome.status, run.outcome.final_text) == (OutcomeStatus.COMPLETED, "Ran it.")
    assert _only_model_calls(model_server, 2)[1].body["input"][-1]["type"] == (
        "function_call_output"
    )


def test_apply_patch_changes_the_workspace_and_reports_the_file(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns(
        [{"custom_tool": {"name": "apply_patch", "input": PATCH_ADD}}, {"text": "Patched."}]
    )
    request = _request(tmp_path, model_server)
    run = _run(request)
    assert (request.workspace / "notes" / "hello.txt").read_text() == "hello from the patch\n"
    assert of_type(run.events, FileChanged) == [FileChanged("notes/hello.txt", "add")]
    assert run.outcome.files_changed == ("notes/hello.txt",)


def test_read_only_runs_commands_that_cannot_write_anywhere(
    model_server: ModelServer, tmp_path: Path
) -> None:
    probe = "cat probe.txt; touch new.txt; touch $TMPDIR/x; touch $HOME/x; echo rc=$?"
    model_server.set_turns(
        [
            {"tool": {"name": "exec_command", "arguments": {"cmd": probe}}},
            {"custom_tool": {"name": "apply_patch", "input": PATCH_ADD}},
            {"text": "Looked."},
        ]
    )
    request = _request(tmp_path, model_server, permission_mode="read_only")
    (request.workspace / "probe.txt").write_text("readable\n")
    run = _run(request)
    assert (run.outcome.status, run.outcome.final_text) == (OutcomeStatus.COMPLETED, "Looked.")
    assert sorted(path.name for path in request.workspace.iterdir()) == ["probe.txt"]
    # Codex itself keeps bwrap mount targets in TMPDIR; the command could write nothing there.
    assert not (request.tmp_dir / "x").exists()
    assert not (request.state_dir / "home" / "x").exists()
    calls = _only_model_calls(model_server, 3)
    command_output = calls[1].body["input"][-1]["output"]
    assert "readable" in command_output and "Read-only file system" in command_output
    assert calls[2].body["input"][-1]["output"].startswith("patch rejected")


def test_a_resumed_thread_reports_each_turns_usage(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"text": "First.", "usage": SCRIPTED_USAGE}])
    first = _run(_request(tmp_path, model_server, prompt="One."))
    thread = first.outcome.session_id
    model_server.set_turns([{"text": "Second.", "usage": SCRIPTED_USAGE}])
    second = _run(_request(tmp_path, model_server, prompt="Two.", resume=thread))
    usage_lines = [line for line in second.lines if "thread/tokenUsage/updated" in line]
    total = json.loads(usage_lines[-1])["params"]["tokenUsage"]["total"]
    assert (total["inputTokens"], total["outputTokens"]) == (200, 40)  # the thread's total
    assert (first.outcome.usage, second.outcome.usage) == (PER_CALL_USAGE, PER_CALL_USAGE)
    assert (second.outcome.session_id, second.outcome.final_text) == (thread, "Second.")
    calls = _only_model_calls(model_server, 2)
    texts = [part.get("text") for item in calls[1].body["input"] for part in item["content"]]
    assert "One." in texts and "First." in texts  # the earlier turn was sent again
    assert calls[1].body["input"][-1]["content"][0]["text"] == "Two."


def test_a_resume_of_a_thread_this_worker_lacks_is_recognised(
    model_server: ModelServer, tmp_path: Path
) -> None:
    run = _run(_request(tmp_path, model_server, resume=str(uuid.uuid4())))
    assert run.exit_code == 0
    assert not any("turn/" in line for line in run.lines)  # no turn was started
    assert (run.outcome.status, run.outcome.error_code) == (
        OutcomeStatus.FAILED,
        ErrorCode.EXECUTOR_ERROR,
    )
    assert is_missing_session(run.outcome)
    assert model_server.requests == []


@pytest.mark.parametrize("trusted_before", [False, True])
def test_a_workspace_codex_config_is_ignored(
    trusted_before: bool, model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"text": "ok"}])
    request = _request(tmp_path, model_server)
    (request.workspace / ".codex").mkdir()
    (request.workspace / ".codex" / "config.toml").write_text(
        'developer_instructions = "INJECTED"\n'
    )
    user_config = request.state_dir / "config.toml"
    if trusted_before:  # as app-server itself writes it for a full-access thread's cwd
        user_config.write_text(f'[projects."{request.workspace}"]\ntrust_level = "trusted"\n')
    run = _run(request)
    assert run.outcome.status == OutcomeStatus.COMPLETED
    (call,) = _only_model_calls(model_server, 1)
    assert "INJECTED" not in json.dumps(call.body)
    assert not user_config.exists()  # Baton removed it, and Codex marked nothing trusted


def test_a_config_planted_in_the_state_dir_is_ignored(
    model_server: ModelServer, tmp_path: Path
) -> None:
    # A tool command can write there (it is under the run's HOME's parent): not Baton's.
    model_server.set_turns([{"text": "ok"}])
    request = _request(tmp_path, model_server)
    request.state_dir.mkdir(parents=True, exist_ok=True)
    (request.state_dir / "config.toml").write_text('developer_instructions = "PLANTED"\n')
    run = _run(request)
    assert run.outcome.status == OutcomeStatus.COMPLETED
    (call,) = _only_model_calls(model_server, 1)
    assert "PLANTED" not in json.dumps(call.body)


def test_without_a_key_no_authorization_is_sent(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns([{"text": "ok"}])
    run = _run(_request(tmp_path, model_server, api_key=None))
    assert run.outcome.status == OutcomeStatus.COMPLETED
    (call,) = _only_model_calls(model_server, 1)
    assert "authorization" not in call.headers


RETRYABLE, FAILED = OutcomeStatus.RETRYABLE, OutcomeStatus.FAILED
FAILURES = [
    ({"fail": "boom"}, RETRYABLE, ErrorCode.NETWORK_ERROR),
    ({"fail": "slow", "code": "rate_limit_exceeded"}, RETRYABLE, ErrorCode.RATE_LIMITED),
    ({"fail": "q", "code": "insufficient_quota"}, FAILED, ErrorCode.EXECUTOR_ERROR),
    ({"fail": "c", "code": "server_is_overloaded"}, RETRYABLE, ErrorCode.UPSTREAM_ERROR),
    ({"http_status": 500}, RETRYABLE, ErrorCode.UPSTREAM_ERROR),
    ({"http_status": 503}, RETRYABLE, ErrorCode.UPSTREAM_ERROR),
    ({"http_status": 429}, RETRYABLE, ErrorCode.RATE_LIMITED),
    ({"http_status": 401}, FAILED, ErrorCode.AUTH_ERROR),
    ({"http_status": 403}, FAILED, ErrorCode.AUTH_ERROR),
    ({"context_overflow": True}, FAILED, ErrorCode.CONTEXT_OVERFLOW),
    (
        {"http_status": 400, "code": "context_length_exceeded", "message": "Too long."},
        FAILED,
        ErrorCode.CONTEXT_OVERFLOW,
    ),
]


@pytest.mark.parametrize(("turn", "status", "code"), FAILURES)
def test_model_failures_map_to_status_and_code(
    turn: dict[str, Any],
    status: OutcomeStatus,
    code: ErrorCode,
    model_server: ModelServer,
    tmp_path: Path,
) -> None:
    model_server.set_turns([turn])
    run = _run(_request(tmp_path, model_server))
    assert (run.exit_code, run.outcome.status, run.outcome.error_code) == (0, status, code)
    assert run.outcome.error and run.outcome.final_text is None
    assert not of_type(run.events, Warning)  # the final error is not also a warning
    _only_model_calls(model_server, 1)  # max_retries=0: one call, no retry


def test_an_unreachable_endpoint_is_a_network_error(tmp_path: Path) -> None:
    with ModelServer() as stopped:
        dead_url = f"{stopped.url}/v1"
    run = _run(_request(tmp_path, None, base_url=dead_url))
    assert (run.outcome.status, run.outcome.error_code, run.outcome.error) == (
        OutcomeStatus.RETRYABLE,
        ErrorCode.NETWORK_ERROR,
        "Connection failed: error sending request",
    )


def test_retries_follow_the_endpoint_setting(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns([{"fail": "boom"}, {"text": "Recovered."}])
    run = _run(_request(tmp_path, model_server, max_retries=1))
    assert run.outcome.final_text == "Recovered."
    assert run.events[1] == Warning(
        "Reconnecting... 1/1 (stream disconnected before completion: boom)"
    )
    _only_model_calls(model_server, 2)


# -- steering ------------------------------------------------------------------------------------

STEER = "Also write “steered” — 完成 \\ at the end."


def _user_texts(call: Any) -> list[str]:
    return [
        part.get("text", "")
        for item in call.body["input"]
        if item.get("role") == "user"
        for part in item["content"]
    ]


def _wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def test_a_steer_during_a_tool_command_reaches_the_next_model_request(
    model_server: ModelServer, tmp_path: Path
) -> None:
    command = "touch started; while [ ! -f go ]; do sleep 0.05; done; echo went"
    model_server.set_turns(
        [{"tool": {"name": "exec_command", "arguments": {"cmd": command}}}, {"text": "Steered."}]
    )
    request = _request(tmp_path, model_server)
    run = LiveRun(CodexAdapter(), request)
    model_server.wait_for_requests(1)
    _wait_for_file(request.workspace / "started")  # the command runs, waiting for `go`
    answer = run.steer(STEER)
    assert answer.wait() == SteerResult(delivered=True)
    (request.workspace / "go").touch()
    finished = run.finish()
    assert (finished.outcome.status, finished.outcome.final_text) == (
        OutcomeStatus.COMPLETED,
        "Steered.",
    )
    first, second = _only_model_calls(model_server, 2)
    assert STEER not in json.dumps(first.body, ensure_ascii=False)
    assert _user_texts(second).count(STEER) == 1
    # Where it lands: a user message after the command's output, the last input item.
    assert second.body["input"][-2]["type"] == "function_call_output"
    assert "went" in second.body["input"][-2]["output"]
    assert second.body["input"][-1] == {
        "type": "message",
        "id": second.body["input"][-1]["id"],
        "role": "user",
        "content": [{"type": "input_text", "text": STEER}],
    }
    assert answer.answers == [SteerResult(delivered=True)]  # exactly once


def test_a_steer_after_the_turn_is_refused(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns([{"text": "Done."}])
    run = LiveRun(CodexAdapter(), _request(tmp_path, model_server))
    run.wait_for(lambda events: bool(of_type(events, UsageReported)))  # turn/completed read
    late = run.steer(STEER)
    assert late.wait() == SteerResult.refused(SteerRefusal.FINISHED)
    finished = run.finish()
    after_the_run = run.steer(STEER)
    assert after_the_run.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]
    assert late.answers == [SteerResult.refused(SteerRefusal.FINISHED)]
    assert finished.outcome.final_text == "Done."
    assert STEER not in json.dumps(_only_model_calls(model_server, 1)[0].body, ensure_ascii=False)


def test_a_steer_of_a_run_that_is_stopped_is_not_running_once(
    model_server: ModelServer, tmp_path: Path
) -> None:
    request = _request(tmp_path, model_server)
    adapter = CodexAdapter()
    launch = adapter.launch(request)
    # Codex starts late: the steer waits for a turn that never opens.
    slow = replace(launch, argv=["/bin/sh", "-c", 'sleep 30; exec "$@"', "sh", *launch.argv])
    run = LiveRun(adapter, request, launch=slow)
    answer = run.steer(STEER)
    assert answer.answers == []  # held until the turn is open
    assert run.process.stop(grace_seconds=0.5) == []
    finished = run.finish()
    assert answer.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]
    assert finished.outcome.status == OutcomeStatus.FAILED
    assert model_server.requests == []


def test_a_run_stopped_during_a_tool_command_leaves_no_process(
    model_server: ModelServer, tmp_path: Path
) -> None:
    command = "touch started; sleep 30"
    model_server.set_turns([{"tool": {"name": "exec_command", "arguments": {"cmd": command}}}])
    request = _request(tmp_path, model_server)
    run = LiveRun(CodexAdapter(), request)
    _wait_for_file(request.workspace / "started")
    started = time.monotonic()
    assert run.process.stop(grace_seconds=0.5) == []  # the tool's sleep too
    finished = run.finish()  # and checks again that nothing of the run is left
    assert time.monotonic() - started < 5
    assert finished.outcome.status == OutcomeStatus.FAILED


def _open_turn(tmp_path: Path) -> tuple[CodexStreamParser, RecordedStdin]:
    parser = _parser(tmp_path)
    stdin = RecordedStdin()
    parser.attach(stdin)
    parser.feed(STARTED)
    parser.feed(json.dumps({"id": 2, "result": {"turn": {"id": TURN}}}))
    stdin.written = b""
    return parser, stdin


def test_a_steer_waits_for_the_turn_to_open_and_names_it(tmp_path: Path) -> None:
    parser, stdin = _open_turn(tmp_path)
    answer = SteerAnswers()
    parser.steer("more", answer)
    assert stdin.messages() == []  # the turn/start response alone does not open the turn
    parser.feed(TURN_STARTED)
    (sent,) = stdin.messages()
    client_id = sent["params"]["clientUserMessageId"]
    assert sent == {
        "id": 3,
        "method": "turn/steer",
        "params": {
            "threadId": THREAD,
            "expectedTurnId": TURN,
            "clientUserMessageId": client_id,
            "input": [{"type": "text", "text": "more", "text_elements": []}],
        },
    }
    assert answer.answers == []
    parser.feed(json.dumps({"id": 3, "result": {"turnId": TURN}}))
    assert answer.answers == [SteerResult(delivered=True)]
    user_message = {"type": "userMessage", "id": "u1", "clientId": client_id, "content": []}
    parser.feed(json.dumps({"method": "item/started", "params": {"item": user_message}}))
    assert parser.feed(COMPLETED) == [UsageReported(Usage())]  # no lost-steer warning
    parser.finish(exit_code=0, stderr_tail="")
    assert answer.answers == [SteerResult(delivered=True)]


@pytest.mark.parametrize(
    ("answer_line", "refusal"),
    [
        ({"error": {"code": -32600, "message": "no active turn to steer"}}, "finished"),
        (
            {"error": {"code": -32600, "message": "expected active turn id `a` but found `b`"}},
            "finished",
        ),
        ({"error": {"code": -32600, "message": "cannot steer a review turn"}}, "refused"),
    ],
)
def test_a_steer_codex_answers_with_an_error_is_refused(
    answer_line: dict[str, Any], refusal: str, tmp_path: Path
) -> None:
    parser, stdin = _open_turn(tmp_path)
    parser.feed(TURN_STARTED)
    answer = SteerAnswers()
    parser.steer("more", answer)
    parser.feed(json.dumps({"id": 3, **answer_line}))
    assert answer.answers == [SteerResult.refused(SteerRefusal(refusal))]


def test_a_steer_the_turn_ended_without_is_finished_and_stdin_waits_for_its_answer(
    tmp_path: Path,
) -> None:
    parser, stdin = _open_turn(tmp_path)
    parser.feed(TURN_STARTED)
    answer = SteerAnswers()
    parser.steer("more", answer)
    parser.feed(COMPLETED)
    assert not stdin.closed  # the steer's answer is still to come
    parser.feed(json.dumps({"id": 3, "result": {"turnId": TURN}}))
    assert answer.answers == [SteerResult.refused(SteerRefusal.FINISHED)]  # never recorded
    assert stdin.closed
    held = SteerAnswers()
    parser.steer("later", held)
    assert held.answers == [SteerResult.refused(SteerRefusal.FINISHED)]


def test_steers_unanswered_when_the_run_ends_are_not_running(tmp_path: Path) -> None:
    parser, stdin = _open_turn(tmp_path)
    held, sent = SteerAnswers(), SteerAnswers()
    parser.steer("held", held)  # the turn never opened for this one…
    parser.feed(TURN_STARTED)  # …until now: both are sent
    parser.steer("sent", sent)
    assert [message["method"] for message in stdin.messages()] == ["turn/steer"] * 2
    parser.finish(exit_code=-9, stderr_tail="")
    assert held.answers == sent.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_codex_connects_only_to_the_model_endpoint(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"text": "ok"}])
    trace = tmp_path / "connect.trace"
    strace = shutil.which("strace")
    assert strace is not None
    run = _run(
        _request(tmp_path, model_server),
        wrap=[strace, "-f", "-qq", "-e", "trace=connect", "-o", str(trace)],
    )
    assert run.outcome.status == OutcomeStatus.COMPLETED
    port = model_server.url.rsplit(":", 1)[1]
    inet = [line for line in trace.read_text().splitlines() if "AF_INET" in line]
    assert inet, "strace saw no connection at all"
    for line in inet:
        assert f"sin_port=htons({port})" in line and 'inet_addr("127.0.0.1")' in line, line


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="codex-recording-") as scratch:
        record_all(RECORDINGS, Path(scratch), names=sys.argv[1:])
    sys.exit(0)
