"""The Claude Code adapter: its parser on recorded streams, and the real binary on the stand-in.

Two layers, as EXECUTORS.md §4 asks. The parser tests replay streams the real `claude` 2.1.332
printed (tests/executors/recordings/claude_code/*.jsonl) and need no binary. The real-binary
tests run `claude -p` through ExecutorProcess, with the parser attached to its stdin as the
worker does (`runs.run_as_worker`, `steering.run_attached`), against the `model_server` fixture
and assert what the model received and what the run produced; each would fail if the feature
it names broke.
Steering is tested both ways: on the real binary (where the steered text lands, when stdin
closes) and line by line on a stand-in stdin (each steer answered once, from any thread).

The recordings are re-made with `python -m tests.executors.test_claude_code_adapter` (it runs
the same scenarios through the adapter). The run's temporary directories are written as
`/baton/workspace`, `/baton/state` and `/baton/tmp` so the paths in them are stable; nothing
else is edited, so the session ids and ports in the tables below change with a re-recording.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executors.adapters.base import (
    MAX_ERROR_CHARS,
    BotConfig,
    ExecutorUnavailable,
    ModelEndpoint,
    RunRequest,
    SteerRefusal,
    SteerResult,
)
from executors.adapters.claude_code import INSTRUCTIONS_FILE, ClaudeCodeAdapter
from executors.adapters.claude_code_stream import (
    ClaudeCodeStreamParser,
    classify_error,
    is_missing_session,
    usage_from_result,
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
from executors.standin import ModelServer
from executors.standin.errors import ANTHROPIC_CONTEXT_MESSAGE
from tests.executors.runs import FinishedRun, of_type, run_as_worker
from tests.executors.steering import AttachedRun, SteerAnswers, run_attached

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = Path(__file__).resolve().parent / "recordings" / "claude_code"
MAX_TOKENS_CONTEXT_MESSAGE = (
    "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease "
    "input length or `max_tokens` and try again"
)
PLACEHOLDERS = {"workspace": "/baton/workspace", "state": "/baton/state", "tmp": "/baton/tmp"}
MODEL = "claude-sonnet-4-5"  # an alias Claude Code knows: an unknown one warns on stderr
API_KEY = "sk-ant-baton-test-key"
RUN_TIMEOUT_SECONDS = 30.0
MISSING_SESSION_ID = "00000000-0000-4000-8000-000000000000"
TEXT_SESSION = "cc396d51-98e3-406e-9c2e-bb8209a1ddae"  # the session of recordings/text.jsonl

# Byte-exact answer: non-ASCII, typographic quotes, a backslash, blank lines, a tab, a trailing
# newline — everything a careless strip or re-encode would change.
FINAL_TEXT = "Résultat — “fertig” ✓ 完成\n\n\tC:\\path \\n not a newline\n  trailing  \n"
INSTRUCTIONS = "Be \"terse\" — très \\ bref.\nSecond line\twith tab; 日本語; 'single' $HOME `x`\n"


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
        base_url = server.url
    return RunRequest(
        prompt=prompt,
        bot=BotConfig(name="test-bot", **{"model": MODEL, **bot}),
        workspace=base / "workspace",
        state_dir=base / "state",
        tmp_dir=base / "tmp",
        endpoint=ModelEndpoint(base_url=base_url, api_key=api_key, max_retries=max_retries),
        resume_session_id=resume,
        passthrough_env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"},
    )


def _run(request: RunRequest) -> FinishedRun:
    """Run Claude Code for `request` as the worker will: ExecutorProcess, the parser attached
    to its stdin, outcome."""
    return run_as_worker(ClaudeCodeAdapter(), request)


def _dead_port_url() -> str:
    """A loopback URL nothing listens on (the port was just free)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- recordings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    turns: list[dict[str, Any]]
    prompt: str = "Say hello."
    bot: dict[str, Any] = field(default_factory=dict)
    resume: str | None = None
    dead_endpoint: bool = False
    # Steered once the first model request arrived; then the file `go` is made in the workspace.
    steer: str | None = None


def _bash(command: str) -> dict[str, Any]:
    return {"tool": {"name": "Bash", "arguments": {"command": command}}}


# No character JSON escapes, so the text can be counted in a request's JSON as it is.
STEER_TEXT = "Also mention the bananas — ✓ steered"
_WAIT_FOR_GO = "while [ ! -f go ]; do sleep 0.05; done; echo went"


SCENARIOS: dict[str, Scenario] = {
    "text": Scenario([{"text": FINAL_TEXT}], bot={"instructions": INSTRUCTIONS}),
    "bash_write": Scenario([_bash("printf 'hi\\n' > out.txt"), {"text": "Wrote out.txt."}]),
    "file_tools": Scenario(
        [
            {
                "tool": {
                    "name": "Write",
                    "arguments": {"file_path": "notes/a.txt", "content": "A\n"},
                }
            },
            {
                "tool": {
                    "name": "Edit",
                    "arguments": {
                        "file_path": "{workspace}/notes/a.txt",
                        "old_string": "A",
                        "new_string": "B",
                    },
                }
            },
            _bash("echo oops >&2; exit 3"),
            {"text": "Done."},
        ]
    ),
    "http_500": Scenario([{"http_status": 500}]),
    "http_529": Scenario([{"http_status": 529}]),
    "http_429": Scenario([{"http_status": 429}]),
    "http_401": Scenario([{"http_status": 401}]),
    "context_overflow": Scenario([{"context_overflow": True}]),
    # Anthropic's other context error: the prompt fits, but not with the output it may write.
    "context_limit_with_max_tokens": Scenario(
        [{"http_status": 400, "message": MAX_TOKENS_CONTEXT_MESSAGE}]
    ),
    "max_turns": Scenario([_bash("echo again")], bot={"max_turns": 1}),
    "missing_session": Scenario([{"text": "unused"}], resume=MISSING_SESSION_ID),
    "connection_refused": Scenario([{"text": "unused"}], dead_endpoint=True),
    # The Task tool starts a background subagent; scripted turns go to whichever of the main
    # loop and the subagent asks first, so the texts say nothing about who said them.
    "background_subagent": Scenario(
        [
            {
                "tool": {
                    "name": "Task",
                    "arguments": {
                        "description": "look",
                        "prompt": "Look around.",
                        "subagent_type": "general-purpose",
                    },
                }
            },
            {"text": "Answer one.", "usage": {"input_tokens": 100, "output_tokens": 50}},
            {
                "text": "Answer two.",
                "usage": {"input_tokens": 30, "output_tokens": 20, "cached_input_tokens": 10},
            },
        ]
    ),
    # Steered while a command waits for `go`: the same turn takes the steer in.
    "steer_during_tool": Scenario(
        [_bash(_WAIT_FOR_GO), {"text": "Bananas mentioned."}], steer=STEER_TEXT
    ),
    # Steered while the turn's last model call answers: a second turn and result follow.
    "steer_during_last_call": Scenario(
        [{"text": "First answer.", "delay_seconds": 1.0}, {"text": "Covers the steer."}],
        steer=STEER_TEXT,
    ),
}


def _record(name: str, scenario: Scenario, server: ModelServer, base: Path) -> None:
    request = _request(
        base,
        server,
        prompt=scenario.prompt,
        resume=scenario.resume,
        base_url=_dead_port_url() if scenario.dead_endpoint else None,
        **scenario.bot,
    )
    workspace = str(request.workspace)
    turns = json.loads(json.dumps(scenario.turns).replace("{workspace}", workspace))
    server.clear()
    server.set_turns(turns)
    run, _ = run_attached(
        ClaudeCodeAdapter(), request, meanwhile=_steering(scenario.steer, server, request)
    )
    # Claude Code also names the workspace by its slug (projects/<slug>/); tool input streamed
    # in pieces may still hold a piece of the scratch path, which nothing reads.
    replacements = [(str(base / part), placeholder) for part, placeholder in PLACEHOLDERS.items()]
    replacements.append((_slug(workspace), _slug(PLACEHOLDERS["workspace"])))
    lines = []
    for line in run.lines:
        for scratch_path, placeholder in replacements:
            line = line.replace(scratch_path, placeholder)
        lines.append(line)
    assert API_KEY not in "".join(lines)
    (RECORDINGS / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))


def _steering(
    text: str | None, server: ModelServer, request: RunRequest
) -> Callable[[AttachedRun], None] | None:
    """What a recorded run does meanwhile: steer `text` once the first model request came,
    wait until it is delivered, then make the file `go` in the workspace."""
    if text is None:
        return None

    def steer(run: AttachedRun) -> None:
        server.wait_for_requests(1)
        answers = SteerAnswers()
        run.parser.steer(text, answers)
        assert answers.wait() == SteerResult(delivered=True)
        (request.workspace / "go").touch()

    return steer


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", path)


def record_all(scratch: Path, names: Sequence[str] = ()) -> None:
    """Re-record every scenario (or only those `names`) with the real binary into RECORDINGS."""
    RECORDINGS.mkdir(parents=True, exist_ok=True)
    with ModelServer() as server:
        for name, scenario in SCENARIOS.items():
            if not names or name in names:
                _record(name, scenario, server, scratch / name)


def _replay(name: str) -> tuple[list[Event], Outcome, ClaudeCodeStreamParser]:
    parser = ClaudeCodeStreamParser(workspace=Path(PLACEHOLDERS["workspace"]))
    text = (RECORDINGS / f"{name}.jsonl").read_text(encoding="utf-8")
    events: list[Event] = []
    for line in text.splitlines():
        events += parser.feed(line)
    failed = any(
        json.loads(line).get("is_error") is True
        for line in text.splitlines()
        if '"type":"result"' in line
    )
    return events, parser.finish(exit_code=1 if failed else 0, stderr_tail=""), parser


# -- the parser on recorded streams (no binary) ------------------------------------------------

# What the parser makes of each recording: every event in order, then the outcome.
EXPECTED: dict[str, tuple[list[Event], Outcome]] = {
    "text": (
        [
            SessionStarted(session_id="cc396d51-98e3-406e-9c2e-bb8209a1ddae"),
            MessageDelta(text="Résultat"),
            MessageDelta(text=" —"),
            MessageDelta(text=" “fertig”"),
            MessageDelta(text=" ✓"),
            MessageDelta(text=" 完成"),
            MessageDelta(text="\n\n\tC:\\path"),
            MessageDelta(text=" \\n"),
            MessageDelta(text=" not"),
            MessageDelta(text=" a"),
            MessageDelta(text=" newline"),
            MessageDelta(text="\n  trailing"),
            MessageDelta(text="  \n"),
            MessageCompleted(text=FINAL_TEXT),
            UsageReported(usage=Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138)),
        ],
        Outcome(
            status=OutcomeStatus.COMPLETED,
            final_text=FINAL_TEXT,
            usage=Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138),
            session_id="cc396d51-98e3-406e-9c2e-bb8209a1ddae",
        ),
    ),
    "bash_write": (
        [
            SessionStarted(session_id="f8700c7f-662c-4df2-bbed-aa6b5952e227"),
            ToolStarted(
                call_id="toolu_standin_a81a3ce9_0003",
                tool="Bash",
                command="printf 'hi\\n' > out.txt",
            ),
            ToolFinished(
                call_id="toolu_standin_a81a3ce9_0003",
                tool="Bash",
                command="printf 'hi\\n' > out.txt",
            ),
            MessageDelta(text="Wrote"),
            MessageDelta(text=" out.txt."),
            MessageCompleted(text="Wrote out.txt."),
            UsageReported(usage=Usage(input_tokens=22, output_tokens=14, cost_usd=0.000276)),
        ],
        Outcome(
            status=OutcomeStatus.COMPLETED,
            final_text="Wrote out.txt.",
            usage=Usage(input_tokens=22, output_tokens=14, cost_usd=0.000276),
            session_id="f8700c7f-662c-4df2-bbed-aa6b5952e227",
            commands=({"command": "printf 'hi\\n' > out.txt", "exit_code": None},),
        ),
    ),
    "file_tools": (
        [
            SessionStarted(session_id="4baa05cf-2f54-4b4f-92c6-42885850c56a"),
            ToolStarted(call_id="toolu_standin_a81a3ce9_0008", tool="Write"),
            ToolFinished(call_id="toolu_standin_a81a3ce9_0008", tool="Write"),
            FileChanged(path="notes/a.txt", change="add"),
            ToolStarted(call_id="toolu_standin_a81a3ce9_0011", tool="Edit"),
            ToolFinished(call_id="toolu_standin_a81a3ce9_0011", tool="Edit"),
            FileChanged(path="notes/a.txt", change="update"),
            ToolStarted(
                call_id="toolu_standin_a81a3ce9_0014", tool="Bash", command="echo oops >&2; exit 3"
            ),
            ToolFinished(
                call_id="toolu_standin_a81a3ce9_0014",
                tool="Bash",
                command="echo oops >&2; exit 3",
                exit_code=3,
                is_error=True,
            ),
            MessageDelta(text="Done."),
            MessageCompleted(text="Done."),
            UsageReported(usage=Usage(input_tokens=44, output_tokens=28, cost_usd=0.000552)),
        ],
        Outcome(
            status=OutcomeStatus.COMPLETED,
            final_text="Done.",
            usage=Usage(input_tokens=44, output_tokens=28, cost_usd=0.000552),
            session_id="4baa05cf-2f54-4b4f-92c6-42885850c56a",
            commands=({"command": "echo oops >&2; exit 3", "exit_code": 3},),
            files_changed=("notes/a.txt",),
        ),
    ),
    "http_500": (
        [
            SessionStarted(session_id="1a41411c-7e20-4d5b-923e-843a53d3887a"),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.RETRYABLE,
            error=(
                "API Error: 500 The server had an error while processing your request. This is a "
                "server-side issue, usually temporary — try again in a moment. If it persists, "
                "check your inference gateway (127.0.0.1:44533)."
            ),
            error_code=ErrorCode.UPSTREAM_ERROR,
            usage=Usage(cost_usd=0.0),
            session_id="1a41411c-7e20-4d5b-923e-843a53d3887a",
        ),
    ),
    "http_529": (
        [
            SessionStarted(session_id="a98921e7-4f46-4889-8193-d7e31bd0927b"),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.RETRYABLE,
            error=(
                "API Error: 529 Overloaded. This is a server-side issue, usually temporary — try "
                "again in a moment. If it persists, check your inference gateway "
                "(127.0.0.1:44533)."
            ),
            error_code=ErrorCode.UPSTREAM_ERROR,
            usage=Usage(cost_usd=0.0),
            session_id="a98921e7-4f46-4889-8193-d7e31bd0927b",
        ),
    ),
    "http_429": (
        [
            SessionStarted(session_id="70c633ae-c174-40a5-bce5-c8ba0aa05c8d"),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.RETRYABLE,
            error="API Error: Request rejected (429) · Rate limit reached. Please try again in 1s.",
            error_code=ErrorCode.RATE_LIMITED,
            usage=Usage(cost_usd=0.0),
            session_id="70c633ae-c174-40a5-bce5-c8ba0aa05c8d",
        ),
    ),
    "http_401": (
        [
            SessionStarted(session_id="a473f121-8914-4d39-aaf2-b9dcd2076bf3"),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.FAILED,
            error="Failed to authenticate. API Error: 401 Incorrect API key provided.",
            error_code=ErrorCode.AUTH_ERROR,
            usage=Usage(cost_usd=0.0),
            session_id="a473f121-8914-4d39-aaf2-b9dcd2076bf3",
        ),
    ),
    "context_overflow": (
        [
            SessionStarted(session_id="3b4c3a97-95be-4f39-bc84-c54fd728f83a"),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.FAILED,
            error=(
                "Prompt is too long · the request is ~250000 tokens (limit 200000) but this "
                "conversation is only ~2597 tokens — the rest is system prompt, tool definitions, "
                "and attachment content. A single-exchange conversation cannot be compacted; "
                "reduce attached files/tools or start with less context."
            ),
            error_code=ErrorCode.CONTEXT_OVERFLOW,
            usage=Usage(cost_usd=0.0),
            session_id="3b4c3a97-95be-4f39-bc84-c54fd728f83a",
        ),
    ),
    "context_limit_with_max_tokens": (
        [
            SessionStarted(session_id="c54687b3-f809-47ba-ba5b-69cc6b3f525a"),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.FAILED,
            error=(
                "Prompt is too long · this conversation is a single exchange and cannot be "
                "compacted — the request size comes mostly from system prompt, tool definitions, "
                "or attachments."
            ),
            error_code=ErrorCode.CONTEXT_OVERFLOW,
            usage=Usage(cost_usd=0.0),
            session_id="c54687b3-f809-47ba-ba5b-69cc6b3f525a",
        ),
    ),
    "max_turns": (
        [
            SessionStarted(session_id="28fa4c82-4c71-46f5-8918-3c961e371caf"),
            ToolStarted(call_id="toolu_standin_a81a3ce9_0024", tool="Bash", command="echo again"),
            ToolFinished(call_id="toolu_standin_a81a3ce9_0024", tool="Bash", command="echo again"),
            UsageReported(usage=Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138)),
        ],
        Outcome(
            status=OutcomeStatus.FAILED,
            error="Reached maximum number of turns (1)",
            error_code=ErrorCode.MAX_TURNS,
            usage=Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138),
            session_id="28fa4c82-4c71-46f5-8918-3c961e371caf",
            commands=({"command": "echo again", "exit_code": None},),
        ),
    ),
    "missing_session": (
        [
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.FAILED,
            error="No conversation found with session ID: 00000000-0000-4000-8000-000000000000",
            error_code=ErrorCode.EXECUTOR_ERROR,
            usage=Usage(cost_usd=0.0),
        ),
    ),
    "connection_refused": (
        [
            SessionStarted(session_id="757c20f8-f927-4c3f-9971-0035469963bd"),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.RETRYABLE,
            error=(
                "API Error: Connection refused — a firewall or proxy may be blocking it "
                "(ECONNREFUSED)"
            ),
            error_code=ErrorCode.NETWORK_ERROR,
            usage=Usage(cost_usd=0.0),
            session_id="757c20f8-f927-4c3f-9971-0035469963bd",
        ),
    ),
    "background_subagent": (
        [
            SessionStarted(session_id="f9ddabbe-bf54-443a-8404-5888cdf21630"),
            ToolStarted(call_id="toolu_standin_a81a3ce9_0027", tool="Task"),
            ToolFinished(call_id="toolu_standin_a81a3ce9_0027", tool="Task"),
            MessageDelta(text="Answer"),
            MessageDelta(text=" one."),
            MessageCompleted(text="Answer one."),
            MessageDelta(text="Answer"),
            MessageDelta(text=" two."),
            MessageCompleted(text="Answer two."),
            UsageReported(
                usage=Usage(
                    input_tokens=171,
                    cached_input_tokens=20,
                    output_tokens=97,
                    cost_usd=0.0019140000000000003,
                )
            ),
            UsageReported(usage=Usage(cost_usd=0.0)),
        ],
        Outcome(
            status=OutcomeStatus.COMPLETED,
            final_text="Answer two.",
            usage=Usage(
                input_tokens=171,
                cached_input_tokens=20,
                output_tokens=97,
                cost_usd=0.0019140000000000003,
            ),
            session_id="f9ddabbe-bf54-443a-8404-5888cdf21630",
        ),
    ),
    # The steer's command_lifecycle frames are Baton's own business: no events.
    "steer_during_tool": (
        [
            SessionStarted(session_id="9157a3a6-ea54-4d11-978d-770e17bf1411"),
            ToolStarted(call_id="toolu_standin_2ccf1a7f_0001", tool="Bash", command=_WAIT_FOR_GO),
            ToolFinished(call_id="toolu_standin_2ccf1a7f_0001", tool="Bash", command=_WAIT_FOR_GO),
            MessageDelta(text="Bananas"),
            MessageDelta(text=" mentioned."),
            MessageCompleted(text="Bananas mentioned."),
            UsageReported(usage=Usage(input_tokens=22, output_tokens=14, cost_usd=0.000276)),
        ],
        Outcome(
            status=OutcomeStatus.COMPLETED,
            final_text="Bananas mentioned.",
            usage=Usage(input_tokens=22, output_tokens=14, cost_usd=0.000276),
            session_id="9157a3a6-ea54-4d11-978d-770e17bf1411",
            commands=({"command": _WAIT_FOR_GO, "exit_code": None},),
        ),
    ),
    # Two turns, two results (a second `init` of the same session): both answers are
    # messages, the last is the run's, and each model call counts once.
    "steer_during_last_call": (
        [
            SessionStarted(session_id="57f3ff80-e9e2-47aa-b3a9-7ad79f3166ea"),
            MessageDelta(text="First"),
            MessageDelta(text=" answer."),
            MessageCompleted(text="First answer."),
            UsageReported(usage=Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138)),
            MessageDelta(text="Covers"),
            MessageDelta(text=" the"),
            MessageDelta(text=" steer."),
            MessageCompleted(text="Covers the steer."),
            UsageReported(usage=Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138)),
        ],
        Outcome(
            status=OutcomeStatus.COMPLETED,
            final_text="Covers the steer.",
            usage=Usage(input_tokens=22, output_tokens=14, cost_usd=0.000276),
            session_id="57f3ff80-e9e2-47aa-b3a9-7ad79f3166ea",
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_stream_gives_exact_events_and_outcome(name: str) -> None:
    events, outcome, _ = _replay(name)
    expected_events, expected_outcome = EXPECTED[name]
    assert events == expected_events
    assert outcome == expected_outcome


def test_every_recording_has_a_table_entry() -> None:
    recorded = {path.stem for path in RECORDINGS.glob("*.jsonl")}
    assert recorded == set(EXPECTED) == set(SCENARIOS)


@pytest.mark.parametrize("name", ["context_overflow", "context_limit_with_max_tokens"])
def test_a_recorded_overflow_is_known_by_its_words_without_the_terminal_reason(name: str) -> None:
    """Claude Code's typed signal (terminal_reason prompt_too_long) may be missing from another
    version's output: its own "Prompt is too long" result still says what happened."""
    parser = ClaudeCodeStreamParser(workspace=Path(PLACEHOLDERS["workspace"]))
    for line in (RECORDINGS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
        message = json.loads(line)
        if message.get("type") == "result":
            assert message.pop("terminal_reason") == "prompt_too_long"
        parser.feed(json.dumps(message))
    outcome = parser.finish(exit_code=1, stderr_tail="")
    assert (outcome.status, outcome.error_code) == (
        OutcomeStatus.FAILED,
        ErrorCode.CONTEXT_OVERFLOW,
    )
    assert outcome.error.startswith("Prompt is too long · ")


def test_text_deltas_add_up_to_the_final_text() -> None:
    events, outcome, _ = _replay("text")
    deltas = "".join(event.text for event in of_type(events, MessageDelta))
    assert deltas == outcome.final_text == FINAL_TEXT


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_only_the_missing_session_recording_is_a_missing_session(name: str) -> None:
    _, outcome, parser = _replay(name)
    expected = name == "missing_session"
    assert parser.missing_session is expected
    assert is_missing_session(outcome) is expected


def test_is_missing_session_reads_outcomes_and_texts() -> None:
    text = f"No conversation found with session ID: {MISSING_SESSION_ID}"
    failed = Outcome(OutcomeStatus.FAILED, error=text, error_code=ErrorCode.EXECUTOR_ERROR)
    assert is_missing_session(failed)
    assert is_missing_session(text)
    assert is_missing_session("Error: --resume requires a valid session ID or session title …")
    # Another code means another cause, whatever the text says.
    assert not is_missing_session(replace(failed, error_code=ErrorCode.UPSTREAM_ERROR))
    assert not is_missing_session(Outcome(OutcomeStatus.COMPLETED, final_text=text))


def test_lines_that_are_not_json_objects_give_no_events() -> None:
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    for line in ["", "not json", "[1, 2]", '"text"', "{", '{"type": "unknown"}', "{" * 100_000]:
        assert parser.feed(line) == []


_JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "subtype",
                    "message",
                    "content",
                    "event",
                    "delta",
                    "text",
                    "is_error",
                    "result",
                    "errors",
                    "usage",
                    "modelUsage",
                    "session_id",
                    "tool_use_id",
                    "id",
                    "name",
                    "input",
                    "tool_use_result",
                    "api_error_status",
                    "error",
                    "num_turns",
                ]
            ),
            children,
            max_size=6,
        )
    ),
    max_leaves=30,
)
_LINE_TYPES = st.sampled_from(["system", "stream_event", "assistant", "user", "result", "x"])


@given(st.lists(st.tuples(_LINE_TYPES, _JSON), max_size=8), st.integers(-9, 2))
def test_any_json_lines_give_events_and_a_bounded_outcome(
    lines: list[tuple[str, Any]], exit_code: int
) -> None:
    """Whatever shapes a future version prints, the parser neither raises nor over-reports."""
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    for kind, body in lines:
        line = {**body, "type": kind} if isinstance(body, dict) else body
        assert all(isinstance(event, Event) for event in parser.feed(json.dumps(line)))
    outcome = parser.finish(exit_code=exit_code, stderr_tail="x" * 10_000)
    assert len(outcome.error) <= MAX_ERROR_CHARS
    assert (outcome.status == OutcomeStatus.COMPLETED) == (outcome.error_code is None)


def test_no_result_line_fails_with_the_bounded_stderr_tail() -> None:
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    parser.feed(json.dumps({"type": "system", "subtype": "init", "session_id": "s-1"}))
    stderr = "early noise\n" * 2000 + "Segmentation fault: the last words"
    outcome = parser.finish(exit_code=-11, stderr_tail=stderr)
    assert outcome.status == OutcomeStatus.FAILED
    assert outcome.error_code == ErrorCode.EXECUTOR_ERROR
    assert outcome.session_id == "s-1"
    assert outcome.error.startswith("Claude Code exited with code -11 without a result: …")
    assert outcome.error.endswith("Segmentation fault: the last words")
    assert len(outcome.error) <= MAX_ERROR_CHARS
    quiet = ClaudeCodeStreamParser(workspace=Path("/w")).finish(exit_code=1, stderr_tail=" \n")
    assert quiet.error == "Claude Code exited with code 1 without a result"


def _result(**fields: Any) -> dict[str, Any]:
    return {"type": "result", "subtype": "success", "is_error": True, **fields}


@pytest.mark.parametrize(
    ("result", "api_error", "code"),
    [
        (_result(api_error_status=500), {"error": "server_error"}, ErrorCode.UPSTREAM_ERROR),
        (_result(api_error_status=529), {"error": "server_error"}, ErrorCode.UPSTREAM_ERROR),
        (_result(), {"error": "overloaded"}, ErrorCode.UPSTREAM_ERROR),
        (_result(api_error_status=429), {"error": "rate_limit"}, ErrorCode.RATE_LIMITED),
        (_result(), {"error": "rate_limit"}, ErrorCode.RATE_LIMITED),
        (_result(api_error_status=401), {"error": "authentication_failed"}, ErrorCode.AUTH_ERROR),
        (_result(api_error_status=403), {"error": "authentication_failed"}, ErrorCode.AUTH_ERROR),
        (_result(), {"error": "authentication_failed"}, ErrorCode.AUTH_ERROR),
        (
            _result(api_error_status=400, terminal_reason="prompt_too_long"),
            {"error": "invalid_request"},
            ErrorCode.CONTEXT_OVERFLOW,
        ),
        (_result(api_error="message_over_context_limit"), None, ErrorCode.CONTEXT_OVERFLOW),
        # The provider's words, with no terminal reason: in the result, or in the API error.
        (
            _result(api_error_status=400, result="Prompt is too long"),
            None,
            ErrorCode.CONTEXT_OVERFLOW,
        ),
        (
            _result(api_error_status=400),
            {
                "error": "invalid_request",
                "message": {
                    "content": [
                        {"type": "text", "text": f"API Error: 400 {ANTHROPIC_CONTEXT_MESSAGE}"}
                    ]
                },
            },
            ErrorCode.CONTEXT_OVERFLOW,
        ),
        # Words about a too long prompt on a 429 are not an overflow: the status decides.
        (_result(api_error_status=429, result="Prompt is too long"), None, ErrorCode.RATE_LIMITED),
        (_result(subtype="error_max_turns"), None, ErrorCode.MAX_TURNS),
        (_result(terminal_reason="max_turns"), None, ErrorCode.MAX_TURNS),
        # A dead port: `error` says server_error, `api_error` says what really happened.
        (
            _result(api_error="connection_failed"),
            {"error": "server_error", "api_error": "connection_failed"},
            ErrorCode.NETWORK_ERROR,
        ),
        (_result(), {"api_error": "stream_idle_timeout"}, ErrorCode.NETWORK_ERROR),
        (_result(api_error_status=400), {"error": "unknown"}, ErrorCode.EXECUTOR_ERROR),
        (_result(api_error_status=404), {"error": "model_not_found"}, ErrorCode.EXECUTOR_ERROR),
        (_result(subtype="error_during_execution"), None, ErrorCode.EXECUTOR_ERROR),
        (_result(api_error_status=True), None, ErrorCode.EXECUTOR_ERROR),  # not a status
    ],
)
def test_classify_error(
    result: dict[str, Any], api_error: dict[str, Any] | None, code: ErrorCode
) -> None:
    assert classify_error(result, api_error) == code


def _finish(*lines: dict[str, Any], exit_code: int = 1) -> Outcome:
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    for line in lines:
        parser.feed(json.dumps(line))
    return parser.finish(exit_code=exit_code, stderr_tail="")


def test_success_is_is_error_false_whatever_the_subtype() -> None:
    # An HTTP 500 came back as subtype "success" with is_error true.
    failed = _finish(_result(api_error_status=500, result="API Error: 500 boom"))
    assert failed.status == OutcomeStatus.RETRYABLE
    assert failed.final_text is None
    assert failed.error == "API Error: 500 boom"
    done = _finish({**_result(subtype="something_new", result="  Answer  "), "is_error": False})
    assert done.status == OutcomeStatus.COMPLETED
    assert done.final_text == "  Answer  "  # exactly as returned, spaces included


def test_error_text_falls_back_to_errors_then_the_api_error_message() -> None:
    errors = _finish(_result(result=None, errors=["first", "", "second"]))
    assert errors.error == "first\nsecond"
    synthetic = {
        "type": "assistant",
        "error": "unknown",
        "is_api_error_message": True,
        "message": {"content": [{"type": "text", "text": "API Error: 418 teapot"}]},
    }
    assert _finish(synthetic, _result(result="")).error == "API Error: 418 teapot"
    assert _finish(_result(subtype="odd")).error == (
        "Claude Code reported an error (subtype odd, exit code 1)"
    )
    long = _finish(_result(result="x" * 100_000))
    assert len(long.error) == MAX_ERROR_CHARS and long.error.endswith("…")


def test_the_api_error_message_is_not_an_answer() -> None:
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    synthetic = {
        "type": "assistant",
        "error": "server_error",
        "is_api_error_message": True,
        "message": {"content": [{"type": "text", "text": "API Error: 500"}]},
    }
    assert parser.feed(json.dumps(synthetic)) == []


@pytest.mark.parametrize(
    ("result", "usage"),
    [
        # modelUsage: every model of the process (subagents included), Anthropic's meanings.
        (
            {
                "total_cost_usd": 0.5,
                "usage": {"input_tokens": 1, "output_tokens": 1},
                "modelUsage": {
                    "claude-sonnet-4-5": {
                        "inputTokens": 100,
                        "cacheReadInputTokens": 40,
                        "cacheCreationInputTokens": 10,
                        "outputTokens": 20,
                        "thinkingTokens": 5,
                    },
                    "claude-haiku-4-5": {"inputTokens": 7, "outputTokens": 3},
                },
            },
            Usage(
                input_tokens=157,
                cached_input_tokens=40,
                cache_write_input_tokens=10,
                output_tokens=23,
                reasoning_tokens=5,
                cost_usd=0.5,
            ),
        ),
        # Without modelUsage: `usage`.
        (
            {
                "total_cost_usd": 1,
                "usage": {
                    "input_tokens": 11,
                    "cache_read_input_tokens": 4,
                    "cache_creation_input_tokens": 2,
                    "output_tokens": 7,
                    "output_tokens_details": {"thinking_tokens": 3},
                },
            },
            Usage(
                input_tokens=17,
                cached_input_tokens=4,
                cache_write_input_tokens=2,
                output_tokens=7,
                reasoning_tokens=3,
                cost_usd=1.0,
            ),
        ),
        # Nothing usable: zeros, and no cost rather than a made-up one.
        ({"usage": "nonsense", "total_cost_usd": "1"}, Usage()),
        ({"modelUsage": {"m": {"inputTokens": -5, "outputTokens": True}}}, Usage()),
    ],
)
def test_usage_from_result(result: dict[str, Any], usage: Usage) -> None:
    assert usage_from_result(result) == usage


def _tool_round(name: str, arguments: dict[str, Any], **result: Any) -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": f"call-{name}", "name": name, "input": arguments}
    block = {"type": "tool_result", "tool_use_id": f"call-{name}", "content": "ok", **result}
    return [
        {"type": "assistant", "parent_tool_use_id": None, "message": {"content": [use]}},
        {"type": "user", "message": {"content": [block]}},
    ]


@pytest.mark.parametrize(
    ("file_path", "expected"),
    [
        ("/work/ws/src/a.py", "src/a.py"),
        ("src/./b.py", "src/b.py"),  # relative paths are from the workspace (the cwd)
        ("/work/ws/../other/c.py", "/work/other/c.py"),
        ("../d.py", "/work/d.py"),
        ("/etc/hosts", "/etc/hosts"),
    ],
)
def test_file_changes_are_relative_to_the_workspace_when_inside(
    file_path: str, expected: str
) -> None:
    parser = ClaudeCodeStreamParser(workspace=Path("/work/ws/"))
    events: list[Event] = []
    for line in _tool_round("Edit", {"file_path": file_path}):
        events += parser.feed(json.dumps(line))
    assert of_type(events, FileChanged) == [FileChanged(path=expected, change="update")]


def test_a_refused_write_changes_no_file() -> None:
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    events: list[Event] = []
    for line in _tool_round("Write", {"file_path": "/w/x", "content": ""}, is_error=True):
        events += parser.feed(json.dumps(line))
    assert of_type(events, FileChanged) == []
    assert parser.finish(exit_code=1, stderr_tail="").files_changed == ()


def test_subagent_text_is_not_a_message_but_its_tools_are_reported() -> None:
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    inner = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
    line = {
        "type": "assistant",
        "parent_tool_use_id": "task-1",
        "message": {"content": [{"type": "text", "text": "sub"}, inner]},
    }
    assert parser.feed(json.dumps(line)) == [ToolStarted(call_id="t1", tool="Bash", command="ls")]
    delta = {
        "type": "stream_event",
        "parent_tool_use_id": "task-1",
        "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "s"}},
    }
    assert parser.feed(json.dumps(delta)) == []


# -- steering, line by line (no binary) --------------------------------------------------------


class _Stdin:
    """A run's stdin as the parser sees it: what was written, and whether it was closed."""

    def __init__(self, *, open_: bool = True) -> None:
        self.lines: list[dict[str, Any]] = []
        self.closed = 0
        self._open = open_

    def write_stdin(self, data: bytes) -> bool:
        if not self._open:
            return False
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        self.lines.append(json.loads(data))
        return True

    def close_stdin(self) -> None:
        self.closed += 1
        self._open = False


def _lifecycle(command_uuid: str, state: str) -> str:
    return json.dumps({"type": "command_lifecycle", "command_uuid": command_uuid, "state": state})


def _attached() -> tuple[ClaudeCodeStreamParser, _Stdin]:
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    stdin = _Stdin()
    parser.attach(stdin)
    return parser, stdin


def test_a_steer_is_a_user_message_delivered_when_claude_code_queues_it() -> None:
    parser, stdin = _attached()
    answers = SteerAnswers()
    parser.steer("Also this — ✓", answers)
    [line] = stdin.lines
    assert line == {
        "type": "user",
        "message": {"role": "user", "content": "Also this — ✓"},
        "parent_tool_use_id": None,
        "session_id": "",
        "uuid": line["uuid"],
    }
    assert answers.answers == []
    assert parser.feed(_lifecycle("another-uuid", "queued")) == []
    assert answers.answers == []
    assert parser.feed(_lifecycle(line["uuid"], "queued")) == []
    # Claude Code repeats `queued` after an interrupt; `started` and `completed` follow.
    for state in ("queued", "started", "completed"):
        parser.feed(_lifecycle(line["uuid"], state))
    assert answers.answers == [SteerResult(delivered=True)]


@pytest.mark.parametrize("state", ["cancelled", "discarded", "refused"])
def test_a_steer_claude_code_drops_is_refused(state: str) -> None:
    parser, stdin = _attached()
    answers = SteerAnswers()
    parser.steer("x", answers)
    parser.feed(_lifecycle(stdin.lines[0]["uuid"], state))
    assert answers.answers == [SteerResult.refused(SteerRefusal.REFUSED)]
    # Dropped, it starts no turn: the next result is the last.
    parser.feed(json.dumps(_result(is_error=False)))
    assert stdin.closed == 1


def test_stdin_closes_after_the_result_no_steer_waits_for() -> None:
    parser, stdin = _attached()
    answers = SteerAnswers()
    parser.steer("late", answers)
    steer_uuid = stdin.lines[0]["uuid"]
    parser.feed(_lifecycle(steer_uuid, "queued"))
    # The steer came too late for this turn: a turn of its own and its result follow.
    parser.feed(json.dumps(_result(is_error=False, result="First.")))
    assert stdin.closed == 0
    parser.feed(_lifecycle(steer_uuid, "started"))
    parser.feed(json.dumps(_result(is_error=False, result="Second.")))
    assert stdin.closed == 1
    finished = SteerAnswers()
    parser.steer("after the end", finished)
    assert finished.answers == [SteerResult.refused(SteerRefusal.FINISHED)]
    assert len(stdin.lines) == 1  # nothing written after the last result
    outcome = parser.finish(exit_code=0, stderr_tail="")
    assert outcome.final_text == "Second."
    assert answers.answers == [SteerResult(delivered=True)]


def test_the_recorded_text_run_closes_stdin_at_its_result() -> None:
    parser, stdin = _attached()
    lines = (RECORDINGS / "text.jsonl").read_text(encoding="utf-8").splitlines()
    for line in lines[:-1]:
        parser.feed(line)
    assert stdin.closed == 0
    parser.feed(lines[-1])
    assert json.loads(lines[-1])["type"] == "result" and stdin.closed == 1


def test_steers_the_run_never_took_are_not_running_once_at_the_end() -> None:
    parser, stdin = _attached()
    unconfirmed, delivered = SteerAnswers(), SteerAnswers()
    parser.steer("one", unconfirmed)
    parser.steer("two", delivered)
    parser.feed(_lifecycle(stdin.lines[1]["uuid"], "queued"))
    parser.finish(exit_code=-9, stderr_tail="")
    assert unconfirmed.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]
    assert delivered.answers == [SteerResult(delivered=True)]
    parser.feed(_lifecycle(stdin.lines[0]["uuid"], "queued"))  # too late to count
    assert unconfirmed.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]
    after = SteerAnswers()
    parser.steer("three", after)
    assert after.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]


def test_a_steer_without_an_open_stdin_is_not_running() -> None:
    unattached = SteerAnswers()
    ClaudeCodeStreamParser(workspace=Path("/w")).steer("x", unattached)
    assert unattached.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]
    parser = ClaudeCodeStreamParser(workspace=Path("/w"))
    parser.attach(_Stdin(open_=False))  # the process exited and closed it
    closed = SteerAnswers()
    parser.steer("x", closed)
    assert closed.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]


def test_each_of_many_concurrent_steers_is_answered_once() -> None:
    parser, stdin = _attached()
    answers = [SteerAnswers() for _ in range(200)]
    steering = [
        threading.Thread(target=parser.steer, args=(f"steer {index}", answer))
        for index, answer in enumerate(answers)
    ]
    for thread in steering:
        thread.start()
    # Meanwhile the run's thread takes in whatever was written so far, and the run ends.
    queued = 0
    while any(thread.is_alive() for thread in steering) or queued < len(stdin.lines):
        for line in stdin.lines[queued:]:
            parser.feed(_lifecycle(line["uuid"], "queued"))
            queued += 1
    for thread in steering:
        thread.join()
    parser.feed(json.dumps(_result(is_error=False)))
    parser.finish(exit_code=0, stderr_tail="")
    assert [len(answer.answers) for answer in answers] == [1] * len(answers)
    assert all(answer.answers[0].delivered for answer in answers)
    assert len({line["uuid"] for line in stdin.lines}) == len(answers)


# -- launch (no binary) ------------------------------------------------------------------------

FAKE_BINARY = "/opt/claude/_bundled/claude"


@pytest.fixture
def adapter(monkeypatch: pytest.MonkeyPatch) -> ClaudeCodeAdapter:
    monkeypatch.setattr("executors.adapters.claude_code._bundled_binary", lambda: FAKE_BINARY)
    return ClaudeCodeAdapter()


def test_launch_full_access(adapter: ClaudeCodeAdapter, tmp_path: Path) -> None:
    request = _request(
        tmp_path,
        None,
        prompt="the prompt ✓",
        base_url="http://127.0.0.1:9/v1/",
        max_retries=3,
        instructions=INSTRUCTIONS,
        max_turns=7,
        resume="11111111-2222-4333-8444-555555555555",
    )
    request = replace(
        request,
        passthrough_env={"PATH": "/bin", "ANTHROPIC_API_KEY": "inherited", "TZ": "UTC"},
    )
    launch = adapter.launch(request)
    instructions = str(tmp_path / "tmp" / INSTRUCTIONS_FILE)
    assert launch.argv == [
        FAKE_BINARY,
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--setting-sources",
        "",
        "--system-prompt-snapshot",
        "off",
        "--permission-mode",
        "bypassPermissions",
        "--model",
        MODEL,
        "--append-system-prompt-file",
        instructions,
        "--max-turns",
        "7",
        "--resume",
        "11111111-2222-4333-8444-555555555555",
    ]
    assert Path(instructions).read_text(encoding="utf-8") == INSTRUCTIONS
    expected_env = {
        "PATH": "/bin",
        "TZ": "UTC",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # Claude Code appends /v1/messages
        "ANTHROPIC_API_KEY": API_KEY,
        "CLAUDE_CONFIG_DIR": str(tmp_path / "state"),
        "HOME": str(tmp_path / "state" / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "3",
    }
    if os.geteuid() == 0:
        expected_env["IS_SANDBOX"] = "1"
    assert launch.env == expected_env
    assert (tmp_path / "state" / "home").is_dir()
    assert launch.cwd == tmp_path / "workspace"
    # The prompt is the first stream-json user message; stdin stays open for steers.
    assert (
        launch.stdin
        == (
            '{"type": "user", "message": {"role": "user", "content": "the prompt ✓"}, '
            '"parent_tool_use_id": null, "session_id": ""}\n'
        ).encode()
    )
    assert launch.interactive and adapter.steerable
    argv = " ".join(launch.argv)
    assert "the prompt" not in argv and API_KEY not in argv and "terse" not in argv


def test_launch_read_only_minimal(adapter: ClaudeCodeAdapter, tmp_path: Path) -> None:
    request = _request(
        tmp_path, None, model="", permission_mode="read_only", base_url="", api_key=None
    )
    launch = adapter.launch(request)
    assert launch.argv[12:] == ["--permission-mode", "dontAsk", "--tools", "Read,Glob,Grep"]
    for absent in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "IS_SANDBOX"):
        assert absent not in launch.env
    assert list((tmp_path / "tmp").iterdir()) == []  # no instructions, no file


def test_launch_refuses_an_unknown_permission_mode(
    adapter: ClaudeCodeAdapter, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="unknown permission mode"):
        adapter.launch(_request(tmp_path, None, permission_mode="yolo"))


def test_locate_without_the_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ExecutorUnavailable, match=r"pip install 'baton\[executors\]'"):
        ClaudeCodeAdapter().locate()


@pytest.mark.e2e
def test_locate_finds_the_binary_without_importing_the_sdk() -> None:
    script = (
        "import sys\n"
        "from executors.adapters.claude_code import ClaudeCodeAdapter\n"
        "print(ClaudeCodeAdapter().locate())\n"
        "assert 'claude_agent_sdk' not in sys.modules\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    path = Path(found.stdout.strip())
    assert path.name == "claude" and path.parent.name == "_bundled"
    assert os.access(path, os.X_OK)


# -- the real binary against the stand-in --------------------------------------------------------

e2e = pytest.mark.e2e


def _text_blocks(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [block["text"] for block in content if block.get("type") == "text"]


def _first_user_prompt(server: ModelServer) -> str:
    """The prompt as the model got it: the last text block of the first request's first user
    message (the blocks before it are Claude Code's <system-reminder>s)."""
    body = server.model_requests()[0].body
    first_user = next(message for message in body["messages"] if message["role"] == "user")
    return _text_blocks(first_user)[-1]


@e2e
def test_final_text_is_byte_exact(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns([{"text": FINAL_TEXT}])
    run = _run(_request(tmp_path, model_server, prompt="Say it exactly."))
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    assert run.outcome.final_text == FINAL_TEXT
    assert "".join(event.text for event in of_type(run.events, MessageDelta)) == FINAL_TEXT
    assert run.events[0] == SessionStarted(session_id=run.outcome.session_id)
    assert _first_user_prompt(model_server) == "Say it exactly."
    # One model call and nothing else: no telemetry, no `HEAD /api/hello`.
    assert [(r.method, r.path) for r in model_server.requests] == [("POST", "/v1/messages")]
    request = model_server.requests[0]
    assert request.headers["x-api-key"] == API_KEY
    assert request.headers["x-claude-code-session-id"] == run.outcome.session_id


@e2e
def test_prompt_over_200_kib_reaches_the_model_intact(
    model_server: ModelServer, tmp_path: Path
) -> None:
    prompt = "".join(chr(0x4E00 + (index * 7919) % 20_000) for index in range(70_000)) + "\n終"
    assert len(prompt.encode("utf-8")) > 200_000
    model_server.set_turns([{"text": "Read it."}])
    run = _run(_request(tmp_path, model_server, prompt=prompt))
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    assert _first_user_prompt(model_server) == prompt


@e2e
def test_instructions_and_model_reach_the_request(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"text": "ok"}])
    run = _run(_request(tmp_path, model_server, instructions=INSTRUCTIONS, model=MODEL))
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    body = model_server.model_requests()[0].body
    assert body["model"] == MODEL
    system = body["system"]
    # Appended to Claude Code's own (long, tool-teaching) system prompt, not replacing it.
    assert system[-1]["text"].endswith(INSTRUCTIONS)
    assert len(system[-1]["text"]) > 10 * len(INSTRUCTIONS)
    assert "terse" not in json.dumps(body["messages"])


@e2e
def test_bash_tool_runs_in_the_workspace(model_server: ModelServer, tmp_path: Path) -> None:
    command = "printf 'hi\\n' > out.txt && pwd > where.txt"
    model_server.set_turns([_bash(command), {"text": "Wrote out.txt."}])
    run = _run(_request(tmp_path, model_server))
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    workspace = tmp_path / "workspace"
    assert (workspace / "out.txt").read_text() == "hi\n"
    assert (workspace / "where.txt").read_text().strip() == str(workspace)
    started = of_type(run.events, ToolStarted)
    finished = of_type(run.events, ToolFinished)
    assert started == [ToolStarted(call_id=started[0].call_id, tool="Bash", command=command)]
    assert finished == [ToolFinished(call_id=started[0].call_id, tool="Bash", command=command)]
    assert run.outcome.commands == ({"command": command, "exit_code": None},)
    assert run.outcome.final_text == "Wrote out.txt."


@e2e
def test_read_only_refuses_writes_and_commands_but_reads(
    model_server: ModelServer, tmp_path: Path
) -> None:
    request = _request(tmp_path, model_server, permission_mode="read_only")
    data = request.workspace / "data.txt"
    data.write_text("the secret is 42\n")
    write = {"file_path": str(request.workspace / "w2.txt"), "content": "y"}
    model_server.set_turns(
        [
            _bash("echo x > w.txt"),
            {"tool": {"name": "Write", "arguments": write}},
            {"tool": {"name": "Read", "arguments": {"file_path": str(data)}}},
            {"text": "Read it."},
        ]
    )
    run = _run(request)
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    assert sorted(path.name for path in request.workspace.iterdir()) == ["data.txt"]
    finished = {event.tool: event for event in of_type(run.events, ToolFinished)}
    assert finished["Bash"].is_error and finished["Write"].is_error
    assert not finished["Read"].is_error
    assert run.outcome.files_changed == ()
    tool_results = json.dumps(model_server.model_requests()[-1].body["messages"])
    assert "No such tool available: Bash" in tool_results
    assert "the secret is 42" in tool_results


@e2e
def test_settings_in_the_workspace_are_ignored(model_server: ModelServer, tmp_path: Path) -> None:
    request = _request(tmp_path, model_server)
    settings = {
        # Would send the API key to another host, and run a command at session start.
        "env": {"ANTHROPIC_BASE_URL": _dead_port_url()},
        "hooks": {
            "SessionStart": [{"hooks": [{"type": "command", "command": "touch hooked.txt"}]}]
        },
    }
    (request.workspace / ".claude").mkdir()
    (request.workspace / ".claude" / "settings.json").write_text(json.dumps(settings))
    model_server.set_turns([{"text": "ok"}])
    run = _run(request)
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    assert len(model_server.model_requests()) == 1
    assert not (request.workspace / "hooked.txt").exists()


@e2e
def test_settings_and_instructions_in_the_config_dir_are_ignored(
    model_server: ModelServer, tmp_path: Path
) -> None:
    # What a tool command can write into CLAUDE_CONFIG_DIR, even in the run that reads it.
    request = _request(tmp_path, model_server)
    settings = {
        # Would send the API key to another host, and run a command at session start.
        "env": {"ANTHROPIC_BASE_URL": _dead_port_url()},
        "hooks": {
            "SessionStart": [{"hooks": [{"type": "command", "command": "touch hooked.txt"}]}]
        },
    }
    (request.state_dir / "settings.json").write_text(json.dumps(settings))
    (request.state_dir / "CLAUDE.md").write_text("PLANTED-USER-INSTRUCTIONS\n")
    model_server.set_turns([{"text": "ok"}])
    run = _run(request)
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    assert len(model_server.model_requests()) == 1
    assert "PLANTED-USER-INSTRUCTIONS" not in json.dumps(model_server.model_requests()[0].body)
    assert not (request.workspace / "hooked.txt").exists()


@e2e
@pytest.mark.parametrize(
    ("turns", "bot", "status", "code"),
    [
        ([{"http_status": 500}], {}, OutcomeStatus.RETRYABLE, ErrorCode.UPSTREAM_ERROR),
        ([{"http_status": 529}], {}, OutcomeStatus.RETRYABLE, ErrorCode.UPSTREAM_ERROR),
        ([{"http_status": 429}], {}, OutcomeStatus.RETRYABLE, ErrorCode.RATE_LIMITED),
        ([{"context_overflow": True}], {}, OutcomeStatus.FAILED, ErrorCode.CONTEXT_OVERFLOW),
        ([{"http_status": 401}], {}, OutcomeStatus.FAILED, ErrorCode.AUTH_ERROR),
        ([{"http_status": 403}], {}, OutcomeStatus.FAILED, ErrorCode.AUTH_ERROR),
        ([_bash("true")], {"max_turns": 1}, OutcomeStatus.FAILED, ErrorCode.MAX_TURNS),
    ],
    ids=["500", "529", "429", "context_overflow", "401", "403", "max_turns"],
)
def test_failures_map_to_status_and_code(
    model_server: ModelServer,
    tmp_path: Path,
    turns: list[dict[str, Any]],
    bot: dict[str, Any],
    status: OutcomeStatus,
    code: ErrorCode,
) -> None:
    model_server.set_turns(turns)
    run = _run(_request(tmp_path, model_server, **bot))
    assert run.exit_code == 1
    assert (run.outcome.status, run.outcome.error_code) == (status, code), run.outcome.error
    assert run.outcome.error and run.outcome.final_text is None


@e2e
def test_connection_refused_is_a_network_error(tmp_path: Path) -> None:
    run = _run(_request(tmp_path, None, base_url=_dead_port_url()))
    assert (run.outcome.status, run.outcome.error_code) == (
        OutcomeStatus.RETRYABLE,
        ErrorCode.NETWORK_ERROR,
    )
    assert "ECONNREFUSED" in run.outcome.error


@e2e
def test_usage_and_cost(model_server: ModelServer, tmp_path: Path) -> None:
    scripted = {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 20}
    model_server.set_turns(
        [{**_bash("true"), "usage": scripted}, {"text": "Done.", "usage": scripted}]
    )
    run = _run(_request(tmp_path, model_server))
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    usage = run.outcome.usage
    assert usage is not None and usage.cost_usd is not None
    # Two calls of 100 input tokens (40 of them read from the cache) and 20 output tokens.
    assert replace(usage, cost_usd=None) == Usage(
        input_tokens=200, cached_input_tokens=80, output_tokens=40
    )
    result = json.loads(run.lines[-1])
    assert usage.cost_usd == result["total_cost_usd"] > 0
    assert of_type(run.events, UsageReported) == [UsageReported(usage=usage)]


@e2e
def test_background_subagent_calls_are_counted(model_server: ModelServer, tmp_path: Path) -> None:
    scenario = SCENARIOS["background_subagent"]
    model_server.set_turns(scenario.turns)
    run = _run(_request(tmp_path, model_server))
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    calls = model_server.model_requests()
    answered = [call.turn_index for call in calls]
    # The Task call (11 in, 7 out), "Answer one." (100/50), then "Answer two." for each other
    # call (30 in of which 10 cached, 20 out): whoever asked, every call counts.
    assert answered[0] == 0 and sorted(answered[1:]) == [1] + [2] * (len(calls) - 2)
    extra = len(calls) - 2
    assert replace(run.outcome.usage, cost_usd=None) == Usage(
        input_tokens=111 + 30 * extra,
        cached_input_tokens=10 * extra,
        output_tokens=57 + 20 * extra,
    )
    reported = of_type(run.events, UsageReported)
    assert sum(event.usage.input_tokens for event in reported) == run.outcome.usage.input_tokens


@e2e
def test_resume_keeps_the_session(model_server: ModelServer, tmp_path: Path) -> None:
    model_server.set_turns([{"text": "First answer."}])
    first = _run(
        _request(tmp_path / "run1", model_server, prompt="First prompt.", instructions="Rule A.")
    )
    assert first.outcome.status == OutcomeStatus.COMPLETED, first.outcome.error
    session_id = first.outcome.session_id
    # The same state dir and workspace (this worker's), a fresh tmp dir for the new run.
    second_request = replace(
        _request(
            tmp_path / "run1",
            model_server,
            prompt="Second prompt.",
            resume=session_id,
            instructions="Rule B.",  # the bot's instructions were edited between the turns
        ),
        tmp_dir=tmp_path / "run2-tmp",
    )
    second_request.tmp_dir.mkdir()
    model_server.clear()
    model_server.set_turns([{"text": "Second answer."}])
    second = _run(second_request)
    assert second.outcome.status == OutcomeStatus.COMPLETED, second.outcome.error
    assert second.outcome.session_id == session_id
    assert second.events[0] == SessionStarted(session_id=session_id)
    body = model_server.model_requests()[0].body
    history = json.dumps(body["messages"], ensure_ascii=False)
    assert "First prompt." in history and "First answer." in history
    # The current instructions, not the ones the session started with.
    assert body["system"][-1]["text"].endswith("Rule B.")
    assert "Rule A." not in json.dumps(body["system"])
    assert second.outcome.final_text == "Second answer."


@e2e
def test_resuming_an_unknown_session_is_recognised(
    model_server: ModelServer, tmp_path: Path
) -> None:
    run = _run(_request(tmp_path, model_server, resume=str(uuid.uuid4())))
    assert (run.outcome.status, run.outcome.error_code) == (
        OutcomeStatus.FAILED,
        ErrorCode.EXECUTOR_ERROR,
    )
    assert is_missing_session(run.outcome)
    assert run.outcome.session_id == ""
    assert model_server.model_requests() == []


# -- steering the running turn -----------------------------------------------------------------


def _result_lines(run: FinishedRun) -> list[dict[str, Any]]:
    messages = [json.loads(line) for line in run.lines if line.startswith("{")]
    return [message for message in messages if message.get("type") == "result"]


def _times_carried(server: ModelServer, text: str) -> list[int]:
    """How often each model request's messages hold `text`."""
    return [
        json.dumps(request.body["messages"], ensure_ascii=False).count(text)
        for request in server.model_requests()
    ]


@e2e
def test_a_steer_during_a_tool_call_reaches_the_next_model_request_of_the_turn(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([_bash(_WAIT_FOR_GO), {"text": "Bananas mentioned."}])
    request = _request(tmp_path, model_server)
    answers = SteerAnswers()

    def steer_while_the_command_waits(run: AttachedRun) -> None:
        model_server.wait_for_requests(1)
        run.parser.steer(STEER_TEXT, answers)
        # Delivered while the command still waits: Claude Code queued it, it did not answer it.
        assert answers.wait() == SteerResult(delivered=True)
        assert len(model_server.model_requests()) == 1
        (request.workspace / "go").touch()

    run, parser = run_attached(
        ClaudeCodeAdapter(), request, meanwhile=steer_while_the_command_waits
    )
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    assert run.outcome.final_text == "Bananas mentioned."
    assert run.exit_code == 0
    assert answers.answers == [SteerResult(delivered=True)]
    # The same turn: one result, and the request after the command carries the steer once,
    # beside the command's output in its tool result.
    assert [result["num_turns"] for result in _result_lines(run)] == [2]
    assert _times_carried(model_server, STEER_TEXT) == [0, 1]
    tool_result = model_server.model_requests()[1].body["messages"][-1]["content"][0]
    assert tool_result["type"] == "tool_result"
    assert tool_result["content"].startswith("went\n")
    assert f"\n{STEER_TEXT}\n" in tool_result["content"]
    finished = SteerAnswers()
    parser.steer("Too late.", finished)
    assert finished.answers == [SteerResult.refused(SteerRefusal.FINISHED)]


@e2e
def test_a_steer_during_the_last_model_call_is_answered_by_a_turn_of_its_own(
    model_server: ModelServer, tmp_path: Path
) -> None:
    slow = 1.0  # seconds each of the first two answers takes: time to steer during them
    model_server.set_turns(
        [
            {"text": "First answer.", "delay_seconds": slow},
            {"text": "Covers the steer.", "delay_seconds": slow},
            {"text": "Covers both steers."},
        ]
    )
    first, second = SteerAnswers(), SteerAnswers()

    def steer_while_the_model_answers(run: AttachedRun) -> None:
        model_server.wait_for_requests(1)
        run.parser.steer(STEER_TEXT, first)
        assert first.wait() == SteerResult(delivered=True)
        # The turn the first steer started runs after a result: stdin is still open for more.
        model_server.wait_for_requests(2)
        run.parser.steer("And the cherries.", second)
        assert second.wait() == SteerResult(delivered=True)

    run, _ = run_attached(
        ClaudeCodeAdapter(),
        _request(tmp_path, model_server),
        meanwhile=steer_while_the_model_answers,
    )
    assert run.outcome.status == OutcomeStatus.COMPLETED, run.outcome.error
    assert first.answers == second.answers == [SteerResult(delivered=True)]
    # A result for each turn; the run's answer is the last one's.
    assert [result["result"] for result in _result_lines(run)] == [
        "First answer.",
        "Covers the steer.",
        "Covers both steers.",
    ]
    assert run.outcome.final_text == "Covers both steers."
    assert run.exit_code == 0
    assert _times_carried(model_server, STEER_TEXT) == [0, 1, 1]
    assert _times_carried(model_server, "And the cherries.") == [0, 0, 1]
    steered = model_server.model_requests()[1].body["messages"][-1]
    assert (steered["role"], _text_blocks(steered)[-1]) == ("user", STEER_TEXT)
    # Every model call (11 in, 7 out each) counted once.
    three_calls = Usage(input_tokens=33, output_tokens=21, cost_usd=0.000414)
    assert run.outcome.usage == three_calls
    reported = of_type(run.events, UsageReported)
    assert sum(event.usage.input_tokens for event in reported) == 33


@e2e
def test_a_steer_the_stopped_run_never_took_is_not_running_once(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([_bash("sleep 30"), {"text": "unused"}])
    answers = SteerAnswers()

    def steer_then_stop(run: AttachedRun) -> None:
        model_server.wait_for_requests(1)
        # Claude Code cannot read stdin while stopped: the steer stays unconfirmed.
        os.kill(run.process.pid, signal.SIGSTOP)
        run.parser.steer(STEER_TEXT, answers)
        time.sleep(0.3)
        assert answers.answers == []
        run.process.stop(grace_seconds=0)

    run, parser = run_attached(
        ClaudeCodeAdapter(), _request(tmp_path, model_server), meanwhile=steer_then_stop
    )
    assert run.outcome.status == OutcomeStatus.FAILED
    assert answers.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]
    after = SteerAnswers()
    parser.steer(STEER_TEXT, after)
    assert after.answers == [SteerResult.refused(SteerRefusal.NOT_RUNNING)]
    assert _times_carried(model_server, STEER_TEXT) == [0]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="claude-recording-") as scratch:
        record_all(Path(scratch), names=sys.argv[1:])
    sys.exit(0)


# -- usage across resumes ----------------------------------------------------------------------


def _resumed_result_lines(turns: int) -> list[str]:
    """The recorded text run as Claude Code prints its `turns`-th turn of one session: after
    `--resume` it restores the session's totals, so `modelUsage` and `total_cost_usd` hold
    every earlier turn's request too (11/7 → 22/14 → 33/21 tokens, seen with 2.1.332)."""
    lines = []
    for line in (RECORDINGS / "text.jsonl").read_text(encoding="utf-8").splitlines():
        message = json.loads(line)
        if message.get("type") == "result":
            message["total_cost_usd"] = round(0.000138 * turns, 6)
            for model in message["modelUsage"].values():
                model.update(inputTokens=11 * turns, outputTokens=7 * turns)
                model["costUSD"] = round(0.000138 * turns, 6)
        lines.append(json.dumps(message))
    return lines


def test_each_resumed_turn_reports_its_own_usage_and_cost(tmp_path: Path) -> None:
    one_request = Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138)
    for turns in (1, 2, 3):
        parser = ClaudeCodeStreamParser(
            workspace=Path(PLACEHOLDERS["workspace"]), state_dir=tmp_path
        )
        events = [event for line in _resumed_result_lines(turns) for event in parser.feed(line)]
        outcome = parser.finish(exit_code=0, stderr_tail="")
        assert of_type(events, UsageReported) == [UsageReported(usage=one_request)], turns
        assert outcome.usage == one_request, turns
    saved = tmp_path / "baton-session-usage"
    assert [path.name for path in saved.iterdir()] == [f"{TEXT_SESSION}.json"]  # no temp file


def test_a_session_this_worker_has_no_totals_for_reports_the_whole_total(tmp_path: Path) -> None:
    parser = ClaudeCodeStreamParser(workspace=Path(PLACEHOLDERS["workspace"]), state_dir=tmp_path)
    for line in _resumed_result_lines(2):
        parser.feed(line)
    assert parser.finish(exit_code=0, stderr_tail="").usage == Usage(
        input_tokens=22, output_tokens=14, cost_usd=0.000276
    )


def test_totals_smaller_than_the_saved_ones_are_a_history_of_their_own(tmp_path: Path) -> None:
    """Claude Code did not restore the session's totals (or the state dir was restored from an
    older copy): the run's totals are all its own."""
    for turns in (3, 1):
        parser = ClaudeCodeStreamParser(
            workspace=Path(PLACEHOLDERS["workspace"]), state_dir=tmp_path
        )
        for line in _resumed_result_lines(turns):
            parser.feed(line)
    assert parser.finish(exit_code=0, stderr_tail="").usage == Usage(
        input_tokens=11, output_tokens=7, cost_usd=0.000138
    )


def test_resumed_runs_of_the_real_binary_report_one_request_each(
    model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.set_turns([{"text": "One."}, {"text": "Two."}, {"text": "Three."}])
    session_id = None
    usages = []
    for number in range(3):
        run = _run(
            _request(tmp_path, model_server, prompt=f"Question {number}.", resume=session_id)
        )
        session_id = run.outcome.session_id
        usages.append(run.outcome.usage)
    one_request = Usage(input_tokens=11, output_tokens=7, cost_usd=0.000138)
    assert usages == [one_request] * 3
