"""The Codex CLI adapter: its parser on recorded streams, and the real binary against the stand-in.

Two layers, as EXECUTORS.md §4 asks. The parser tests replay streams the real `codex` 0.163
printed (tests/executors/recordings/codex/*.jsonl) and need no binary. The real-binary tests run
`codex exec` through ExecutorProcess against the `model_server` fixture and assert what the
model received and what the run produced; each would fail if the feature it names broke.

The recordings are re-made with `python -m tests.executors.test_codex_adapter` (it runs the same
scenarios through the adapter). The workspace's temporary path is written as
`/baton/workspace` so the file paths in them are stable; nothing else is edited.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
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
from tests.executors.runs import FinishedRun, of_type
from tests.executors.steering import LiveRun, run_to_end

RECORDINGS = Path(__file__).resolve().parent / "recordings" / "codex"
# vLLM's words (and other OpenAI-compatible servers') for a prompt over the window: no code.
UNTYPED_CONTEXT_MESSAGE = (
    "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
    "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages "
    "or completion."
)
WORKSPACE_PLACEHOLDER = "/baton/workspace"
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
    return run_to_end(adapter, request, launch=launch)


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
            workspace = str(request.workspace)
            lines = [line.replace(workspace, WORKSPACE_PLACEHOLDER) for line in run.lines]
            (directory / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))


def _replay(name: str, state_dir: Path) -> tuple[list[Event], Outcome]:
    parser = CodexStreamParser(workspace=Path(WORKSPACE_PLACEHOLDER), state_dir=state_dir)
    text = (RECORDINGS / f"{name}.jsonl").read_text(encoding="utf-8")
    events: list[Event] = []
    for line in text.splitlines():
        events += parser.feed(line)
    failed = any(json.loads(line)["type"] == "turn.failed" for line in text.splitlines())
    return events, parser.finish(exit_code=1 if failed else 0, stderr_tail="")


# -- parser on recorded streams (no binary) ----------------------------------------------------

T_TEXT = "01a215b6-4fb0-70c2-aaa3-7b54fadd534a"
T_TOOL = "01a215b6-50ba-78d1-8c71-b1952aeaf5f1"
T_PATCH = "01a215b6-526e-73f0-b30c-49daff0e8c9c"
T_FILES = "01a215b6-53c2-7513-a702-6f751f35511b"
T_500 = "01a215b6-54cb-76e1-9c86-761d253b1c81"
T_OVERFLOW = "01a215b6-55a2-7071-9efa-c5ce0bfa49bd"
T_429 = "01a215b6-5683-78a0-bc4a-9f1ed7c24c09"
T_UNTYPED_OVERFLOW = "01a21802-420e-7672-8454-ff49b16c96a8"
T_PROMPT_TOO_LONG = "01a21802-4307-7a52-b893-9c868784771e"
T_UNKNOWN = "01a215b6-5c21-74d1-a7ec-102da845d444"
T_RESUMED = "01a215b6-5d8a-7af1-8e4c-bedd29dd1af6"
HIGH_DEMAND = "We\u2019re currently experiencing high demand, which may cause temporary errors."
OVERFLOW = (
    "Codex ran out of room in the model's context window. Start a new thread or clear earlier "
    "history before retrying."
)
LAST_429 = "exceeded retry limit, last status: 429 Too Many Requests, request id: "
COMMAND_OK = "/bin/bash -lc \"printf 'hi\\\\n' > out.txt\""
COMMAND_EXIT_3 = "/bin/bash -lc 'exit 3'"
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
            ToolStarted("item_0", "shell", COMMAND_OK),
            ToolFinished("item_0", "shell", COMMAND_OK, exit_code=0),
            ToolStarted("item_1", "shell", COMMAND_EXIT_3),
            ToolFinished("item_1", "shell", COMMAND_EXIT_3, exit_code=3, is_error=True),
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
            Warning(f"Reconnecting... 1/1 ({LAST_429}req_standin_51535df9_0032)"),
        ],
        Outcome(
            OutcomeStatus.RETRYABLE,
            error=f"{LAST_429}req_standin_51535df9_0033",
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
STARTED = json.dumps({"type": "thread.started", "thread_id": THREAD})
COMPLETED = json.dumps({"type": "turn.completed", "usage": {}})


def _parser(tmp_path: Path, workspace: Path | None = None) -> CodexStreamParser:
    return CodexStreamParser(workspace=workspace or tmp_path / "ws", state_dir=tmp_path / "state")


def _turn_failed(message: str) -> str:
    return json.dumps({"type": "turn.failed", "error": {"message": message}})


def _error(message: str) -> str:
    return json.dumps({"type": "error", "message": message})


def _completed_item(item: dict[str, Any]) -> str:
    return json.dumps({"type": "item.completed", "item": item})


def test_garbage_and_a_truncated_last_line_are_ignored(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    lines = [
        "",
        "Reading additional input from stdin...",
        "[1, 2]",
        "null",
        '{"type": 7}',
        '{"type":"item.completed","item":"not an object"}',
        '{"type":"item.completed","item":{"type":"agent_message","text":["no"]}}',
        '{"type":"item.completed","item":{"type":"file_change","changes":[1,{"path":3}]}}',
        '{"type":"turn.completed","usage":{"input_tokens":"11","output_tokens":-3}}',
        "[" * 100_000,
        '{"type":"item.completed","item":{"id":"item_9","type":"agent_message","text":"cut',
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
            st.sampled_from(["type", "item", "usage", "text", "changes", "path", "kind", "error"])
            | st.text(max_size=5),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)
codex_lines = st.builds(
    lambda kind, extra: json.dumps({**extra, "type": kind}),
    st.sampled_from(
        ["thread.started", "item.started", "item.completed", "turn.completed", "turn.failed"]
        + ["error"]
    ),
    st.dictionaries(
        st.sampled_from(["item", "usage", "error", "message", "thread_id"]), json_values
    ),
)


@given(
    lines=st.lists(st.text() | json_values.map(json.dumps) | codex_lines, max_size=8),
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
    parser.feed(STARTED)
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
        item = {"id": "item_0", "type": "agent_message", "text": text}
        assert parser.feed(_completed_item(item)) == [MessageCompleted(text)]
    parser.feed(COMPLETED)
    assert parser.finish(exit_code=0, stderr_tail="").final_text == "Found it:\n\n  the answer "


def test_a_top_level_error_is_a_warning_unless_the_turn_fails_with_it(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    assert parser.feed(_error("Falling back from WebSockets")) == []  # held back one line
    assert parser.feed(_error("stream disconnected before completion: boom")) == [
        Warning("Falling back from WebSockets")
    ]
    assert parser.feed(_turn_failed("stream disconnected before completion: boom")) == []
    outcome = parser.finish(exit_code=1, stderr_tail="")
    assert (outcome.status, outcome.error_code) == (
        OutcomeStatus.RETRYABLE,
        ErrorCode.NETWORK_ERROR,
    )


def test_a_final_error_without_turn_failed_is_the_outcomes_error(tmp_path: Path) -> None:
    parser = _parser(tmp_path)
    parser.feed(STARTED)
    parser.feed(_error("unexpected status 401 Unauthorized: Incorrect API key provided."))
    parser.feed(_error("Reconnecting... 1/2 (Connection failed: error sending request)"))
    outcome = parser.finish(exit_code=1, stderr_tail="WARNING: ignored\n")
    assert outcome == Outcome(
        OutcomeStatus.FAILED,
        error="unexpected status 401 Unauthorized: Incorrect API key provided.",
        error_code=ErrorCode.AUTH_ERROR,
        session_id=THREAD,
    )


# Codex 0.163's stderr when resuming a thread it has no rollout for (exit 1, nothing on stdout).
MISSING_SESSION_ERROR = (
    "Error: thread/resume: thread/resume failed: no rollout found for thread id "
    "01a215b2-2186-7321-bff1-8c33f99b981e (code -32600)"
)
MISSING_SESSION_STDERR = (
    "WARNING: proceeding, even though we could not create PATH aliases: Refusing to create "
    'helper binaries under temporary dir "/tmp" (codex_home: AbsolutePathBuf("/tmp/cxhome"))\n'
    f"{MISSING_SESSION_ERROR}\n"
)


def test_a_resume_of_an_unknown_thread_is_a_recognisable_failure(tmp_path: Path) -> None:
    outcome = _parser(tmp_path).finish(exit_code=1, stderr_tail=MISSING_SESSION_STDERR)
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
    error = parser.finish(exit_code=1, stderr_tail="").error
    assert len(error) == MAX_ERROR_CHARS and error.endswith("…")


def test_file_paths_are_workspace_relative_only_inside_it(tmp_path: Path) -> None:
    workspace = tmp_path / "real"
    (workspace / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(workspace)
    parser = _parser(tmp_path, workspace=link)
    changes = [
        {"path": f"{link}/sub/a.txt", "kind": "add"},
        {"path": f"{workspace}/sub/b.txt", "kind": "update"},  # Codex printed the real path
        {"path": f"{workspace}/../elsewhere.txt", "kind": "delete"},
        {"path": "/etc/hosts", "kind": "update"},
        {"path": f"{link}/sub/a.txt", "kind": "rename"},
    ]
    item = {"id": "item_0", "type": "file_change", "changes": changes, "status": "completed"}
    assert parser.feed(_completed_item(item)) == [
        FileChanged("sub/a.txt", "add"),
        FileChanged("sub/b.txt", "update"),
        FileChanged(f"{tmp_path}/elsewhere.txt", "delete"),
        FileChanged("/etc/hosts", "update"),
        FileChanged("sub/a.txt", "update"),  # an unknown kind is still a change
    ]
    assert parser.feed(_completed_item({**item, "id": "item_1", "status": "failed"})) == []
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
        'model_providers.baton.env_key="OPENAI_API_KEY"',
        'model="gpt-5.5"',
        'developer_instructions="Be brief."',
    ]
    assert launch == Launch(
        argv=[
            adapter.locate(),
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--ignore-user-config",
            "--ignore-rules",
            "--dangerously-bypass-approvals-and-sandbox",
            *[part for override in overrides for part in ("-c", override)],
            "-",
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
        stdin="The prompt — 完成".encode(),
    )
    assert (tmp_path / "state" / "home").is_dir()
    assert not any(API_KEY in item or "The prompt" in item for item in launch.argv)


def test_launch_for_a_resume_a_read_only_bot_and_no_key(tmp_path: Path) -> None:
    request = _request(
        tmp_path,
        None,
        api_key=None,
        model="",
        permission_mode="read_only",
        max_turns=3,  # codex exec has no turn limit: ignored
        resume=THREAD.upper(),
    )
    request = replace(request, passthrough_env={"PATH": "/bin", API_KEY_VARIABLE: "inherited"})
    launch = CodexAdapter().launch(request)
    assert launch.argv[1:7] == [
        "exec",
        "resume",
        THREAD,
        "--json",
        "--skip-git-repo-check",
        "--ignore-user-config",
    ]
    config = _config(launch.argv)
    assert config[:2] == ['sandbox_mode="read-only"', 'approval_policy="never"']
    assert "--dangerously-bypass-approvals-and-sandbox" not in launch.argv
    assert 'model_providers.baton.base_url="https://api.openai.com/v1"' in config
    assert not [item for item in config if "env_key" in item or item.startswith("model=")]
    assert API_KEY_VARIABLE not in launch.env
    assert launch.argv[-1] == "-"


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
    assert of_type(run.events, ToolStarted) == [ToolStarted("item_0", "shell", wrapped)]
    assert of_type(run.events, ToolFinished) == [
        ToolFinished("item_0", "shell", wrapped, exit_code=4, is_error=True)
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
    assert second.lines[-1].endswith('"output_tokens":40,"reasoning_output_tokens":10}}')
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
    assert (run.exit_code, run.lines) == (1, [])
    assert (run.outcome.status, run.outcome.error_code) == (
        OutcomeStatus.FAILED,
        ErrorCode.EXECUTOR_ERROR,
    )
    assert is_missing_session(run.outcome)
    assert model_server.requests == []


def test_a_workspace_codex_config_is_ignored(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns([{"text": "ok"}])
    request = _request(tmp_path, model_server)
    (request.workspace / ".codex").mkdir()
    (request.workspace / ".codex" / "config.toml").write_text(
        'developer_instructions = "INJECTED"\n'
    )
    _run(request)
    (call,) = _only_model_calls(model_server, 1)
    assert "INJECTED" not in json.dumps(call.body)


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
    assert (run.exit_code, run.outcome.status, run.outcome.error_code) == (1, status, code)
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
